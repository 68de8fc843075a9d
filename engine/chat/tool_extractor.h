// Internal to chat_output.cc: the tags of the chat formats, a JSON value scanner and the
// tool-call extractor of one stream (the reasoning or the content). Included by that file only.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_output.h"

namespace llm::chat {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
inline constexpr std::string_view kMistralArgs = "[ARGS]";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";

inline bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

inline std::string_view LStrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && IsSpace(s[i])) ++i;
  return s.substr(i);
}

// The length of the longest suffix of `s` that is a proper prefix of `tag` (text to hold back:
// the next piece may complete the tag).
inline size_t PartialTagSuffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// One JSON value read a character at a time: where it starts (leading whitespace is skipped)
// and where it ends. Light validation: brackets and strings, not the grammar of numbers.
class ValueScanner {
 public:
  enum Step { kSkipped, kTaken, kTakenLast, kEndedBefore, kInvalid };
  Step Feed(char c) {
    if (!started_) {
      if (IsSpace(c)) return kSkipped;
      started_ = true;
      first_ = c;
      if (c == '"') return in_string_ = true, kTaken;
      if (c == '{' || c == '[') return depth_ = 1, kTaken;
      if (c == '}' || c == ']' || c == ',' || c == ':') return kInvalid;
      return kTaken;  // a number, true, false or null
    }
    if (first_ != '"' && first_ != '{' && first_ != '[') {  // a scalar ends at a delimiter
      if (IsSpace(c) || c == ',' || c == '}' || c == ']') return kEndedBefore;
      if (c == '"' || c == '{' || c == '[' || c == ':') return kInvalid;
      return kTaken;
    }
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (depth_ == 0) return kTakenLast;
      }
      return kTaken;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) return kTakenLast;
    }
    return kTaken;
  }
  char first() const { return first_; }

 private:
  bool started_ = false, in_string_ = false, escape_ = false;
  char first_ = 0;
  int depth_ = 0;
};

// ---- Tool calls in one stream (the reasoning or the content).

class ChatOutputParser::ToolExtractor {
 public:
  ToolExtractor(ToolFormat format, bool forced, int* num_calls, const ChatOutputOptions* options)
      : format_(format), forced_(forced), num_calls_(num_calls), options_(options) {
    if (format == ToolFormat::kLlama3Json) state_ = kLlamaStart;
    if (format == ToolFormat::kMistral && forced) state_ = kMistralStart;
  }

  void Feed(std::string_view in, std::string* text, std::vector<ToolCallDelta>* calls) {
    buf_ += in;
    text_ = text;
    calls_ = calls;
    Run(/*eof=*/false);
  }

  void Finish(std::string* text, std::vector<ToolCallDelta>* calls) {
    text_ = text;
    calls_ = calls;
    Run(/*eof=*/true);
    // An unfinished block before its name is text, unless the output is calls only (forced:
    // max_tokens cut the next call short).
    if (state_ == kCall && !header_ && !forced_) Text(consumed_);
    if (state_ == kCall && header_ && !args_streamed_ && !args_raw_.empty()) {
      Args(args_raw_);
    }
    if (state_ == kMistralName) Text(consumed_ + buf_);
    if (*num_calls_ == 0) *text_ += held_space_;
    held_space_.clear();
    buf_.clear();
  }

 private:
  enum State {
    kText,             // looking for the format's opening marker
    kPlain,            // Llama 3: the output is not a call; all text
    kLlamaStart,       // Llama 3: the output's start (a call is an object at the start)
    kLlamaNext,        // Llama 3: after a call: ";" and another call, or text
    kCall,             // inside a call object (CallScanner)
    kHermesEnd,        // after a call: whitespace and </tool_call>
    kMistralStart,     // after [TOOL_CALLS]: a list, or a name and [ARGS]
    kMistralName,      // [TOOL_CALLS]name... up to [ARGS]
    kMistralValue,     // [TOOL_CALLS]name[ARGS]{...}
    kMistralListNext,  // in the list after a call: "," or "]"
  };

  // Text out, its trailing whitespace held until more text comes (or a call drops it).
  void Text(std::string_view s) {
    if (s.empty()) return;
    size_t end = s.size();
    while (end > 0 && IsSpace(s[end - 1])) --end;
    if (end == 0) {
      held_space_ += s;
      return;
    }
    *text_ += held_space_;
    held_space_.clear();
    *text_ += s.substr(0, end);
    held_space_ = std::string(s.substr(end));
  }

  void Header() {
    header_ = true;
    held_space_.clear();
    index_ = (*num_calls_)++;
    std::string number = std::to_string(index_);
    if (std::ssize(number) < options_->id_digits) {
      number.insert(0, size_t(options_->id_digits) - number.size(), '0');
    }
    calls_->push_back({index_, options_->id_prefix + number, name_, ""});
  }
  void Args(std::string_view s) {
    if (s.empty()) return;
    if (!calls_->empty() && calls_->back().index == index_) {
      calls_->back().arguments += s;
    } else {
      calls_->push_back({index_, "", "", std::string(s)});
    }
  }

  void BeginCall(std::string consumed) {
    state_ = kCall;
    consumed_ = std::move(consumed);
    cs_ = kOpen;
    header_ = false;
    have_name_ = have_args_ = args_streamed_ = false;
    name_.clear();
    args_raw_.clear();
    key_.clear();
  }

  // A call ended (`ok`: complete) or broke off; `rest_from` = where the text resumes in buf_.
  void EndCall(bool ok, State next) {
    // Llama 3's calls have no marker: an object is one only with its arguments.
    if (ok && format_ == ToolFormat::kLlama3Json && !have_args_) ok = false;
    if (ok && !header_ && have_name_) {
      Header();
      Args(have_args_ ? args_raw_ : std::string("{}"));
    } else if (ok && header_ && !args_streamed_) {
      Args(have_args_ ? args_raw_ : std::string("{}"));
    } else if (!ok && !header_) {
      Text(consumed_);
      state_ = format_ == ToolFormat::kLlama3Json ? kPlain : kText;
      return;
    }
    if (!ok) {
      state_ = format_ == ToolFormat::kLlama3Json ? kPlain : kText;
      return;
    }
    state_ = next;
  }

  // Scans one character of a call object. Returns false when `c` is not consumed (the call
  // ended or failed before it); EndCall has then run.
  bool CallChar(char c) {
    switch (cs_) {
      case kOpen:
        if (IsSpace(c)) break;
        if (c != '{') return EndCall(false, kText), false;
        cs_ = kKeyOrEnd;
        break;
      case kKeyOrEnd:
      case kKeyAfterComma:
        if (IsSpace(c)) break;
        if (c == '}' && cs_ == kKeyOrEnd) {
          consumed_ += c;
          EndCall(have_name_, AfterCall());
          return true;
        }
        if (c != '"') return EndCall(false, kText), false;
        key_ = "\"";
        cs_ = kKey;
        break;
      case kKey:
        key_ += c;
        if (c == '"' && key_.size() >= 2 && key_[key_.size() - 2] != '\\') cs_ = kColon;
        break;
      case kColon:
        if (IsSpace(c)) break;
        if (c != ':') return EndCall(false, kText), false;
        value_ = ValueScanner();
        value_raw_.clear();
        if (key_ == "\"name\"") {
          cs_ = kName;
        } else if (key_ == "\"arguments\"" || key_ == "\"parameters\"") {
          if (have_args_) return EndCall(false, kText), false;
          cs_ = kArgs;
          if (have_name_ && !header_) Header();  // Llama 3's waited for its arguments
        } else if (key_ == "\"type\"" || key_ == "\"id\"" || header_) {
          cs_ = kSkipValue;  // (a call's other keys are skipped)
        } else {
          return EndCall(false, kText), false;  // not a call object
        }
        break;
      case kName:
      case kArgs:
      case kSkipValue: {
        const ValueScanner::Step step = value_.Feed(c);
        if (step == ValueScanner::kInvalid) return EndCall(false, kText), false;
        if (step == ValueScanner::kSkipped) break;
        if (step == ValueScanner::kEndedBefore) {
          ValueDone();
          if (state_ != kCall) return false;
          cs_ = kCommaOrEnd;
          return CallChar(c);
        }
        value_raw_ += c;
        if (cs_ == kArgs && header_ && value_.first() != '"') {
          args_streamed_ = true;
          Args(std::string_view(&c, 1));
        }
        if (step == ValueScanner::kTakenLast) {
          consumed_ += c;
          ValueDone();
          if (state_ == kCall) cs_ = kCommaOrEnd;
          return true;
        }
        break;
      }
      case kCommaOrEnd:
        if (IsSpace(c)) break;
        if (c == ',') {
          cs_ = kKeyAfterComma;
          break;
        }
        if (c == '}') {
          consumed_ += c;
          EndCall(have_name_, AfterCall());
          return true;
        }
        return EndCall(false, kText), false;
    }
    consumed_ += c;
    return true;
  }

  void ValueDone() {
    if (cs_ == kName) {
      const auto name = nlohmann::json::parse(value_raw_, nullptr, false);
      if (have_name_ || !name.is_string() || name.get<std::string>().empty()) {
        return EndCall(false, kText);
      }
      name_ = name.get<std::string>();
      if (format_ == ToolFormat::kLlama3Json) {
        // No marker: a call names one of the request's tools, and waits for its arguments.
        const auto& names = options_->tool_names;
        if (!names.empty() && std::find(names.begin(), names.end(), name_) == names.end()) {
          return EndCall(false, kText);
        }
        have_name_ = true;
        return;
      }
      have_name_ = true;
      if (have_args_) return;  // the arguments came first: both go out at the end
      // Header now: the arguments stream as they come.
      Header();
    } else if (cs_ == kArgs) {
      have_args_ = true;
      if (value_.first() == '"') {  // arguments as a JSON string: its text, if that is JSON
        const auto s = nlohmann::json::parse(value_raw_, nullptr, false);
        const bool json_text = s.is_string() && nlohmann::json::accept(s.get<std::string>());
        args_raw_ = json_text ? s.get<std::string>() : value_raw_;
      } else {
        args_raw_ = value_raw_;
      }
      if (header_ && !args_streamed_) {
        Args(args_raw_);
        args_streamed_ = true;
      }
    }
  }

  State AfterCall() const {
    switch (format_) {
      case ToolFormat::kHermes:
        return kHermesEnd;
      case ToolFormat::kLlama3Json:
        return kLlamaNext;
      case ToolFormat::kMistral:
        return in_list_ ? kMistralListNext : kText;
      case ToolFormat::kNone:
        break;
    }
    return kText;
  }

  // Text up to the marker goes out; returns true when the marker was found and consumed.
  bool FindMarker(std::string_view marker, bool eof) {
    const size_t at = buf_.find(marker);
    if (at != std::string::npos) {
      Text(std::string_view(buf_).substr(0, at));
      buf_.erase(0, at + marker.size());
      return true;
    }
    const size_t keep = eof ? 0 : PartialTagSuffix(buf_, marker);
    Text(std::string_view(buf_).substr(0, buf_.size() - keep));
    buf_.erase(0, buf_.size() - keep);
    return false;
  }

  // Drops leading whitespace of buf_; false when nothing else is there yet.
  bool SkipSpace() {
    size_t i = 0;
    while (i < buf_.size() && IsSpace(buf_[i])) ++i;
    buf_.erase(0, i);
    return !buf_.empty();
  }

  void Run(bool eof) {
    for (;;) {
      switch (state_) {
        case kText:
          if (format_ == ToolFormat::kHermes) {
            if (!FindMarker(kHermesOpen, eof)) return;
            BeginCall(std::string(kHermesOpen));
          } else {
            if (!FindMarker(kMistralMarker, eof)) return;
            state_ = kMistralStart;
            consumed_ = std::string(kMistralMarker);
          }
          break;
        case kPlain:
          Text(buf_);
          buf_.clear();
          return;
        case kLlamaStart:
        case kLlamaNext: {
          const size_t spaces = buf_.size() - LStrip(buf_).size();
          std::string_view rest = std::string_view(buf_).substr(spaces);
          if (rest.empty() && !eof) return;
          // What leads to a call (whitespace, <|python_tag|>, ";") is kept in lead_: text
          // again if no call comes.
          size_t lead = 0;
          if (state_ == kLlamaNext && !rest.empty() && rest[0] == ';') {
            lead = spaces + 1;
          } else if (rest.starts_with(kPythonTag)) {
            lead = spaces + kPythonTag.size();
          }
          if (lead > 0) {
            lead_ += buf_.substr(0, lead);
            buf_.erase(0, lead);
            state_ = kLlamaStart;
            break;
          }
          if (!eof && kPythonTag.starts_with(rest)) return;
          if (!rest.empty() && rest[0] == '{') {
            BeginCall(lead_ + buf_.substr(0, spaces));
            buf_.erase(0, spaces);
          } else {
            Text(lead_);
            state_ = kPlain;
          }
          lead_.clear();
          break;
        }
        case kCall: {
          size_t i = 0;
          while (i < buf_.size() && state_ == kCall) {
            if (CallChar(buf_[i])) ++i;
          }
          buf_.erase(0, i);
          if (state_ == kCall) return;  // needs more
          break;
        }
        case kHermesEnd: {
          if (!SkipSpace() && !eof) return;
          std::string_view rest = buf_;
          if (rest.starts_with(kHermesClose)) {
            buf_.erase(0, kHermesClose.size());
            state_ = kText;
          } else if (!eof && kHermesClose.starts_with(rest)) {
            return;
          } else {
            state_ = kText;  // no closing tag: go on with the text
          }
          break;
        }
        case kMistralStart: {
          // Whitespace after the marker is kept in consumed_ (text again if no call comes).
          size_t spaces = 0;
          while (spaces < buf_.size() && IsSpace(buf_[spaces])) ++spaces;
          consumed_ += buf_.substr(0, spaces);
          buf_.erase(0, spaces);
          if (buf_.empty()) {
            if (eof) {
              Text(consumed_);
              state_ = kText;
            }
            return;
          }
          if (buf_[0] == '[') {
            buf_.erase(0, 1);
            in_list_ = true;
            BeginCall(consumed_ + "[");
          } else {
            in_list_ = false;
            state_ = kMistralName;
          }
          break;
        }
        case kMistralName: {
          const size_t at = buf_.find(kMistralArgs);
          if (at == std::string::npos) {
            if (eof) {
              Text(consumed_ + buf_);
              buf_.clear();
              state_ = kText;
            }
            return;
          }
          std::string name(buf_.substr(0, at));
          while (!name.empty() && IsSpace(name.back())) name.pop_back();
          if (name.empty() || name.find_first_of("{}[]\"\n") != std::string::npos) {
            Text(consumed_);
            state_ = kText;
            break;
          }
          buf_.erase(0, at + kMistralArgs.size());
          BeginCall("");
          name_ = std::move(name);
          have_name_ = true;
          Header();
          value_ = ValueScanner();
          value_raw_.clear();
          state_ = kMistralValue;
          break;
        }
        case kMistralValue: {
          size_t i = 0;
          bool done = false;
          for (; i < buf_.size() && !done; ++i) {
            const ValueScanner::Step step = value_.Feed(buf_[i]);
            if (step == ValueScanner::kSkipped) continue;
            if (step == ValueScanner::kInvalid || step == ValueScanner::kEndedBefore) {
              done = true;
              break;
            }
            args_streamed_ = true;
            Args(std::string_view(&buf_[i], 1));
            done = step == ValueScanner::kTakenLast;
          }
          buf_.erase(0, i);
          if (!done && !eof) return;
          state_ = kText;
          break;
        }
        case kMistralListNext:
          if (!SkipSpace()) return;
          if (buf_[0] == ',') {
            buf_.erase(0, 1);
            BeginCall(",");  // (text again if no call follows)
          } else {
            if (buf_[0] == ']') buf_.erase(0, 1);
            state_ = kText;
          }
          break;
      }
    }
  }

  enum CallState {
    kOpen,
    kKeyOrEnd,
    kKeyAfterComma,
    kKey,
    kColon,
    kName,
    kArgs,
    kSkipValue,
    kCommaOrEnd
  };

  ToolFormat format_;
  bool forced_;
  int* num_calls_;
  const ChatOutputOptions* options_;
  State state_ = kText;
  std::string buf_;         // input not yet consumed
  std::string lead_;        // Llama 3: what came before a possible call
  std::string held_space_;  // trailing whitespace of the text so far
  std::string* text_ = nullptr;
  std::vector<ToolCallDelta>* calls_ = nullptr;
  // The call being read.
  CallState cs_ = kOpen;
  std::string consumed_;  // its raw text (it becomes text again if it is not a call)
  std::string key_, value_raw_, name_, args_raw_;
  ValueScanner value_;
  bool header_ = false, have_name_ = false, have_args_ = false, args_streamed_ = false;
  bool in_list_ = false;
  int index_ = 0;
};

}  // namespace llm::chat
