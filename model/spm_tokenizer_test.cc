#include "model/spm_tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using testing::ElementsAre;

// <unk> <s> </s>, the 256 byte tokens, then hand-scored pieces.
SpmConfig TinyConfig() {
  SpmConfig c;
  const auto add = [&](std::string piece, float score, SpmTokenType type) {
    c.pieces.push_back(std::move(piece));
    c.scores.push_back(score);
    c.types.push_back(type);
  };
  add("<unk>", 0, SpmTokenType::kUnknown);
  add("<s>", 0, SpmTokenType::kControl);
  add("</s>", 0, SpmTokenType::kControl);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 0, SpmTokenType::kByte);
  }
  // 259: ▁  260: a  261: b  262: ▁a  263: ab  264: ▁ab  265: é
  add("\xe2\x96\x81", -1, SpmTokenType::kNormal);
  add("a", -2, SpmTokenType::kNormal);
  add("b", -3, SpmTokenType::kNormal);
  add("\xe2\x96\x81"
      "a",
      -5, SpmTokenType::kNormal);
  add("ab", -4, SpmTokenType::kNormal);
  add("\xe2\x96\x81"
      "ab",
      -6, SpmTokenType::kNormal);
  add("\xc3\xa9", -7, SpmTokenType::kNormal);
  c.bos_id = 1;
  c.eos_id = 2;
  return c;
}

TEST(SpmTokenizerTest, MergesBestScoreFirstAndFallsBackToBytes) {
  auto tok = SpmTokenizer::Create(TinyConfig());
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "▁ab": "ab" (-4) beats "▁a" (-5), then "▁"+"ab" makes "▁ab".
  EXPECT_THAT((*tok)->Encode("ab"), ElementsAre(264));
  // "▁ba": no "ba" piece and "▁b" is none: ▁ b a.
  EXPECT_THAT((*tok)->Encode("ba"), ElementsAre(259, 261, 260));
  // Spaces are ▁; "c" and "€" are not pieces: their bytes.
  EXPECT_THAT((*tok)->Encode("a c"), ElementsAre(262, 259, 3 + 'c'));
  EXPECT_THAT((*tok)->Encode("\xe2\x82\xac\xc3\xa9"),
              ElementsAre(259, 3 + 0xe2, 3 + 0x82, 3 + 0xac, 265));
  // Control tokens are matched whole; the text after one gets its own
  // dummy prefix (llama.cpp's rule).
  EXPECT_THAT((*tok)->Encode("a</s>b"), ElementsAre(262, 2, 259, 261));
  EXPECT_THAT((*tok)->EncodePrompt("a"), ElementsAre(1, 262));
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("ab c")), " ab c");
  EXPECT_TRUE((*tok)->IsSpecial(2));
  EXPECT_FALSE((*tok)->IsSpecial(264));
  EXPECT_EQ((*tok)->TokenId("</s>"), 2);
}

TEST(SpmTokenizerTest, WithoutDummyPrefix) {
  SpmConfig c = TinyConfig();
  c.add_space_prefix = false;
  auto tok = SpmTokenizer::Create(std::move(c));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab"), ElementsAre(263));
}

TEST(SpmTokenizerTest, RejectsMalformedVocabularies) {
  SpmConfig c = TinyConfig();
  c.scores.pop_back();
  EXPECT_FALSE(SpmTokenizer::Create(c).ok());
  c = TinyConfig();
  c.pieces[3 + 0x41] = "<0xZZ>";
  EXPECT_THAT(SpmTokenizer::Create(c).status().message(),
              testing::HasSubstr("<0xZZ>"));
  c = TinyConfig();
  c.pieces[260] = "";
  EXPECT_FALSE(SpmTokenizer::Create(c).ok());
  c = TinyConfig();
  c.eos_id = 100000;
  EXPECT_FALSE(SpmTokenizer::Create(c).ok());
  EXPECT_FALSE(SpmTokenizer::Create(SpmConfig{}).ok());
}

}  // namespace
}  // namespace shardlm
