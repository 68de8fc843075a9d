// Tokenizer encoding throughput, single thread: `bench_tokenizer --tokenizer tokenizer.json
// --text FILE` encodes FILE whole and as 1 KiB documents (split at line ends) and prints MB/s;
// bench/tokenizer.sh runs it beside Hugging Face's library (bench/tokenizer.mjs) on the same
// text. `--write-text FILE --bytes N` writes the benchmark's mixed text (English prose, code,
// Chinese, Korean, Arabic, emoji, digits and whitespace runs), deterministic.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string MixedText(size_t bytes) {
  static const std::vector<std::string> kParts = {
      "The quick brown fox jumps over the lazy dog. It's what they'd've wanted, isn't it? ",
      "In 2026 the model served 12,345 requests per second at a p99 of 87.5 ms.\n",
      "def tokenize(text: str) -> list[int]:\n    return [vocab[t] for t in text.split()]\n\n",
      "    for (int i = 0; i < n; ++i) {\n        sum += a[i] * b[i];\n    }\n",
      "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
      "자연어 처리는 컴퓨터가 인간의 언어를 이해하도록 돕습니다. ",
      "التعلم الآلي هو فرع من فروع الذكاء الاصطناعي. ",
      "Emoji: 😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈 and symbols ©®™ ✨\n",
      "{\"id\": 42, \"values\": [1.5, -2.25, 3e8], \"name\": \"naïve café\"}\n",
      "    \n\t\t  \r\n",
      "Ünïcödé façade, résumé, Straße, ΣΊΣΥΦΟΣ, Привет мир. "};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < bytes) text += kParts[rng() % kParts.size()];
  while (text.size() > bytes) {  // cut at a character boundary
    text.pop_back();
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) {
      text.pop_back();
    }
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  }
  return text;
}

std::vector<std::string> Documents(const std::string& text, size_t size) {
  std::vector<std::string> docs;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', std::min(text.size(), start + size));
    end = end == std::string::npos ? text.size() : end + 1;
    docs.push_back(text.substr(start, end - start));
    start = end;
  }
  return docs;
}

template <typename F>
double BestSeconds(int repeat, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, text_path, write_path;
  size_t bytes = 1 << 20;
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tokenizer")
      tokenizer_path = value;
    else if (flag == "--text")
      text_path = value;
    else if (flag == "--write-text")
      write_path = value;
    else if (flag == "--bytes")
      bytes = std::stoul(value);
    else if (flag == "--repeat")
      repeat = std::stoi(value);
  }
  if (!write_path.empty()) {
    std::ofstream(write_path, std::ios::binary) << MixedText(bytes);
    return 0;
  }
  if (tokenizer_path.empty() || text_path.empty()) {
    std::fprintf(stderr,
                 "usage: bench_tokenizer --tokenizer FILE --text FILE [--repeat N]\n"
                 "       bench_tokenizer --write-text FILE [--bytes N]\n");
    return 2;
  }
  std::ifstream in(text_path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const auto load0 = std::chrono::steady_clock::now();
  const auto tokenizer = llm::Tokenizer::FromFile(tokenizer_path);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load0).count();
  size_t tokens = 0;
  const double whole_s = BestSeconds(repeat, [&] { tokens = tokenizer->Encode(text).size(); });
  const std::vector<std::string> docs = Documents(text, 1024);
  const double docs_s = BestSeconds(repeat, [&] {
    for (const std::string& d : docs) tokenizer->Encode(d);
  });
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf(
      "{\"impl\": \"llm\", \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.3f, "
      "\"whole_mb_s\": %.2f, \"docs_1k_mb_s\": %.2f, \"docs\": %zu}\n",
      text.size(), tokens, load_s, mb / whole_s, mb / docs_s, docs.size());
  return 0;
}
