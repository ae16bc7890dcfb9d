#include "model/spm_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/sentencepiece_model.pb.h"
#include "model/tokenizer_loaders.h"

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

// Literal tokens: the longest written at the leftmost place; of pieces
// written alike, the first id.
TEST(SpmTokenizerTest, LiteralTokensLongestFirstLowestIdOfDuplicates) {
  SpmConfig c = TinyConfig();
  const auto add = [&](std::string piece, SpmTokenType type) {
    c.pieces.push_back(std::move(piece));
    c.scores.push_back(0);
    c.types.push_back(type);
  };
  add("<u", SpmTokenType::kControl);         // 266
  add("<u1>", SpmTokenType::kControl);       // 267
  add("<u12>", SpmTokenType::kUserDefined);  // 268
  add("<u1>", SpmTokenType::kControl);       // 269, a duplicate of 267.
  auto tok = SpmTokenizer::Create(std::move(c));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("<u12><u1>a<u1"),
              ElementsAre(268, 267, 262, 266, 259, 3 + '1'));
  EXPECT_NE((*tok)->Summary().find("7 matched literally"), std::string::npos)
      << (*tok)->Summary();
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

// TinyConfig as a tokenizer.model: BPE with byte fallback, the identity
// normalizer with a dummy prefix and no whitespace folding (as Llama 2's).
sentencepiece::ModelProto TinyModelProto() {
  const SpmConfig c = TinyConfig();
  sentencepiece::ModelProto m;
  for (size_t i = 0; i < c.pieces.size(); ++i) {
    auto* p = m.add_pieces();
    p->set_piece(c.pieces[i]);
    p->set_score(c.scores[i]);
    p->set_type(static_cast<int32_t>(c.types[i]));
  }
  m.mutable_trainer_spec()->set_model_type(2);
  m.mutable_trainer_spec()->set_byte_fallback(true);
  m.mutable_normalizer_spec()->set_name("identity");
  m.mutable_normalizer_spec()->set_remove_extra_whitespaces(false);
  return m;
}

TEST(SpmModelProtoTest, ReadsWhatTheGgufConverterReads) {
  absl::StatusOr<SpmConfig> c =
      SpmConfigFromModelProto(TinyModelProto().SerializeAsString());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pieces, TinyConfig().pieces);
  EXPECT_EQ(c->scores, TinyConfig().scores);
  EXPECT_EQ(c->types, TinyConfig().types);
  EXPECT_EQ(c->bos_id, 1);  // trainer_spec's defaults.
  EXPECT_EQ(c->eos_id, 2);
  EXPECT_TRUE(c->add_space_prefix);
  auto tok = SpmTokenizer::Create(*std::move(c));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab"), ElementsAre(264));
  EXPECT_THAT((*tok)->Encode("a</s>b"), ElementsAre(262, 2, 259, 261));

  sentencepiece::ModelProto m = TinyModelProto();
  m.mutable_normalizer_spec()->set_add_dummy_prefix(false);
  m.mutable_trainer_spec()->set_bos_id(-1);
  c = SpmConfigFromModelProto(m.SerializeAsString());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->add_space_prefix);
  EXPECT_EQ(c->bos_id, -1);
}

TEST(SpmModelProtoTest, RefusesModelsThatTokenizeOtherwiseByName) {
  struct Case {
    std::function<void(sentencepiece::ModelProto&)> change;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {[](auto& m) { m.mutable_trainer_spec()->set_model_type(1); },
            "model_type UNIGRAM is not supported"},
           {[](auto& m) { m.mutable_trainer_spec()->clear_model_type(); },
            "UNIGRAM"},  // The proto's default.
           {[](auto& m) { m.mutable_trainer_spec()->set_model_type(4); },
            "CHAR"},
           {[](auto& m) { m.mutable_trainer_spec()->set_model_type(9); },
            "not a SentencePiece model type"},
           {[](auto& m) { m.mutable_trainer_spec()->set_byte_fallback(false); },
            "byte_fallback"},
           {[](auto& m) {
              m.mutable_trainer_spec()->set_treat_whitespace_as_suffix(true);
            },
            "treat_whitespace_as_suffix"},
           {[](auto& m) {
              m.mutable_normalizer_spec()->set_name("nmt_nfkc");
              m.mutable_normalizer_spec()->set_precompiled_charsmap("\x01");
            },
            "'nmt_nfkc'"},
           {[](auto& m) {
              m.mutable_normalizer_spec()->clear_remove_extra_whitespaces();
            },
            "remove_extra_whitespaces"},  // Default true.
           {[](auto& m) {
              m.mutable_normalizer_spec()->set_escape_whitespaces(false);
            },
            "escape_whitespaces"},
           {[](auto& m) {
              m.mutable_denormalizer_spec()->set_precompiled_charsmap("\x01");
            },
            "denormalizer_spec"},
           {[](auto& m) { m.mutable_pieces(7)->set_type(7); },
            "pieces[7].type = 7"},
           {[](auto& m) { m.mutable_trainer_spec()->set_eos_id(266); },
            "eos_id = 266"},
           {[](auto& m) { m.clear_pieces(); }, "0 pieces"},
       }) {
    SCOPED_TRACE(c.needle);
    sentencepiece::ModelProto m = TinyModelProto();
    c.change(m);
    absl::StatusOr<SpmConfig> config =
        SpmConfigFromModelProto(m.SerializeAsString());
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), testing::HasSubstr(c.needle));
  }
  // Not a ModelProto at all, or cut short.
  EXPECT_THAT(SpmConfigFromModelProto("\xff\xff\xff\xff").status().message(),
              testing::HasSubstr("does not parse"));
  const std::string bytes = TinyModelProto().SerializeAsString();
  EXPECT_FALSE(SpmConfigFromModelProto(bytes.substr(0, bytes.size() - 3)).ok());
}

// A Hugging Face folder with tokenizer.model and no tokenizer.json.
TEST(SpmModelProtoTest, FoldersWithOnlyTokenizerModel) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "spm_model_folder";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.model", std::ios::binary)
      << TinyModelProto().SerializeAsString();
  const auto with_config = [&](const std::string& json) {
    std::ofstream(dir / "tokenizer_config.json") << json;
    return LoadTokenizerDirectory(dir.string());
  };
  {
    auto tok = LoadTokenizerDirectory(dir.string());
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_THAT((*tok)->EncodePrompt("ab"), ElementsAre(1, 264));
    EXPECT_EQ((*tok)->eos_id(), 2);
  }
  {
    // Token names and the chat template from tokenizer_config.json.
    auto tok = with_config(R"({"add_bos_token": false, "eos_token": "<s>",)"
                           R"( "chat_template": "{{ messages }}"})");
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_FALSE((*tok)->add_bos());
    EXPECT_EQ((*tok)->eos_id(), 1);
    EXPECT_EQ((*tok)->chat_template(), "{{ messages }}");
  }
  for (const auto& [json, needle] :
       {std::pair<std::string, std::string>{R"({"legacy": false})",
                                            "legacy = false"},
        {R"({"add_eos_token": true})", "add_eos_token"}}) {
    auto tok = with_config(json);
    ASSERT_FALSE(tok.ok());
    EXPECT_THAT(tok.status().message(), testing::HasSubstr(needle));
    EXPECT_THAT(tok.status().message(),
                testing::HasSubstr("tokenizer_config.json"));
  }
  std::ofstream(dir / "tokenizer.model", std::ios::binary) << "not a model";
  auto tok = LoadTokenizerDirectory(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), testing::HasSubstr("tokenizer.model"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
