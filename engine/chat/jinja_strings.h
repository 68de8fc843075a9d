// Python's str semantics over UTF-8 for the chat-template interpreter: whitespace as
// str.isspace() sees it (Unicode), strip/split/replace/case mapping by code point (ICU's full
// case mappings, as Python's), and the bound str methods templates call (`s.strip('\n')`).
#pragma once

#include <cstdint>
#include <string>

#include "engine/chat/jinja_eval.h"

namespace llm::jinja {

// str.isspace() for one code point: White_Space plus the separators U+001C..U+001F.
bool IsPySpace(char32_t c);

// str.strip / lstrip / rstrip: `chars` none or undefined strips whitespace, a string strips
// its code points.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right);
std::string Upper(const std::string& s);
std::string Lower(const std::string& s);
// str.capitalize(): the first character in title case, the rest lower case.
std::string Capitalize(const std::string& s);
// Jinja2's title filter: a capital after each run of [-\s({[<], the rest lower case.
std::string TitleFilter(const std::string& s);
// str.title(): a cased character after an uncased one is title case, the others lower case.
std::string TitleMethod(const std::string& s);
// str.replace(old, new, count) (count < 0: all); "" as `from` inserts between characters.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, const RenderLimits& limits);
// str.split(sep, maxsplit): sep none splits on whitespace runs.
List Split(const std::string& s, const Value& sep, int64_t max_split);
// len(s): code points.
int64_t CodePointLength(const std::string& s);

// `s.name` for a str method name (strip, split, startswith, ...), bound to `s`; undefined when
// str has no such method.
Value StringMethod(const std::string& s, const std::string& name, const RenderLimits& limits);

}  // namespace llm::jinja
