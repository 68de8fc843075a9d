#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/error.h"
#include "engine/loader/make_model.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm::test {

std::filesystem::path SharedDir() { return LLM_SHARED_DIR; }
std::filesystem::path SourceDir() { return LLM_SOURCE_DIR; }
std::filesystem::path BuildDir() { return LLM_BUILD_DIR; }
std::filesystem::path OracleDir() { return LLM_ORACLE_DIR; }

bool IsSmallScale() {
  const char* scale = std::getenv("LLM_TEST_SCALE");
  return scale != nullptr && std::string_view(scale) == "small";
}

int Scaled(int full, int small) { return IsSmallScale() ? small : full; }

int SlowFactor() { return IsSmallScale() ? 10 : 1; }

int ThreadsOfThisProcess() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

std::string StoriesDir() { return (SharedDir() / "models" / "stories260K").string(); }

const CpuModel& StoriesModel() {
  static const std::unique_ptr<CpuModel> model = CpuModel::Load(StoriesDir());
  return *model;
}

const Tokenizer& StoriesTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(StoriesDir());
  return *tokenizer;
}

std::string TestModelDir(const std::string& name) {
  if (name == "stories260K") return StoriesDir();
  static TempDir dir;
  const std::filesystem::path out = dir.path() / name;
  if (!std::filesystem::exists(out / "model.safetensors")) {
    MakeModelOptions o;
    o.config_path = (SourceDir() / "tests" / "data" / "tiny_models" / (name + ".json")).string();
    o.out_dir = out.string();
    o.tokenizer_path = StoriesDir() + "/tokenizer.model";
    o.seed = 7;
    o.dtype = DType::kF32;
    MakeRandomModel(o);
  }
  return out.string();
}

TempDir::TempDir() {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = std::filesystem::temp_directory_path() /
                     ("llm-test-" + std::to_string(rd()) + std::to_string(attempt));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void ExpectError(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-llm::Error: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

std::vector<Completion> DrainCompletions(
    const std::vector<std::shared_ptr<OutputChannel>>& channels) {
  std::vector<Completion> out;
  for (const auto& channel : channels) {
    std::vector<Completion> by_index;
    RequestOutput o;
    while (channel->TryPop(&o)) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (size_t(o.index) >= by_index.size()) by_index.resize(size_t(o.index) + 1);
      Completion& c = by_index[size_t(o.index)];
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    }
    out.insert(out.end(), by_index.begin(), by_index.end());
  }
  return out;
}

GreedyAgreement CompareGreedy(const std::vector<Completion>& ref,
                              const std::vector<Completion>& got, int expected_tokens,
                              double near_tie) {
  GreedyAgreement a;
  EXPECT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i) {
    const std::vector<int>& r = ref[i].tokens;
    const std::vector<int>& g = got[i].tokens;
    EXPECT_EQ(int(r.size()), expected_tokens) << "completion " << i;
    EXPECT_EQ(g.size(), r.size()) << "completion " << i;
    if (r.size() != g.size() || ref[i].logprobs.size() != r.size() ||
        got[i].logprobs.size() != g.size()) {
      continue;
    }
    size_t t = 0;
    for (; t < r.size() && r[t] == g[t]; ++t) {
      a.max_logprob_diff =
          std::max(a.max_logprob_diff,
                   double(std::abs(ref[i].logprobs[t].logprob - got[i].logprobs[t].logprob)));
    }
    a.agree += int(t);
    a.total += int(r.size());
    if (t == r.size()) continue;
    const std::vector<TokenLogprob>& top = ref[i].logprobs[t].top;
    EXPECT_GE(top.size(), 2u) << "completion " << i;
    if (top.size() < 2) continue;
    EXPECT_LT(top[0].logprob - top[1].logprob, near_tie)
        << "completion " << i << " diverges at token " << t << " (" << r[t] << " vs " << g[t]
        << "), which is not a near-tie";
  }
  return a;
}

std::vector<int> RandomPrompt(int n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int> ids{1};
  while (std::ssize(ids) < n) ids.push_back(std::uniform_int_distribution<int>(3, vocab - 1)(rng));
  return ids;
}

std::vector<int> RunnerGreedy(const CpuModel& model, const std::vector<int>& prompt, int n) {
  SequenceRunner run(model, std::ssize(prompt) + n + 1);
  std::vector<float> logits = run.Feed(prompt);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = run.Feed(std::span<const int>(&out.back(), 1));
  }
  return out;
}

std::vector<int> AwaitTokens(const std::shared_ptr<OutputChannel>& channel) {
  std::vector<int> tokens;
  RequestOutput out;
  while (channel->Pop(&out, std::chrono::seconds(300))) {
    EXPECT_TRUE(out.error.empty()) << out.error;
    tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
    if (out.is_last) break;
  }
  return tokens;
}

Request GreedyRequest(std::vector<int> prompt, int max_tokens, int top_logprobs) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = top_logprobs;
  return r;
}

}  // namespace llm::test
