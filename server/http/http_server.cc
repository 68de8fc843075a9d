#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include "engine/error.h"
#include "server/http/flight.h"
#include "server/http/web_assets.h"

namespace llm::server {

using nlohmann::json;

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(ErrorBody(error).dump(), "application/json");
}

HttpServer::HttpServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer,
                       ModelInfo model, ServerConfig config, ChatRenderer chat)
    : engine_(engine),
      front_end_(front_end),
      tokenizer_(tokenizer),
      model_(std::move(model)),
      config_(std::move(config)),
      chat_(std::move(chat)),
      http_(std::make_unique<httplib::Server>()) {
  const int threads = config_.num_http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  // Generous socket timeouts: a loaded machine must not turn a slow read into a dropped
  // request (streams are kept alive by their own probes).
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  Routes();
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::Bind() {
  // cpp-httplib listens with a backlog of 5 (a compile-time constant of Debian's build): a
  // burst of clients then overflows the accept queue and some see their connection dropped.
  // Keep the listening socket and widen its backlog once bound (listen() again updates it).
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t sock) {
    listen_fd = sock;
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int port = config_.port == 0
                       ? http_->bind_to_any_port(config_.host)
                       : (http_->bind_to_port(config_.host, config_.port) ? config_.port : -1);
  if (port < 0) {
    throw Error("cannot listen on " + config_.host + ":" + std::to_string(config_.port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  return port;
}

void HttpServer::Serve() { http_->listen_after_bind(); }

void HttpServer::Stop() { http_->stop(); }

void HttpServer::BeginDrain() { draining_ = true; }

bool HttpServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (config_.api_key.empty()) return true;
  if (req.get_header_value("Authorization") == "Bearer " + config_.api_key) return true;
  SendError(res, {401, "Invalid or missing API key (send Authorization: Bearer <key>).",
                  "authentication_error", "", "invalid_api_key"});
  return false;
}

void HttpServer::Routes() {
  auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      if (Authorized(req, res)) handler(req, res);
    };
  };
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    // Unhealthy (a fatal step error, or failing steps in a row): 503 so that the orchestrator
    // restarts the process (a liveness probe) and takes it out of rotation (readiness).
    const bool is_healthy = engine_.IsHealthy();
    res.status = draining_ || !is_healthy ? 503 : 200;
    json body = {{"status", draining_ ? "draining" : is_healthy ? "ok" : "unhealthy"}};
    if (!is_healthy) body["reason"] = engine_.UnhealthyReason();
    res.set_content(body.dump(), "application/json");
  });
  // The chat page: public, so that a browser can load it and then ask for the API key.
  http_->Get("/", ServeWebAsset);
  http_->Get("/static/.*", ServeWebAsset);
  http_->Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
               json model = {{"id", model_.id},
                             {"object", "model"},
                             {"owned_by", "llm"},
                             {"max_model_len", model_.max_model_len}};
               res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                               "application/json");
             }));
  http_->Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
               res.set_content(front_end_.metrics().Render(engine_.Stats()),
                               "text/plain; version=0.0.4");
             }));
  http_->Post("/v1/completions",
              guarded([this](const httplib::Request& req, httplib::Response& res) {
                Generate(req, res, /*is_chat=*/false);
              }));
  http_->Post("/v1/chat/completions",
              guarded([this](const httplib::Request& req, httplib::Response& res) {
                Generate(req, res, /*is_chat=*/true);
              }));
  http_->Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                Tokenize(req, res);
              }));
  http_->Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                Detokenize(req, res);
              }));
  // Known paths with the wrong method: 405, not 404.
  const std::pair<const char*, const char*> known[] = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"},       {"/detokenize", "POST"},
      {"/v1/models", "GET"},       {"/health", "GET"},
      {"/metrics", "GET"},         {"/", "GET"}};
  for (const auto& [path, allowed] : known) {
    // An init-capture: clang 14 (the fuzz build) cannot capture a structured binding.
    auto not_allowed = [allowed = allowed](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", allowed);
      SendError(res, {405, std::string("Method not allowed; use ") + allowed,
                      "invalid_request_error", "", "method_not_allowed"});
    };
    if (std::string(allowed) == "POST") {
      http_->Get(path, not_allowed);
    } else {
      http_->Post(path, not_allowed);
    }
    http_->Put(path, not_allowed);
    http_->Delete(path, not_allowed);
  }
  http_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    front_end_.metrics().HttpResponse(res.status);
    if (res.status == 404 && res.body.empty()) {
      SendError(res, {404, "Unknown route " + req.method + " " + req.path.substr(0, 200),
                      "invalid_request_error", "", "not_found"});
    } else if (res.status == 413) {
      SendError(
          res,
          {413, "Request body larger than " + std::to_string(config_.max_body_bytes) + " bytes",
           "invalid_request_error", "", "payload_too_large"});
    }
  });
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, {500, "internal server error", "internal_error", "", ""});
      });
}

void HttpServer::Tokenize(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_object() && body.contains("messages")) {  // a chat prompt, as vLLM's /tokenize
    if (!chat_) {
      return SendError(res, {400, "This model has no chat template.", "invalid_request_error",
                             "messages", "no_chat_template"});
    }
    std::vector<int> ids;
    try {
      ids = ParseChatBody(req.body, body, chat_, tokenizer_, model_).request.prompt_ids;
    } catch (const ApiError& e) {
      return SendError(res, e);
    } catch (const Error& e) {
      return SendError(res, {400, e.what(), "invalid_request_error", "", "invalid_request"});
    }
    res.set_content(
        json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model_.max_model_len}}
            .dump(),
        "application/json");
    return;
  }
  const json* text = body.is_object() ? (body.contains("prompt") ? &body["prompt"]
                                         : body.contains("text") ? &body["text"]
                                                                 : nullptr)
                                      : nullptr;
  if (text == nullptr || !text->is_string()) {
    return SendError(res, {400, "send {\"prompt\": \"text\"}", "invalid_request_error", "prompt",
                           "invalid_parameter"});
  }
  const bool special = body.value("add_special_tokens", true);
  const std::vector<int> ids = special ? tokenizer_.EncodePrompt(text->get<std::string>())
                                       : tokenizer_.Encode(text->get<std::string>());
  res.set_content(
      json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model_.max_model_len}}.dump(),
      "application/json");
}

void HttpServer::Detokenize(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    return SendError(res, {400, "send {\"tokens\": [ids]}", "invalid_request_error", "tokens",
                           "invalid_parameter"});
  }
  std::vector<int> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model_.vocab_size) {
      return SendError(res,
                       {400, "tokens must be ids in [0, " + std::to_string(model_.vocab_size) + ")",
                        "invalid_request_error", "tokens", "invalid_parameter"});
    }
    ids.push_back(t.get<int>());
  }
  const json::const_iterator skip = body.find("skip_special_tokens");
  if (skip != body.end() && !skip->is_boolean()) {
    return SendError(res, {400, "skip_special_tokens must be true or false",
                           "invalid_request_error", "skip_special_tokens", "invalid_parameter"});
  }
  const bool skip_special = skip == body.end() || skip->get<bool>();
  // As transformers' decode: clean_up_tokenization_spaces (tokenizer_config.json) applies here;
  // generated text is streamed and is not cleaned up (as vLLM streams it).
  res.set_content(
      json{{"prompt", tokenizer_.CleanUpSpaces(tokenizer_.Decode(ids, skip_special))}}.dump(),
      "application/json");
}

}  // namespace llm::server

namespace llm::server {

LoadingResponder::LoadingResponder() : http_(std::make_unique<httplib::Server>()) {
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") {
      res.status = 503;
      res.set_content(json{{"status", "loading"}}.dump(), "application/json");
      return;
    }
    SendError(res, {503, "The model is loading; retry shortly.", "server_error", "", "loading"});
  });
}

LoadingResponder::~LoadingResponder() { Stop(); }

int LoadingResponder::Start(const std::string& host, int port) {
  const int bound =
      port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw Error("cannot listen on " + host + ":" + std::to_string(port));
  thread_ = std::make_unique<std::thread>([this] { http_->listen_after_bind(); });
  // httplib's stop() only acts on a server that is already running: wait for it, or a quick
  // Stop() would race the listen loop and leave the port taken.
  while (!http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void LoadingResponder::Stop() {
  if (!thread_) return;
  http_->stop();
  thread_->join();
  thread_.reset();
}

}  // namespace llm::server
