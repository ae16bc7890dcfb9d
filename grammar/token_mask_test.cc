#include "grammar/token_mask.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar/json_schema.h"
#include "gtest/gtest.h"
#include "model/smollm2_test_model.h"
#include "model/tokenizer.h"

namespace shardlm {
namespace {

// A vocabulary given as strings; ids >= `specials_from` are special.
class FakeTokenizer : public Tokenizer {
 public:
  FakeTokenizer(std::vector<std::string> tokens, int32_t specials_from)
      : tokens_(std::move(tokens)), specials_from_(specials_from) {}
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string_view TokenBytes(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? std::string_view(tokens_[id]) : "";
  }
  int32_t vocab_size() const override {
    return static_cast<int32_t>(tokens_.size());
  }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return vocab_size() - 1; }
  bool IsSpecial(int32_t id) const override { return id >= specials_from_; }
  std::optional<int32_t> TokenId(std::string_view) const override {
    return std::nullopt;
  }
  std::string Summary() const override { return "fake"; }

 private:
  std::vector<std::string> tokens_;
  int32_t specials_from_;
};

bool Has(const std::vector<uint64_t>& mask, int32_t t) {
  return (mask[t >> 6] >> (t & 63)) & 1;
}

// For every token: allowed iff prefix + token is a valid prefix (or, for a
// stop token, iff prefix is complete).
void ExpectMaskIsBruteForce(const Grammar& grammar, const Tokenizer& tok,
                            GrammarConstraint& c, const std::string& prefix,
                            const std::vector<int32_t>& stops) {
  std::vector<uint64_t> mask;
  c.Allowed(tok.vocab_size(), mask);
  Grammar::State state = grammar.Start();
  ASSERT_TRUE(grammar.AdvanceBytes(state, prefix)) << prefix;
  int allowed = 0;
  for (int32_t t = 0; t < tok.vocab_size(); ++t) {
    bool want;
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) {
      want = Grammar::IsComplete(state);
    } else if (tok.IsSpecial(t) || tok.TokenBytes(t).empty()) {
      want = false;
    } else {
      Grammar::State s = state;
      want = grammar.AdvanceBytes(s, tok.TokenBytes(t));
    }
    allowed += want;
    ASSERT_EQ(Has(mask, t), want) << "token " << t << " '" << tok.TokenBytes(t)
                                  << "' after '" << prefix << "'";
  }
  EXPECT_GT(allowed, 0) << prefix;
}

TEST(TokenMaskTest, SmallVocabularyMatchesBruteForceAtEveryPrefix) {
  // Tokens spanning several symbols, ending inside them, and specials.
  std::vector<std::string> vocab = {
      "\":", "\"a", "ab",  "b\"",  "12",   "3}",   ", \"",       "true", "tr",
      "ue",  "{\"", "\"}", "null", "\xc3", "\xa9", "\xc3\xa9\"", "\n  ", "\"]"};
  for (int c = 0x20; c < 0x7f; ++c) vocab.push_back(std::string(1, char(c)));
  vocab.push_back("\n");
  vocab.push_back("<eos>");
  const int32_t eos = static_cast<int32_t>(vocab.size()) - 1;
  FakeTokenizer tok(vocab, /*specials_from=*/eos);
  const std::vector<int32_t> stops = {eos};
  const char* schemas[] = {
      R"({"type":"object","properties":{"a":{"type":"string"},
          "b":{"type":"integer","minimum":1,"maximum":123}},"required":["b"]})",
      R"({"type":"array","items":{"enum":["ab",true,null]},"maxItems":2})",
  };
  const char* sentences[] = {"{\"a\":\"ab\\u00e9\xc3\xa9\",\n\"b\":123}",
                             R"(["ab", true])"};
  int checked = 0;
  auto trie = std::make_shared<VocabTrie>(tok);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(schemas[i]);
    ASSERT_TRUE(g.ok()) << g.status();
    auto compiled = std::make_shared<CompiledGrammar>(*g, trie);
    // Walk the sentence byte by byte (the constraint takes one-byte tokens
    // where they exist, else checks the prefix directly).
    const std::string s = sentences[i];
    for (size_t n = 0; n <= s.size(); ++n) {
      const std::string prefix = s.substr(0, n);
      if (!g->AcceptsPrefix(prefix)) continue;
      GrammarConstraint c(compiled, stops);
      // Feed the prefix as one-byte tokens where the vocabulary has them.
      bool fed = true;
      for (char ch : prefix) {
        int32_t id = -1;
        for (int32_t t = 0; t < tok.vocab_size(); ++t) {
          if (tok.TokenBytes(t) == std::string(1, ch)) id = t;
        }
        if (id < 0 || !c.Accept(id).ok()) fed = false;
      }
      ASSERT_TRUE(fed) << prefix;
      ExpectMaskIsBruteForce(*g, tok, c, prefix, stops);
      ++checked;
    }
  }
  // Every prefix of both sentences, the empty one included.
  EXPECT_EQ(checked, std::string(sentences[0]).size() +
                         std::string(sentences[1]).size() + 2);
}

TEST(TokenMaskTest, RealSmolLm2VocabularyMatchesBruteForce) {
  const std::string path = testing_util::SmolLm2ModelPath();
  ASSERT_FALSE(path.empty());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto trie = std::make_shared<VocabTrie>(**tok);
  const std::string schema = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":40},
      "tags":{"type":"array","items":{"enum":["red","green"]},"maxItems":3},
      "when":{"type":"string","format":"date"},
      "n":{"type":"integer","minimum":-5,"maximum":250}},
      "required":["name","n"],"additionalProperties":false})";
  absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
  ASSERT_TRUE(g.ok()) << g.status();
  auto compiled = std::make_shared<CompiledGrammar>(*g, trie);
  const std::vector<int32_t> stops = {(*tok)->eos_id()};
  // A valid output, tokenized as the model would write it: every token of
  // it must be allowed in turn, and at each step the mask must equal the
  // brute force over all 49152 tokens.
  const std::string text =
      R"({"name": "Zoë's \"cat\"", "tags": ["red", "green"], )"
      R"("when": "2024-02-28", "n": 217})";
  const std::vector<int32_t> ids = (*tok)->Encode(text);
  ASSERT_EQ((*tok)->Decode(ids), text);
  GrammarConstraint c(compiled, stops);
  std::string prefix;
  for (size_t i = 0; i <= ids.size(); ++i) {
    ExpectMaskIsBruteForce(*g, **tok, c, prefix, stops);
    if (::testing::Test::HasFatalFailure()) return;
    if (i == ids.size()) break;
    std::vector<uint64_t> mask;
    c.Allowed((*tok)->vocab_size(), mask);
    ASSERT_TRUE(Has(mask, ids[i])) << "token " << i;
    ASSERT_TRUE(c.Accept(ids[i]).ok());
    prefix += (*tok)->TokenBytes(ids[i]);
  }
  EXPECT_TRUE(c.complete());
  std::vector<uint64_t> mask;
  c.Allowed((*tok)->vocab_size(), mask);
  int allowed = 0;
  for (int32_t t = 0; t < (*tok)->vocab_size(); ++t) allowed += Has(mask, t);
  EXPECT_EQ(allowed, 1);  // Only the end of text is left.
  EXPECT_TRUE(Has(mask, stops[0]));
  // A token outside the mask is refused and changes nothing.
  const std::vector<int32_t> bad = (*tok)->Encode("x");
  GrammarConstraint fresh(compiled, stops);
  EXPECT_FALSE(fresh.Accept(bad[0]).ok());
  EXPECT_TRUE(fresh.Accept((*tok)->Encode("{")[0]).ok());
  EXPECT_GT(compiled->cache_hits(), 0);
}

}  // namespace
}  // namespace shardlm
