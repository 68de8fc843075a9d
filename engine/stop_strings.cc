#include "engine/stop_strings.h"

#include <algorithm>
#include <utility>

namespace llm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::Push(std::string_view delta) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  pending_.append(delta);
  // pending_ held no whole stop string before this delta, so any occurrence ends in the delta;
  // the earliest start wins (ties: the first listed stop).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t pos = pending_.find(s);
    if (pos < first) {
      first = pos;
      matched_stop_ = s;
    }
  }
  if (first != std::string::npos) {
    result.text = pending_.substr(0, first);
    result.stopped = stopped_ = true;
    pending_.clear();
    return result;
  }
  const size_t held = HeldSuffixLength();
  result.text = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return result;
}

// The longest suffix of pending_ that is a proper prefix of some stop string.
size_t StopStringMatcher::HeldSuffixLength() const {
  size_t best = 0;
  const std::string_view text = pending_;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace llm
