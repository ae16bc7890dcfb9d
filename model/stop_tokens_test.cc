#include "model/stop_tokens.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

// A vocabulary of named special tokens only.
class FakeTokenizer : public Tokenizer {
 public:
  FakeTokenizer(std::map<std::string, int32_t> specials, int32_t eos)
      : specials_(std::move(specials)), eos_(eos) {}
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string_view TokenBytes(int32_t) const override { return {}; }
  int32_t vocab_size() const override { return 1000; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return eos_; }
  bool IsSpecial(int32_t) const override { return true; }
  std::optional<int32_t> TokenId(std::string_view token) const override {
    auto it = specials_.find(std::string(token));
    if (it == specials_.end()) return std::nullopt;
    return it->second;
  }
  std::string Summary() const override { return "fake"; }

 private:
  std::map<std::string, int32_t> specials_;
  int32_t eos_;
};

ModelConfig WithEos(int32_t eos) {
  ModelConfig c;
  c.vocab_size = 900;  // Ids 900..999 are the tokenizer's only.
  c.eos_id = eos;
  return c;
}

TEST(StopTokensTest, EosAndEveryChatFormatsEndOfTurn) {
  // Llama 3 Instruct: EOS <|end_of_text|>, turns end with <|eot_id|>.
  const FakeTokenizer llama3(
      {{"<|end_of_text|>", 1}, {"<|eot_id|>", 9}, {"<|eom_id|>", 8}}, 1);
  EXPECT_THAT(DefaultStopTokenIds(WithEos(1), llama3),
              testing::ElementsAre(1, 9, 8));
  // ChatML (SmolLM2, Qwen2): the config's EOS differs from the
  // tokenizer's; both stop, and <|im_end|> once even when it is the EOS.
  const FakeTokenizer chatml({{"<|im_end|>", 2}, {"<|endoftext|>", 0}}, 0);
  EXPECT_THAT(DefaultStopTokenIds(WithEos(2), chatml),
              testing::ElementsAre(2, 0));
  // gpt-oss (harmony): EOS <|return|>; a tool call ends with <|call|>; the
  // <|end|> of the analysis channel's message is not a stop.
  const FakeTokenizer harmony(
      {{"<|return|>", 5}, {"<|call|>", 7}, {"<|end|>", 6}}, 5);
  EXPECT_THAT(DefaultStopTokenIds(WithEos(5), harmony),
              testing::ElementsAre(5, 7));
}

TEST(StopTokensTest, LeavesOutIdsOutsideTheModelsVocabulary) {
  const FakeTokenizer tok({{"<|im_end|>", 950}}, 960);
  EXPECT_THAT(DefaultStopTokenIds(WithEos(-1), tok), testing::IsEmpty());
}

}  // namespace
}  // namespace shardlm
