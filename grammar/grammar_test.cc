#include "grammar/grammar.h"

#include <string>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(GrammarTest, GbnfAcceptsExactlyItsSentences) {
  absl::StatusOr<Grammar> g = ParseGbnf(R"(
# A list of small words.
root ::= "[" item ("," item)* "]"
item ::= [a-c]+ | "null"
)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->Accepts("[a]"));
  EXPECT_TRUE(g->Accepts("[abc,null,cc]"));
  EXPECT_FALSE(g->Accepts("[]"));
  EXPECT_FALSE(g->Accepts("[a,]"));
  EXPECT_FALSE(g->Accepts("[d]"));
  EXPECT_FALSE(g->Accepts("[a"));
  EXPECT_TRUE(g->AcceptsPrefix("[a"));
  EXPECT_TRUE(g->AcceptsPrefix("[nu"));
  EXPECT_FALSE(g->AcceptsPrefix("[nx"));
  EXPECT_FALSE(g->AcceptsPrefix("x"));
}

TEST(GrammarTest, GbnfClassesEscapesGroupsAndOptionals) {
  absl::StatusOr<Grammar> g =
      ParseGbnf("root ::= ( [^\\n\"\\\\] | \"\\\\\" [nt] )* \"\\x21\"?\n");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->Accepts(""));
  EXPECT_TRUE(g->Accepts("ab\\n!"));
  EXPECT_FALSE(g->Accepts("a\nb"));
  EXPECT_FALSE(g->Accepts("a\"b"));
  EXPECT_FALSE(g->Accepts("\\x"));
}

TEST(GrammarTest, RecursionIsRecognizedExactly) {
  absl::StatusOr<Grammar> g = ParseGbnf("root ::= \"(\" root \")\" | \"x\"\n");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->Accepts("x"));
  EXPECT_TRUE(g->Accepts("((((x))))"));
  EXPECT_FALSE(g->Accepts("((x)"));
  EXPECT_FALSE(g->Accepts("(x))"));
}

TEST(GrammarTest, RefusesLeftRecursionUndefinedRulesAndBadSyntax) {
  const struct {
    const char* text;
    const char* words;
  } cases[] = {
      {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
      {"root ::= x? root \"a\"\nx ::= \"b\"\n", "left-recursive"},
      {"root ::= item\n", "'item' is used but not defined"},
      {"item ::= \"a\"\n", "no rule named 'root'"},
      {"root ::= \"a\n", "closing '\"'"},
      {"root ::= [z-a]\n", "range from low to high"},
      {"root = \"a\"\n", "'::='"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "one definition of 'root'"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Grammar> g = ParseGbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.words), std::string::npos)
        << g.status() << " for " << c.text;
  }
  EXPECT_FALSE(ParseGbnf(std::string(65 * 1024, ' ')).ok());
}

TEST(GrammarTest, BoundedRepeatAndList) {
  GrammarBuilder b;
  const GrammarSymbol list =
      b.List(b.Byte('a'), b.Byte(','), /*min=*/2, /*max=*/3);
  const uint32_t root = b.NewRule("root");
  b.AddAlt(root, {list});
  absl::StatusOr<Grammar> g = std::move(b).Build(root);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(g->Accepts("a"));
  EXPECT_TRUE(g->Accepts("a,a"));
  EXPECT_TRUE(g->Accepts("a,a,a"));
  EXPECT_FALSE(g->Accepts("a,a,a,a"));
  EXPECT_FALSE(g->Accepts(""));
}

}  // namespace
}  // namespace shardlm
