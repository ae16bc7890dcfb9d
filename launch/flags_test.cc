#include "launch/flags.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

absl::Status ParseArgs(FlagSet& flags, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return flags.Parse(static_cast<int>(argv.size()), argv.data(), 0);
}

TEST(FlagSetTest, ParsesTypedFlagsInBothForms) {
  std::string model;
  int64_t n = 5;
  double t = 0.0;
  bool chat = false;
  FlagSet flags("usage");
  flags.Add("model", &model, "m");
  flags.Add("max-tokens", &n, "n");
  flags.Add("temperature", &t, "t");
  flags.Add("chat", &chat, "c");
  ASSERT_TRUE(ParseArgs(flags, {"--model", "a.gguf", "--max-tokens=7", "pos",
                                "--temperature", "0.5", "--chat"})
                  .ok());
  EXPECT_EQ(model, "a.gguf");
  EXPECT_EQ(n, 7);
  EXPECT_EQ(t, 0.5);
  EXPECT_TRUE(chat);
  EXPECT_EQ(flags.positional(), std::vector<std::string>{"pos"});
  EXPECT_NE(flags.Usage().find("--max-tokens"), std::string::npos);
  EXPECT_NE(flags.Usage().find("(default 5)"), std::string::npos);
}

TEST(FlagSetTest, RepeatableFlagCollectsEveryValue) {
  std::vector<std::string> stops;
  FlagSet flags("usage");
  flags.Add("stop", &stops, "s");
  ASSERT_TRUE(
      ParseArgs(flags, {"--stop", "a b", "--stop=\n", "--stop", ""}).ok());
  EXPECT_EQ(stops, (std::vector<std::string>{"a b", "\n", ""}));
  EXPECT_NE(flags.Usage().find("repeatable"), std::string::npos);
}

TEST(FlagSetTest, RejectsUnknownFlagsAndBadValues) {
  int64_t n = 0;
  double t = 0;
  FlagSet flags("usage");
  flags.Add("n", &n, "n");
  flags.Add("t", &t, "t");
  EXPECT_NE(ParseArgs(flags, {"--bogus", "1"}).message().find("--bogus"),
            absl::string_view::npos);
  EXPECT_NE(ParseArgs(flags, {"--n", "12x"}).message().find("--n"),
            absl::string_view::npos);
  EXPECT_FALSE(ParseArgs(flags, {"--t", "nan"}).ok());
  EXPECT_FALSE(ParseArgs(flags, {"--n"}).ok());
}

}  // namespace
}  // namespace shardlm
