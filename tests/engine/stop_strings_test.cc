#include "engine/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace llm {
namespace {

// Pushes the deltas in order; returns everything emitted (Flush included when not stopped).
struct Fed {
  std::string emitted;
  bool stopped = false;
};

Fed Feed(StopStringMatcher& m, const std::vector<std::string>& deltas) {
  Fed run;
  for (const std::string& d : deltas) {
    const StopStringMatcher::Result r = m.Push(d);
    run.emitted += r.text;
    if (r.stopped) {
      run.stopped = true;
      break;
    }
  }
  if (!run.stopped) run.emitted += m.Flush();
  return run;
}

// Splits UTF-8 text into whole characters.
std::vector<std::string> Chars(const std::string& text) {
  std::vector<std::string> out;
  for (char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) == 0x80) {
      out.back() += c;
    } else {
      out.emplace_back(1, c);
    }
  }
  return out;
}

TEST(StopStrings, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({});
  const StopStringMatcher::Result r = m.Push("hello");
  EXPECT_EQ(r.text, "hello");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStrings, SingleStopInOneDelta) {
  StopStringMatcher m({"END"});
  const StopStringMatcher::Result r = m.Push("abcENDxyz");
  EXPECT_EQ(r.text, "abc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(m.matched_stop(), "END");
}

TEST(StopStrings, EarliestOfMultipleStopsWins) {
  StopStringMatcher m({"zz", "\n\n", "yy"});
  const Fed run = Feed(m, {"one", " two\n", "\nthree zz"});
  EXPECT_EQ(run.emitted, "one two");
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(m.matched_stop(), "\n\n");
}

TEST(StopStrings, StopSplitCharByChar) {
  StopStringMatcher m({"</s>"});
  std::vector<std::string> emitted_per_push;
  bool stopped = false;
  for (const std::string& c : Chars("Hi</s>after")) {
    const StopStringMatcher::Result r = m.Push(c);
    emitted_per_push.push_back(r.text);
    if (r.stopped) {
      stopped = true;
      break;
    }
  }
  EXPECT_TRUE(stopped);
  // "H", "i", then "<", "/", "s" held, ">" completes the stop.
  EXPECT_EQ(emitted_per_push, (std::vector<std::string>{"H", "i", "", "", "", ""}));
}

TEST(StopStrings, PartialMatchThatFailsIsReleased) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("go ST").text, "go ");
  EXPECT_EQ(m.Push("O").text, "");
  const StopStringMatcher::Result r = m.Push("RM");
  EXPECT_EQ(r.text, "STORM");
  EXPECT_FALSE(r.stopped);
  // A failed partial match can hide the start of a real one: "SSTOP".
  StopStringMatcher n({"STOP"});
  EXPECT_EQ(Feed(n, Chars("xSSTOPy")).emitted, "xS");
}

TEST(StopStrings, OverlappingStops) {
  StopStringMatcher m({"abc", "ab"});
  const Fed run = Feed(m, Chars("xxabcyy"));
  EXPECT_EQ(run.emitted, "xx");
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(m.matched_stop(), "ab");  // "ab" completes first
  // A prefix of the longer stop stays held while the shorter one cannot match.
  StopStringMatcher n({"abcd", "bx"});
  EXPECT_EQ(n.Push("zabc").text, "z");
  EXPECT_EQ(n.Push("e").text, "abce");
}

TEST(StopStrings, StopAtTheVeryStart) {
  StopStringMatcher m({"###"});
  const Fed run = Feed(m, {"#", "##", "rest"});
  EXPECT_EQ(run.emitted, "");
  EXPECT_TRUE(run.stopped);
}

TEST(StopStrings, Utf8Stops) {
  StopStringMatcher m({"。", "🛑"});
  const Fed run = Feed(m, Chars("日本語です。続き"));
  EXPECT_EQ(run.emitted, "日本語です");
  EXPECT_TRUE(run.stopped);

  // A held prefix is whole characters: "é" shares its lead byte with "è" but is released.
  StopStringMatcher e({"èx"});
  EXPECT_EQ(e.Push("café").text, "café");
  EXPECT_EQ(e.Push("è").text, "");
  EXPECT_EQ(e.Push("y").text, "èy");

  StopStringMatcher emoji({"a🛑"});
  const Fed r2 = Feed(emoji, {"wait", " a", "🛑", "!"});
  EXPECT_EQ(r2.emitted, "wait ");
  EXPECT_TRUE(r2.stopped);
}

TEST(StopStrings, FlushReleasesHeldText) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("the end ST").text, "the end ");
  EXPECT_EQ(m.Flush(), "ST");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStrings, NothingAfterAStop) {
  StopStringMatcher m({"x"});
  EXPECT_EQ(m.Push("abxcd").text, "ab");
  EXPECT_TRUE(m.stopped());
  const StopStringMatcher::Result r = m.Push("more");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStrings, EmptyStopStringsAreIgnored) {
  StopStringMatcher m({"", "z"});
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_FALSE(m.stopped());
}

}  // namespace
}  // namespace llm
