#include "server/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace tierlm::server {
namespace {

// Feeds pieces and returns everything emitted (pushes and, without a match, the flush).
std::string run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  out += m.flush();
  return out;
}

// Oracle: reveal the text one byte at a time and cut at the first stop string to complete (the longer one when two
// complete on the same byte).
std::string cut(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t start = std::string::npos;
    for (const auto& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) start = std::min(start, end - s.size());
    if (start != std::string::npos) return text.substr(0, start);
  }
  return text;
}

TEST(StopMatcher, MatchInsideOnePiece) {
  StopMatcher m({"END"});
  EXPECT_EQ(run(m, {"hello END world"}), "hello ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, MatchAcrossPiecesIsNeverEmitted) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("a\n"), "a");  // "\n" could start the stop string: held
  EXPECT_EQ(m.push("\nb"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, HeldTextIsReleasedWhenItDoesNotMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ab ST"), "ab ");
  EXPECT_EQ(m.push("ORE"), "STORE");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("xS"), "x");
  EXPECT_EQ(m.flush(), "S");
}

TEST(StopMatcher, FirstStopToCompleteWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(run(m, {"hel", "lo", " wor", "ld"}), "hel");
  // "b" completes before "abc" would: the result is the same however the text is split.
  StopMatcher one({"abc", "b"});
  EXPECT_EQ(run(one, {"xabc"}), "xa");
  StopMatcher two({"abc", "b"});
  EXPECT_EQ(run(two, {"x", "a", "b", "c"}), "xa");
}

TEST(StopMatcher, NoStops) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, Utf8StopSplitAcrossPieces) {
  StopMatcher m({"é!"});
  EXPECT_EQ(run(m, {"caf", "é", "!", "x"}), "caf");
}

// Random texts split at random points must give exactly the oracle's cut, whatever the split.
TEST(StopMatcher, RandomSplitsMatchTheOracle) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab\n ";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int len = int(rng() % 30);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int n = 1 + int(rng() % 3);
    for (int s = 0; s < n; ++s) {
      std::string stop;
      const int sl = 1 + int(rng() % 4);
      for (int i = 0; i < sl; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t step = 1 + rng() % 4;
      pieces.push_back(text.substr(i, step));
      i += step;
    }
    StopMatcher m(stops);
    ASSERT_EQ(run(m, pieces), cut(text, stops)) << "text '" << text << "'";
  }
}

// matched() names the stop string that ended the text (Anthropic's stop_sequence): the first to complete wins.
TEST(StopMatcher, MatchedNamesTheWinningStop) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.matched(), "");
  EXPECT_EQ(m.push("hel"), "he");
  EXPECT_EQ(m.push("lo world"), "l");  // "he" + "l" + "lo w" matched
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "lo w");
}

}  // namespace
}  // namespace tierlm::server
