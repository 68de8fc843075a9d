// The HTTP front end's test fixture: stories260K (and a slower random model) on a CPU engine,
// the server in-process on a loopback port, a real HTTP client. Shared by http_server_test
// (routes, errors, lifecycle) and http_load_test (thousands of streams, limits, deadlines).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "engine/loader/make_model.h"
#include "engine/testing/fault_injection.h"
#include "server/http/http_server.h"
#include "tests/test_util.h"

namespace llm::server::testing_http {

using nlohmann::json;

inline std::string ModelDir() { return test::StoriesDir(); }

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
    // A random model slow enough (~1 ms/token) that clients can leave mid-generation.
    slow_dir_ = new test::TempDir();
    test::WriteFile(slow_dir_->path() / "in.json",
                    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 512,
                        "intermediate_size": 1408, "num_hidden_layers": 8,
                        "num_attention_heads": 8, "vocab_size": 512,
                        "max_position_embeddings": 4096, "tie_word_embeddings": true})");
    MakeRandomModel({(slow_dir_->path() / "in.json").string(), slow_dir_->path().string(),
                     ModelDir() + "/tokenizer.model", 1, DType::kBF16, ""});
    slow_model_ = CpuModel::Load(slow_dir_->path().string()).release();
  }
  static void TearDownTestSuite() {
    delete slow_model_;
    delete slow_dir_;
  }
  void Start(ServerConfig config = {}, EngineConfig engine_config = {.num_kv_blocks = 256},
             bool slow = false, ChatRenderer chat = nullptr) {
    const CpuModel& model = slow ? *slow_model_ : *model_;
    engine_ = std::make_unique<Engine>(model, *tokenizer_, engine_config);
    Serve(model, config, chat);
  }
  // The same over an executor whose steps fail as `plan` says (engine/testing/fault_injection.h).
  void StartFaulty(FaultPlan plan, ServerConfig config = {}, bool slow = false) {
    const CpuModel& model = slow ? *slow_model_ : *model_;
    auto cpu = std::make_unique<CpuExecutor>(model, 256, 16);
    engine_ = std::make_unique<Engine>(
        std::make_unique<FaultInjectingExecutor>(std::move(cpu), std::move(plan)), *tokenizer_,
        EngineConfig{});
    Serve(model, config, nullptr);
  }
  void Serve(const CpuModel& model, ServerConfig config, ChatRenderer chat) {
    config.port = 0;
    ModelInfo info{"stories260K", model.config().max_position_embeddings,
                   model.config().vocab_size};
    front_end_ = std::make_unique<FrontEnd>(*engine_, info.id, limits_);
    server_ = std::make_unique<HttpServer>(*engine_, *front_end_, *tokenizer_, info, config, chat);
    port_ = server_->Bind();
    engine_->Start();
    thread_ = std::thread([this] { server_->Serve(); });
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (thread_.joinable()) thread_.join();
    if (engine_) engine_->Stop();
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // Waits until every KV block is free again (the engine frees them at its next step).
  bool AllBlocksFreeWithin(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      const EngineStats s = engine_->Stats();
      if (s.num_free_kv_blocks == s.num_kv_blocks && s.num_running + s.num_waiting == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static json Body(const httplib::Result& r) { return json::parse(r->body); }

  static inline const CpuModel* model_ = nullptr;
  static inline CpuModel* slow_model_ = nullptr;
  static inline const Tokenizer* tokenizer_ = nullptr;
  static inline test::TempDir* slow_dir_ = nullptr;
  AdmissionLimits limits_;  // the server's admission, set before Start()
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FrontEnd> front_end_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

// Concatenated `text` of an SSE completion stream, and whether it ended with [DONE].
inline std::pair<std::string, bool> ReadStream(const std::string& body, json* usage = nullptr) {
  std::string text;
  bool done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(data);
    if (chunk.contains("usage") && usage) *usage = chunk["usage"];
    for (const json& c : chunk["choices"]) text += c.value("text", "");
  }
  return {text, done};
}

// A TCP connection to 127.0.0.1:port (a blocking socket), or -1.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace llm::server::testing_http
