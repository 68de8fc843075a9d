#include "engine/chat/jinja_strings.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

namespace llm::jinja {
namespace {

// One code point of UTF-8 text and where it lies; a byte that does not start a valid sequence
// is a code point of its own (U+FFFD, keeping the byte).
struct Char {
  char32_t c;
  size_t begin, end;
};

std::vector<Char> Chars(const std::string& s) {
  std::vector<Char> out;
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    size_t len = lead < 0x80         ? 1
                 : (lead >> 5) == 6  ? 2
                 : (lead >> 4) == 14 ? 3
                 : (lead >> 3) == 30 ? 4
                                     : 0;
    char32_t c = len == 1 ? lead : len == 2 ? lead & 0x1F : len == 3 ? lead & 0x0F : lead & 0x07;
    for (size_t k = 1; k < len; ++k) {
      const auto b = i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
      if ((b & 0xC0) != 0x80) {
        len = 0;
        break;
      }
      c = (c << 6) | (b & 0x3F);
    }
    if (len == 0) {
      out.push_back({0xFFFD, i, i + 1});
      ++i;
      continue;
    }
    out.push_back({c, i, i + len});
    i += len;
  }
  return out;
}

std::string Utf8(char32_t c) {
  std::string out;
  icu::UnicodeString(static_cast<UChar32>(c)).toUTF8String(out);
  return out;
}

// Full case mappings of the root locale, as Python's str.upper() / lower() (ß -> SS, final
// sigma).
std::string MapCase(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) {
    u.toUpper(icu::Locale::getRoot());
  } else {
    u.toLower(icu::Locale::getRoot());
  }
  std::string out;
  u.toUTF8String(out);
  return out;
}

bool IsCased(char32_t c) {
  const auto ch = static_cast<UChar32>(c);
  return u_isULowercase(ch) || u_isUUppercase(ch) || u_charType(ch) == U_TITLECASE_LETTER;
}

// Python's str.find / rfind / startswith ... on code points: a byte offset of `s` as a code
// point index.
int64_t CodePointIndex(const std::string& s, size_t byte_offset) {
  int64_t n = 0;
  for (size_t i = 0; i < byte_offset && i < s.size(); ++i) {
    n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  }
  return n;
}

List Options(const Value& prefix) { return prefix.is_list() ? prefix.list() : List{prefix}; }

}  // namespace

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars.is_string()) {
    for (const Char& ch : Chars(chars.str())) set.push_back(ch.c);
  }
  auto drop = [&](char32_t c) {
    return chars.is_string() ? std::find(set.begin(), set.end(), c) != set.end() : IsPySpace(c);
  };
  const std::vector<Char> cs = Chars(s);
  size_t b = 0, e = cs.size();
  while (left && b < e && drop(cs[b].c)) ++b;
  while (right && e > b && drop(cs[e - 1].c)) --e;
  if (b == e) return "";
  return s.substr(cs[b].begin, cs[e - 1].end - cs[b].begin);
}

std::string Upper(const std::string& s) { return MapCase(s, true); }
std::string Lower(const std::string& s) { return MapCase(s, false); }

std::string Capitalize(const std::string& s) {
  const std::vector<Char> cs = Chars(s);
  if (cs.empty()) return "";
  return Utf8(static_cast<char32_t>(u_totitle(static_cast<UChar32>(cs[0].c)))) +
         Lower(s.substr(cs[0].end));
}

std::string TitleFilter(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const Char& ch : Chars(s)) {
    const std::string piece = s.substr(ch.begin, ch.end - ch.begin);
    const bool sep =
        ch.c == '-' || ch.c == '(' || ch.c == '{' || ch.c == '[' || ch.c == '<' || IsPySpace(ch.c);
    out += sep ? piece : word_start ? Upper(piece) : Lower(piece);
    word_start = sep;
  }
  return out;
}

std::string TitleMethod(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const Char& ch : Chars(s)) {
    const std::string piece = s.substr(ch.begin, ch.end - ch.begin);
    out += prev_cased ? Lower(piece)
                      : Utf8(static_cast<char32_t>(u_totitle(static_cast<UChar32>(ch.c))));
    prev_cased = IsCased(ch.c);
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, const RenderLimits& limits) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` before every character and at the end
    const std::vector<Char> cs = Chars(s);
    for (size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cs.size()) out.append(s, cs[k].begin, cs[k].end - cs[k].begin);
      CheckSize(out.size(), limits);
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    CheckSize(out.size(), limits);
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List Split(const std::string& s, const Value& sep, int64_t max_split) {
  List out;
  if (!sep.is_string()) {
    const std::vector<Char> cs = Chars(s);
    size_t i = 0;
    while (true) {
      while (i < cs.size() && IsPySpace(cs[i].c)) ++i;
      if (i >= cs.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        out.push_back(Value::String(s.substr(cs[i].begin)));  // the rest keeps its tail
        break;
      }
      size_t e = i;
      while (e < cs.size() && !IsPySpace(cs[e].c)) ++e;
      out.push_back(Value::String(s.substr(cs[i].begin, cs[e - 1].end - cs[i].begin)));
      i = e;
    }
    return out;
  }
  if (sep.str().empty()) throw RuntimeError("empty separator");
  size_t pos = 0;
  while (max_split < 0 || static_cast<int64_t>(out.size()) < max_split) {
    const size_t hit = s.find(sep.str(), pos);
    if (hit == std::string::npos) break;
    out.push_back(Value::String(s.substr(pos, hit - pos)));
    pos = hit + sep.str().size();
  }
  out.push_back(Value::String(s.substr(pos)));
  return out;
}

int64_t CodePointLength(const std::string& s) { return static_cast<int64_t>(Chars(s).size()); }

Value StringMethod(const std::string& s, const std::string& name, const RenderLimits& limits) {
  using Method = std::function<Value(const std::string&, CallArgs&, const RenderLimits&)>;
  static const std::map<std::string, Method> kMethods = {
      {"strip",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         return Value::String(Strip(s, a.Get(0, "chars"), true, true));
       }},
      {"lstrip",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         return Value::String(Strip(s, a.Get(0, "chars"), true, false));
       }},
      {"rstrip",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         return Value::String(Strip(s, a.Get(0, "chars"), false, true));
       }},
      {"upper", [](const std::string& s, CallArgs&,
                   const RenderLimits&) { return Value::String(Upper(s)); }},
      {"lower", [](const std::string& s, CallArgs&,
                   const RenderLimits&) { return Value::String(Lower(s)); }},
      {"title", [](const std::string& s, CallArgs&,
                   const RenderLimits&) { return Value::String(TitleMethod(s)); }},
      {"capitalize", [](const std::string& s, CallArgs&,
                        const RenderLimits&) { return Value::String(Capitalize(s)); }},
      {"startswith",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         for (const Value& o : Options(a.Get(0, "prefix"))) {
           if (!o.is_string()) throw RuntimeError("startswith arg must be str or a tuple of str");
           if (s.compare(0, o.str().size(), o.str()) == 0) return Value::Bool(true);
         }
         return Value::Bool(false);
       }},
      {"endswith",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         for (const Value& o : Options(a.Get(0, "suffix"))) {
           if (!o.is_string()) throw RuntimeError("endswith arg must be str or a tuple of str");
           if (o.str().size() <= s.size() &&
               s.compare(s.size() - o.str().size(), o.str().size(), o.str()) == 0) {
             return Value::Bool(true);
           }
         }
         return Value::Bool(false);
       }},
      {"split",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         return Value::MakeList(
             Split(s, a.Get(0, "sep"), a.Get(1, "maxsplit", Value::Int(-1)).as_int()));
       }},
      {"find",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         const size_t hit = s.find(a.Get(0, "sub").ToString());
         return Value::Int(hit == std::string::npos ? -1 : CodePointIndex(s, hit));
       }},
      {"rfind",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         const size_t hit = s.rfind(a.Get(0, "sub").ToString());
         return Value::Int(hit == std::string::npos ? -1 : CodePointIndex(s, hit));
       }},
      {"count",
       [](const std::string& s, CallArgs& a, const RenderLimits&) {
         const std::string sub = a.Get(0, "sub").ToString();
         if (sub.empty()) return Value::Int(CodePointLength(s) + 1);
         int64_t n = 0;
         for (size_t pos = 0; (pos = s.find(sub, pos)) != std::string::npos; pos += sub.size()) {
           ++n;
         }
         return Value::Int(n);
       }},
      {"join",
       [](const std::string& s, CallArgs& a, const RenderLimits& limits) {
         std::string out;
         const List items = a.Get(0, "iterable").Iterate();
         for (size_t k = 0; k < items.size(); ++k) {
           if (!items[k].is_string()) {
             throw RuntimeError("sequence item " + std::to_string(k) + ": expected str instance, " +
                                items[k].TypeName() + " found");
           }
           out += (k ? s : "") + items[k].str();
           CheckSize(out.size(), limits);
         }
         return Value::String(out);
       }},
      {"replace",
       [](const std::string& s, CallArgs& a, const RenderLimits& limits) {
         return Value::String(Replace(s, a.Get(0, "old").ToString(), a.Get(1, "new").ToString(),
                                      a.Get(2, "count", Value::Int(-1)).as_int(), limits));
       }},
  };
  auto it = kMethods.find(name);
  if (it == kMethods.end()) return Value();
  const Method& method = it->second;
  return Value::MakeFunction([s, &method, &limits](CallArgs& a) { return method(s, a, limits); });
}

}  // namespace llm::jinja
