// The filter against a reference: whatever way the text is cut into
// pieces, the emitted text is the reference text up to the first stop
// string (all of it without one), and never more than that at any point.
#include "engine/stop_strings.h"

#include <random>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

// The reference: generation ends after the first piece with which the text
// contains a stop string; it is cut before the earliest one in it (which,
// of those found there, the first given).
struct Stopped {
  std::string text;
  bool stopped = false;
  std::string matched;
};
Stopped Reference(const std::vector<std::string>& pieces,
                  const std::vector<std::string>& stops) {
  std::string text;
  for (const std::string& p : pieces) {
    text += p;
    size_t first = std::string::npos;
    std::string matched;
    for (const auto& s : stops) {
      if (text.find(s) < first) {
        first = text.find(s);
        matched = s;
      }
    }
    if (first != std::string::npos) {
      return {text.substr(0, first), true, matched};
    }
  }
  return {text, false, ""};
}

// Returns whether the reference stopped early (a stop string fired).
bool ExpectFiltered(const std::string& text,
                    const std::vector<std::string>& stops, std::mt19937& rng) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min<size_t>(text.size() - i, rng() % 4);
    pieces.push_back(text.substr(i, n));
    i += n;
  }
  const auto [want, stops_early, matched] = Reference(pieces, stops);
  StopStringFilter f(stops);
  std::string got;
  for (const std::string& p : pieces) {
    if (f.stopped()) break;
    got += f.Push(p);
    // Never ahead of the reference: no part of a stop string leaks.
    EXPECT_EQ(got, want.substr(0, got.size())) << text;
    if (got != want.substr(0, got.size())) return stops_early;
  }
  if (!f.stopped()) got += f.Finish();
  EXPECT_EQ(got, want) << text;
  EXPECT_EQ(f.stopped(), stops_early) << text;
  EXPECT_EQ(f.matched(), matched) << text;
  if (f.stopped()) {
    EXPECT_EQ(f.Push("more"), "");  // Nothing after a stop.
  }
  return stops_early;
}

TEST(StopStringFilterTest, CutsBeforeTheFirstStopStringInAnyPieces) {
  std::mt19937 rng(5);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"\n\n"}, {"abc", "b"}, {"aab"}, {"xyz", "cab", "ca"}, {"é!"}};
  // Whole characters (é is two bytes), cut into pieces at any byte.
  const std::vector<std::string> alphabet = {"a", "b", "c", "\n",
                                             " ", "é", "!"};
  for (const auto& stops : stop_sets) {
    int fired = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string text;
      const int n = static_cast<int>(rng() % 24);
      for (int k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
      fired += ExpectFiltered(text, stops, rng) ? 1 : 0;
    }
    // Every stop set is exercised, not only texts that never stop.
    EXPECT_GE(fired, 5) << "stop set starting " << stops[0];
  }
}

TEST(StopStringFilterTest, HeldBackTextIsReleasedWhenItCannotStop) {
  StopStringFilter f({"Hello world"});
  EXPECT_EQ(f.Push("Say Hello"), "Say ");  // "Hello" may begin the stop.
  EXPECT_EQ(f.Push(" wor"), "");
  EXPECT_EQ(f.Push("m"), "Hello worm");  // It did not.
  EXPECT_EQ(f.matched(), "");
  EXPECT_EQ(f.Push(" Hello world again"), " ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.matched(), "Hello world");
  EXPECT_EQ(f.Finish(), "");
}

TEST(StopStringFilterTest, FinishReturnsAnUnresolvedTail) {
  StopStringFilter f({"END"});
  EXPECT_EQ(f.Push("the EN"), "the ");
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.Finish(), "EN");
}

}  // namespace
}  // namespace shardlm
