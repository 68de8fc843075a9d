// Stop strings over streamed text: text is released only once it can no longer be part of a
// stop string, so a stop string split across many deltas is never half emitted.
//
// Push appends a delta. If a stop string now occurs, the text before its first occurrence is
// returned with stopped = true: the stop string and anything after it are never emitted, and
// later Pushes return nothing. Otherwise Push returns the text that can no longer start a
// match and holds back the longest suffix that is a proper prefix of some stop string. Flush
// releases what is held back when generation ends without a stop.
//
// UTF-8: a held-back suffix equals the start of a stop string, which starts on a character
// boundary, so the split between emitted and held text is always on a character boundary
// (given whole-character deltas and valid UTF-8 stop strings).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace llm {

class StopStringMatcher {
 public:
  struct Result {
    std::string text;  // newly releasable text (may be empty)
    bool stopped = false;
  };

  // Empty stop strings are ignored (SamplingParams::Validate rejects them).
  explicit StopStringMatcher(std::vector<std::string> stops);

  Result Push(std::string_view delta);
  // The held-back text (end of generation without a stop); empty after a stop.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched (vLLM's stop_reason); empty until stopped.
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  size_t HeldSuffixLength() const;

  std::vector<std::string> stops_;
  std::string pending_;  // received, not yet emitted; never contains a whole stop string
  bool stopped_ = false;
  std::string matched_stop_;
};

}  // namespace llm
