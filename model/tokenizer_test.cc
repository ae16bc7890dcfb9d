#include "model/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/literal_trie.h"
#include "model/normalizer.h"
#include "model/pretokenizer.h"
#include "model/smollm2_test_model.h"
#include "model/tokenizer_loaders.h"
#include "model/unicode_tables.h"

namespace shardlm {
namespace {

using Pieces = std::vector<std::string_view>;
const std::string kFffd = "\xEF\xBF\xBD";

// A tokenizer whose tokens are given byte strings; enough for Decode and
// the streaming detokenizer.
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> tokens)
      : tokens_(std::move(tokens)) {}
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string_view TokenBytes(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? tokens_[id] : std::string_view();
  }
  int32_t vocab_size() const override { return tokens_.size(); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }
  bool IsSpecial(int32_t) const override { return false; }
  std::optional<int32_t> TokenId(std::string_view) const override {
    return std::nullopt;
  }
  std::string Summary() const override { return "fake"; }

 private:
  std::vector<std::string> tokens_;
};

// Pushes `ids` one by one; returns each Push() result and then Finish().
std::vector<std::string> Stream(const Tokenizer& tok,
                                const std::vector<int32_t>& ids) {
  StreamingDetokenizer stream(&tok);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.Push(id));
  out.push_back(stream.Finish());
  return out;
}

TEST(StreamingDetokenizerTest, HoldsSplitCharactersUntilComplete) {
  // "é" = C3 A9 and "😀" = F0 9F 98 80 cut into single bytes.
  FakeTokenizer tok({"a", "\xC3", "\xA9", "\xF0", "\x9F", "\x98", "\x80"});
  EXPECT_EQ(Stream(tok, {0, 1, 2, 0}),
            (std::vector<std::string>{"a", "", "\xC3\xA9", "a", ""}));
  EXPECT_EQ(Stream(tok, {3, 4, 5, 6}),
            (std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""}));
  EXPECT_EQ(tok.Decode({1, 2, 0}),
            "\xC3\xA9"
            "a");
  EXPECT_EQ(tok.Decode({1, 99, -1}), "\xC3");  // Unknown ids add nothing.
}

TEST(StreamingDetokenizerTest, ReplacesInvalidBytes) {
  FakeTokenizer tok({"a", "\xC3", "\xFF", "\xE4\xB8", "\xED\xA0\x80",
                     "\xC0\x80", "\xF0\x9F\x98"});
  // A byte that can never start a character is replaced at once.
  EXPECT_EQ(Stream(tok, {2, 0}), (std::vector<std::string>{kFffd, "a", ""}));
  // A lead byte followed by a non-continuation: one U+FFFD, then the rest.
  EXPECT_EQ(Stream(tok, {1, 0}),
            (std::vector<std::string>{"", kFffd + "a", ""}));
  // Cut off at the end of the stream: one U+FFFD for the whole prefix.
  EXPECT_EQ(Stream(tok, {0, 3}), (std::vector<std::string>{"a", "", kFffd}));
  EXPECT_EQ(Stream(tok, {6}), (std::vector<std::string>{"", kFffd}));
  // Surrogates and overlong forms are ill-formed byte by byte.
  EXPECT_EQ(Stream(tok, {4}),
            (std::vector<std::string>{kFffd + kFffd + kFffd, ""}));
  EXPECT_EQ(Stream(tok, {5}), (std::vector<std::string>{kFffd + kFffd, ""}));
}

TEST(ByteLevelTest, AllBytesRoundTrip) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = ByteLevelEncode(all);
  EXPECT_EQ(ByteLevelDecode(mapped), all);
  // Each byte is one code point, all distinct.
  std::set<uint32_t> seen;
  for (size_t pos = 0; pos < mapped.size();) {
    seen.insert(NextCodePoint(mapped, &pos));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(ByteLevelEncode(" "), "\xC4\xA0");     // U+0120 'Ġ'
  EXPECT_EQ(ByteLevelEncode("\n"), "\xC4\x8A");    // U+010A 'Ċ'
  EXPECT_EQ(ByteLevelEncode("\xAD"), "\xC5\x83");  // U+0143, the last one.
  EXPECT_EQ(ByteLevelEncode("Az~!"), "Az~!");
  EXPECT_EQ(ByteLevelDecode("\xE4\xB8\xAD"), std::nullopt);  // 中
}

TEST(UnicodeTablesTest, Classes) {
  EXPECT_EQ(ClassifyCodePoint('a'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(0x4E2D), CharClass::kLetter);  // 中
  EXPECT_EQ(ClassifyCodePoint(0x0663), CharClass::kNumber);  // ٣
  EXPECT_EQ(ClassifyCodePoint(0x00B2), CharClass::kNumber);  // ²
  EXPECT_EQ(ClassifyCodePoint(0x2163), CharClass::kNumber);  // Ⅳ
  EXPECT_EQ(ClassifyCodePoint(0x00A0), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(0x3000), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(0x200B), CharClass::kOther);  // ZWSP
  EXPECT_EQ(ClassifyCodePoint(0x1F600), CharClass::kOther);
  EXPECT_EQ(ClassifyCodePoint(0x110000 + 0xAA), CharClass::kOther);
}

// Expected forms from Python's unicodedata.normalize("NFC", ...).
TEST(NormalizerTest, Nfc) {
  EXPECT_EQ(NormalizeNfc("plain ASCII"), "plain ASCII");
  EXPECT_EQ(NormalizeNfc("e\xCC\x81"), "\xC3\xA9");     // e + U+0301
  EXPECT_EQ(NormalizeNfc("A\xCC\x8A"), "\xC3\x85");     // A + U+030A
  EXPECT_EQ(NormalizeNfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B
  EXPECT_EQ(NormalizeNfc("\xC3\xA9t\xC3\xA9"), "\xC3\xA9t\xC3\xA9");
  // Hangul jamo L V T, and LV + T.
  EXPECT_EQ(NormalizeNfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"),
            "\xEA\xB0\x81");
  EXPECT_EQ(NormalizeNfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");
  // a + U+0302 (class 230) + U+0323 (220): reordered, then both compose.
  EXPECT_EQ(NormalizeNfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");
  // The second acute is blocked by the first.
  EXPECT_EQ(NormalizeNfc("a\xCC\x81\xCC\x81"), "\xC3\xA1\xCC\x81");
  // U+0344 decomposes and never recomposes (a non-starter decomposition).
  EXPECT_EQ(NormalizeNfc("\xCD\x84"), "\xCC\x88\xCC\x81");
  // U+0B47 + U+0B3E: two starters that compose.
  EXPECT_EQ(NormalizeNfc("\xE0\xAD\x87\xE0\xAC\xBE"), "\xE0\xAD\x8B");
  // U+1E0B (d with dot above) + U+0323: decomposed, reordered, recomposed.
  EXPECT_EQ(NormalizeNfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");
  // Invalid bytes pass through and block composition.
  EXPECT_EQ(NormalizeNfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_EQ(NormalizeNfc("\xC3"), "\xC3");
}

Pieces Split(std::string_view text, PreTokenizerKind kind) {
  Pieces pieces;
  PreTokenize(text, kind, &pieces);
  return pieces;
}

TEST(PreTokenizerTest, Gpt2Regex) {
  const auto k = PreTokenizerKind::kGpt2;
  EXPECT_EQ(Split("Hello world", k), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Split("a   b", k), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(Split("a  ", k), (Pieces{"a", "  "}));
  EXPECT_EQ(Split("x\t\ny", k), (Pieces{"x", "\t", "\n", "y"}));
  EXPECT_EQ(Split("don't WE'VE", k), (Pieces{"don", "'t", " WE", "'", "VE"}));
  EXPECT_EQ(Split("?'s", k), (Pieces{"?'", "s"}));
  EXPECT_EQ(Split(" 123abc!!", k), (Pieces{" 123", "abc", "!!"}));
  EXPECT_EQ(Split("\xFF\xFE x", k), (Pieces{"\xFF\xFE", " x"}));
  EXPECT_EQ(Split("", k), Pieces{});
}

TEST(PreTokenizerTest, SmollmSplitsEveryNumber) {
  const auto k = PreTokenizerKind::kSmollm;
  EXPECT_EQ(Split("ab12 c", k), (Pieces{"ab", "1", "2", " c"}));
  EXPECT_EQ(Split(" 3.14", k), (Pieces{" ", "3", ".", "1", "4"}));
  EXPECT_EQ(Split("x \xC2\xB2", k), (Pieces{"x", " ", "\xC2\xB2"}));
}

// Expected pieces checked against Hugging Face tokenizers'
// Split(Regex(pattern), "isolated") on the same strings.
TEST(PreTokenizerTest, Llama3Regex) {
  const auto k = PreTokenizerKind::kLlama3;
  // Contractions in any case; a space or other non-letter joins the word.
  EXPECT_EQ(Split("I'LL don't We'Re", k),
            (Pieces{"I", "'LL", " don", "'t", " We", "'Re"}));
  EXPECT_EQ(Split("'\xC5\xBFt", k), (Pieces{"'\xC5\xBF", "t"}));  // 'ſt
  EXPECT_EQ(Split("abc1234567def", k),
            (Pieces{"abc", "123", "456", "7", "def"}));
  EXPECT_EQ(Split("x \xC2\xB2\xC2\xB3 y", k),
            (Pieces{"x", " ", "\xC2\xB2\xC2\xB3", " y"}));  // ²³
  // Whitespace: up to the last CR/LF of a run; tabs and NBSP join a word.
  EXPECT_EQ(Split("Hello  world\n\n", k),
            (Pieces{"Hello", " ", " world", "\n\n"}));
  EXPECT_EQ(Split("a  \n  b", k), (Pieces{"a", "  \n", " ", " b"}));
  EXPECT_EQ(Split(" \n ", k), (Pieces{" \n", " "}));
  EXPECT_EQ(Split("\t\tx", k), (Pieces{"\t", "\tx"}));
  EXPECT_EQ(Split("\xC2\xA0\xC2\xA0y", k), (Pieces{"\xC2\xA0", "\xC2\xA0y"}));
  // Punctuation keeps one leading space and the newlines after it.
  EXPECT_EQ(Split("!!\n\n x", k), (Pieces{"!!\n\n", " x"}));
  EXPECT_EQ(Split(" ?!x", k), (Pieces{" ?!", "x"}));
  EXPECT_EQ(Split("\xE4\xB8\xAD\xE6\x96\x87 text", k),
            (Pieces{"\xE4\xB8\xAD\xE6\x96\x87", " text"}));  // 中文
  EXPECT_EQ(Split("\xFF\xFE x", k), (Pieces{"\xFF\xFE", " x"}));
  EXPECT_EQ(Split("", k), Pieces{});
}

TEST(PreTokenizerTest, Qwen2SplitsSingleNumbers) {
  const auto k = PreTokenizerKind::kQwen2;
  EXPECT_EQ(Split("abc1234def", k), (Pieces{"abc", "1", "2", "3", "4", "def"}));
  EXPECT_EQ(Split("x \xC2\xB2\xC2\xB3 y", k),
            (Pieces{"x", " ", "\xC2\xB2", "\xC2\xB3", " y"}));
  EXPECT_EQ(Split("We'Re  \r\n\r\n  x", k),
            (Pieces{"We", "'Re", "  \r\n\r\n", " ", " x"}));
}

// Expected pieces from Hugging Face tokenizers' Split(Regex(o200k),
// "isolated") on the same strings.
TEST(PreTokenizerTest, Gpt4oSplitsAtCaseChanges) {
  const auto k = PreTokenizerKind::kGpt4o;
  EXPECT_EQ(Split("HelloWorld XMLHttpRequest iPhone", k),
            (Pieces{"Hello", "World", " XMLHttp", "Request", " i", "Phone"}));
  // Contractions stay on their word, in any case ('ſ folds to 's).
  EXPECT_EQ(Split("I'LL don't We'Re they'RE", k),
            (Pieces{"I'LL", " don't", " We'Re", " they'RE"}));
  EXPECT_EQ(Split("ABC'sx", k), (Pieces{"ABC's", "x"}));
  EXPECT_EQ(Split("x'\xC5\xBFt", k), (Pieces{"x'\xC5\xBF", "t"}));
  EXPECT_EQ(Split("'s 't", k), (Pieces{"'s", " '", "t"}));
  // Title case (U+01C5) is upper; modifier letters (U+02B0) are in both
  // sets, so "A\u02B0B" ends its first word after U+02B0.
  EXPECT_EQ(Split("\xC7\x85ungla \xCA\xB0"
                  "ab A\xCA\xB0"
                  "B",
                  k),
            (Pieces{"\xC7\x85ungla",
                    " \xCA\xB0"
                    "ab",
                    " A\xCA\xB0", "B"}));
  // A mark (U+0301) is a word of its own before upper case, and joins
  // punctuation in front of a word.
  EXPECT_EQ(Split("\xCC\x81"
                  "AB",
                  k),
            (Pieces{"\xCC\x81", "AB"}));
  EXPECT_EQ(Split(" \xCC\x81"
                  "AB",
                  k),
            (Pieces{" \xCC\x81", "AB"}));
  EXPECT_EQ(Split("!\xCC\x81"
                  "ab",
                  k),
            (Pieces{"!\xCC\x81"
                    "ab"}));
  // Punctuation takes the newlines and slashes after it.
  EXPECT_EQ(Split("a/b !/\n/x ://", k),
            (Pieces{"a", "/b", " !/\n/", "x", " ://"}));
  EXPECT_EQ(Split("abc1234567def", k),
            (Pieces{"abc", "123", "456", "7", "def"}));
  EXPECT_EQ(Split("Hello  world\n\n", k),
            (Pieces{"Hello", " ", " world", "\n\n"}));
  EXPECT_EQ(Split("\xC3\x89"
                  "COLE \xC3\xA9"
                  "cole",
                  k),
            (Pieces{"\xC3\x89"
                    "COLE",
                    " \xC3\xA9"
                    "cole"}));  // ÉCOLE école
  EXPECT_EQ(Split("", k), Pieces{});
}

TEST(PreTokenizerTest, PiecesCoverTheText) {
  std::mt19937 rng(11);
  const std::vector<std::string> atoms = {"a",
                                          "Z",
                                          "'",
                                          "s",
                                          "S",
                                          "ll",
                                          " ",
                                          "  ",
                                          "\t",
                                          "\r",
                                          "\n",
                                          "1",
                                          "\xC2\xB2",
                                          "!",
                                          "?",
                                          "\xC2\xA0",
                                          "\xE4\xB8\xAD",
                                          "\xF0\x9F\x98\x80",
                                          "\xFF",
                                          "\xC5\xBF",
                                          "\xCC\x81",
                                          "\xC7\x85",
                                          "/"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    for (int n = rng() % 12; n > 0; --n) text += atoms[rng() % atoms.size()];
    for (PreTokenizerKind kind :
         {PreTokenizerKind::kGpt2, PreTokenizerKind::kSmollm,
          PreTokenizerKind::kLlama3, PreTokenizerKind::kQwen2,
          PreTokenizerKind::kGpt4o}) {
      std::string joined;
      for (std::string_view piece : Split(text, kind)) {
        EXPECT_FALSE(piece.empty()) << PreTokenizerName(kind);
        joined += piece;
      }
      EXPECT_EQ(joined, text) << PreTokenizerName(kind);
    }
  }
}

// Byte tokens for "abc " plus merges; ids: a=0 b=1 c=2 Ġ=3.
BpeConfig TinyConfig() {
  BpeConfig config;
  config.tokens = {"a", "b", "c", "\xC4\xA0", "bc", "ab", "aa", "abc"};
  config.merges = {{"b", "c"}, {"a", "b"}, {"a", "a"}, {"ab", "c"}};
  return config;
}

TEST(BpeTokenizerTest, MergesByRankLeftmostFirst) {
  auto tok = BpeTokenizer::Create(TinyConfig());
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "b c" outranks "a b", so "abc" is a + bc, never ab + c -> abc.
  EXPECT_EQ((*tok)->Encode("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ((*tok)->Encode("aaa"), (std::vector<int32_t>{6, 0}));
  EXPECT_EQ((*tok)->Encode("ab a"), (std::vector<int32_t>{5, 3, 0}));
  EXPECT_EQ((*tok)->Encode("xa"), (std::vector<int32_t>{0}));  // No 'x'.
  EXPECT_EQ((*tok)->Decode({5, 3, 4}), "ab bc");
  EXPECT_EQ((*tok)->TokenId("\xC4\xA0"), 3);
  EXPECT_EQ((*tok)->Summary(),
            "byte-level BPE (gpt2 pre-tokenizer): 8 tokens, 4 merges, "
            "0 special");
}

TEST(BpeTokenizerTest, AddedTokensLongestMatch) {
  BpeConfig config = TinyConfig();
  config.added_tokens = {
      {8, "<s>", true}, {9, "<s>a", true}, {10, "cc", false}};
  config.eos_id = 8;
  auto tok = BpeTokenizer::Create(std::move(config));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("a<s>b<s>acc"),
            (std::vector<int32_t>{0, 8, 1, 9, 10}));
  EXPECT_EQ((*tok)->Decode({9, 10}), "<s>acc");
  EXPECT_TRUE((*tok)->IsSpecial(9));
  EXPECT_FALSE((*tok)->IsSpecial(10));
  EXPECT_EQ((*tok)->vocab_size(), 11);
  EXPECT_EQ((*tok)->eos_id(), 8);
  EXPECT_EQ((*tok)->TokenId("<s>a"), 9);
}

// The trie finds what the scan it replaced found: of the texts a position
// starts with, the longest; of texts given twice, the first value.
TEST(LiteralTrieTest, LongestPrefixAsAScanFindsIt) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::string> texts;
    std::vector<std::pair<std::string_view, int32_t>> entries;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      std::string t;
      for (size_t len = 1 + rng() % 6; t.size() < len;) {
        t.push_back("<a>\xff"[rng() % 4]);
      }
      texts.push_back(t);
    }
    for (int i = 0; i < n; ++i) entries.emplace_back(texts[i], i);
    const LiteralTrie trie(entries);
    EXPECT_EQ(trie.size(),
              std::set<std::string>(texts.begin(), texts.end()).size());
    std::string text;
    for (int i = 0; i < 64; ++i) text.push_back("b<a>\xff"[rng() % 5]);
    for (size_t at = 0; at <= text.size(); ++at) {
      const std::string_view rest = std::string_view(text).substr(at);
      int32_t want = -1;
      size_t want_size = 0;
      for (int i = 0; i < n; ++i) {
        if (rest.starts_with(texts[i]) && texts[i].size() > want_size) {
          want = i;
          want_size = texts[i].size();
        }
      }
      const LiteralTrie::Match got = trie.LongestPrefix(rest);
      ASSERT_EQ(got.value, want) << "round " << round << " at " << at;
      ASSERT_EQ(got.size, want_size);
      if (!rest.empty() && !trie.MayStartWith(rest[0])) {
        ASSERT_EQ(want, -1);
      }
    }
  }
  const LiteralTrie empty;
  EXPECT_EQ(empty.LongestPrefix("<a>").value, -1);
  EXPECT_FALSE(empty.MayStartWith('<'));
}

// Thousands of added tokens sharing their first bytes (Gemma's
// <unusedN>): each written one is found whole, one cut short is text.
TEST(BpeTokenizerTest, ManyAddedTokensSharingAPrefix) {
  BpeConfig config = TinyConfig();
  for (int i = 0; i < 3000; ++i) {
    config.added_tokens.push_back(
        {8 + i, "<unused" + std::to_string(i) + ">", true});
  }
  config.added_tokens.push_back({3008, "<unused12>", true});  // Again.
  auto tok = BpeTokenizer::Create(std::move(config));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("a<unused12><unused2999>b<unused1>"),
            (std::vector<int32_t>{0, 8 + 12, 8 + 2999, 1, 8 + 1}));
  // "<unused3000>" is none: its bytes ('<', '>' and letters are not in the
  // tiny vocabulary; digits neither) give no tokens, the "a" after does.
  EXPECT_EQ((*tok)->Encode("<unused3000>a<unused1"), (std::vector<int32_t>{0}));
}

TEST(BpeTokenizerTest, RejectsBadConfig) {
  BpeConfig config = TinyConfig();
  config.merges.push_back({"c", "c"});  // "cc" is not in the vocabulary.
  auto tok = BpeTokenizer::Create(std::move(config));
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tok.status().message().find("merge 4"), std::string::npos);
  config = TinyConfig();
  config.eos_id = 100;
  EXPECT_EQ(BpeTokenizer::Create(std::move(config)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

constexpr char kGoodJson[] = R"({
  "normalizer": null,
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": true},
    {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
  "decoder": {"type": "ByteLevel"},
  "added_tokens": [{"id": 5, "content": "<|end|>", "special": true}],
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "1": 3,
            "\u0120": 4},
            "merges": ["a b"]}
})";

TEST(TokenizerJsonTest, ParsesSmollmStyle) {
  auto config = BpeConfigFromTokenizerJson(kGoodJson);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pre, PreTokenizerKind::kSmollm);
  ASSERT_EQ(config->merges.size(), 1u);
  EXPECT_EQ(config->merges[0].first, "a");
  auto tok = BpeTokenizer::Create(*std::move(config));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("ab 11<|end|>"),
            (std::vector<int32_t>{2, 4, 3, 3, 5}));
}

TEST(TokenizerJsonTest, RejectsMalformedInput) {
  struct Case {
    std::string json;
    absl::StatusCode code;
    std::string message;
  };
  const std::string pre =
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false})";
  const std::vector<Case> cases = {
      {"{not json", absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"[1, 2]", absl::StatusCode::kInvalidArgument, "not an object"},
      {"{}", absl::StatusCode::kInvalidArgument, "model is missing"},
      {R"({"model": {"type": "WordPiece"}})", absl::StatusCode::kUnimplemented,
       "WordPiece"},
      {R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "pre_tokenizer"},
      {"{" + pre + R"(, "model": {"type": "BPE", "vocab": [], "merges": []}})",
       absl::StatusCode::kInvalidArgument, "model.vocab"},
      {"{" + pre + R"(, "model": {"vocab": {"a": -1}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "model.vocab[\"a\"]"},
      {"{" + pre + R"(, "model": {"vocab": {"a": "x"}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "is not an id"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 0, "b": 0}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "used by both"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 99999999}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "far beyond"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 0}, "merges": {}}})",
       absl::StatusCode::kInvalidArgument, "model.merges"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 0}, "merges": ["a"]}})",
       absl::StatusCode::kInvalidArgument, "model.merges[0]"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 0}, "merges": [["a"]]}})",
       absl::StatusCode::kInvalidArgument, "model.merges[0]"},
      {"{" + pre + R"(, "model": {"vocab": {"a": 0}, "merges": [],
        "end_of_word_suffix": "</w>"}})",
       absl::StatusCode::kUnimplemented, "end_of_word_suffix"},
      {"{" + pre + R"(, "added_tokens": [{"content": "x"}],
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "added_tokens[0] has no id"},
      {"{" + pre + R"(, "added_tokens": [{"id": 1, "content": ""}],
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kInvalidArgument, "added_tokens[0].content"},
      {R"({"pre_tokenizer": {"type": "Whitespace"},
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "Whitespace"},
      {R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true},
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "add_prefix_space"},
      {R"({"normalizer": {"type": "NFKC"}, "pre_tokenizer": {"type":
        "ByteLevel", "add_prefix_space": false}, "model": {"vocab": {},
        "merges": []}})",
       absl::StatusCode::kUnimplemented, "normalizer NFKC"},
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior":
        "Isolated"}, {"type": "ByteLevel", "add_prefix_space": false,
        "use_regex": false}]}, "model": {"vocab": {}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "Split regex \"\\\\s+\""},
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "x"}, "behavior":
        "Isolated"}, {"type": "ByteLevel", "add_prefix_space": false,
        "use_regex": false}]}, "model": {"vocab": {}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "Split(Regex"},
      {"{" + pre + R"(, "post_processor": {"type": "RobertaProcessing"},
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "post_processor RobertaProcessing"},
      {"{" + pre + R"(, "post_processor": {"type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "a"}}]},
        "model": {"vocab": {"a": 0}, "merges": []}})",
       absl::StatusCode::kUnimplemented, "TemplateProcessing"},
  };
  for (const Case& c : cases) {
    auto config = BpeConfigFromTokenizerJson(c.json);
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), c.code) << config.status();
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << config.status() << " should mention " << c.message;
  }
}

// Llama 3's pre-tokenizer and post-processor as its tokenizer.json has them.
constexpr char kLlama3Json[] = R"({
  "normalizer": null,
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
     "use_regex": false}]},
  "post_processor": {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
     "use_regex": true},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                        "ids": [5], "tokens": ["<|begin_of_text|>"]}}}]},
  "decoder": {"type": "ByteLevel"},
  "added_tokens": [{"id": 5, "content": "<|begin_of_text|>", "special": true}],
  "model": {"type": "BPE", "ignore_merges": true,
            "vocab": {"a": 0, "b": 1, "ab": 2, "1": 3, "\u0120": 4},
            "merges": ["a b"]}
})";

TEST(TokenizerJsonTest, ParsesLlama3AndQwen2Style) {
  auto config = BpeConfigFromTokenizerJson(kLlama3Json);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pre, PreTokenizerKind::kLlama3);
  EXPECT_TRUE(config->add_bos);
  EXPECT_EQ(config->bos_id, 5);
  EXPECT_TRUE(config->ignore_merges);
  EXPECT_FALSE(config->nfc);
  auto tok = BpeTokenizer::Create(*std::move(config));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->EncodePrompt("ab 111"),
            (std::vector<int32_t>{5, 2, 4, 3, 3, 3}));

  // Qwen2: single numbers, NFC, no BOS.
  std::string qwen = kLlama3Json;
  qwen.replace(qwen.find("{1,3}"), 5, "");
  qwen.replace(qwen.find("\"normalizer\": null"), 18,
               R"("normalizer": {"type": "NFC"})");
  qwen.replace(qwen.find("\"post_processor\""), 16, "\"unused\"");
  config = BpeConfigFromTokenizerJson(qwen);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pre, PreTokenizerKind::kQwen2);
  EXPECT_TRUE(config->nfc);
  EXPECT_FALSE(config->add_bos);
  EXPECT_EQ(config->bos_id, -1);
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("tokenizer_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(path_ / name) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(LoadTokenizerTest, Directory) {
  TempDir dir;
  EXPECT_EQ(LoadTokenizer(dir.path() + "/missing").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadTokenizer(dir.path()).status().code(),
            absl::StatusCode::kNotFound);
  dir.Write("tokenizer.json", "{\"model\": 3}");
  auto bad = LoadTokenizer(dir.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer.json"), std::string::npos);

  dir.Write("tokenizer.json", kGoodJson);
  dir.Write("tokenizer_config.json",
            R"({"bos_token": null, "eos_token": {"content": "<|end|>"}})");
  auto tok = LoadTokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_id(), 5);
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_EQ((*tok)->Summary(),
            "byte-level BPE (smollm pre-tokenizer): 6 tokens, 1 merges, "
            "1 special");
}

// A tokenizer-only GGUF (no tensors): metadata key/values, little-endian.
class TokenizerGguf {
 public:
  void Str(const std::string& key, std::string_view v) {
    Key(key, GgufType::kString);
    AppendStr(v);
  }
  void Bool(const std::string& key, bool v) {
    Key(key, GgufType::kBool);
    kvs_.push_back(v ? 1 : 0);
  }
  void U32(const std::string& key, uint32_t v) {
    Key(key, GgufType::kUint32);
    Append(v);
  }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, GgufType::kArray);
    Append(static_cast<uint32_t>(GgufType::kString));
    Append(static_cast<uint64_t>(v.size()));
    for (const std::string& s : v) AppendStr(s);
  }
  void I32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, GgufType::kArray);
    Append(static_cast<uint32_t>(GgufType::kInt32));
    Append(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) Append(x);
  }
  std::string Build() const {
    std::string b = "GGUF";
    const uint32_t version = 3;
    const uint64_t tensors = 0;
    b.append(reinterpret_cast<const char*>(&version), 4);
    b.append(reinterpret_cast<const char*>(&tensors), 8);
    b.append(reinterpret_cast<const char*>(&count_), 8);
    return b + kvs_;
  }

 private:
  template <typename T>
  void Append(T v) {
    kvs_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void AppendStr(std::string_view s) {
    Append(static_cast<uint64_t>(s.size()));
    kvs_.append(s);
  }
  void Key(const std::string& key, GgufType type) {
    ++count_;
    AppendStr(key);
    Append(static_cast<uint32_t>(type));
  }
  std::string kvs_;
  uint64_t count_ = 0;
};

// TinyConfig's vocabulary as GGUF metadata, with the bytes of "é" (C3 A9)
// and "e" + U+0301 (65 CC 81) and a control token 8 "<|begin_of_text|>".
TokenizerGguf TinyGguf(std::string_view pre) {
  TokenizerGguf g;
  std::vector<std::string> tokens = TinyConfig().tokens;
  tokens.push_back("<|begin_of_text|>");
  for (const char* b : {"\xC3", "\xA9", "e", "\xCC", "\x81"}) {
    tokens.push_back(ByteLevelEncode(b));
  }
  std::vector<int32_t> types(tokens.size(), 1);
  types[8] = 3;
  std::vector<std::string> merges;
  for (const auto& [a, b] : TinyConfig().merges) merges.push_back(a + " " + b);
  g.Str("tokenizer.ggml.model", "gpt2");
  g.Str("tokenizer.ggml.pre", pre);
  g.StrArray("tokenizer.ggml.tokens", tokens);
  g.StrArray("tokenizer.ggml.merges", merges);
  g.I32Array("tokenizer.ggml.token_type", types);
  g.U32("tokenizer.ggml.bos_token_id", 8);
  return g;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGguf(const TokenizerGguf& g) {
  TempDir dir;
  dir.Write("t.gguf", g.Build());
  return LoadTokenizer(dir.path() + "/t.gguf");
}

TEST(LoadTokenizerTest, Llama3GgufAddsBos) {
  auto tok = LoadGguf(TinyGguf("llama-bpe"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Summary(),
            "byte-level BPE (llama3 pre-tokenizer): 14 tokens, 4 merges, 1 "
            "special, adds BOS");
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_EQ((*tok)->Encode("abc"), (std::vector<int32_t>{7}));  // No merges.
  EXPECT_EQ((*tok)->EncodePrompt("abc"), (std::vector<int32_t>{8, 7}));
  EXPECT_EQ((*tok)->EncodePrompt(""), (std::vector<int32_t>{8}));
  // A template that writes BOS itself does not get a second one.
  EXPECT_EQ((*tok)->EncodePrompt("<|begin_of_text|>abc"),
            (std::vector<int32_t>{8, 7}));
  // No NFC: the decomposed form stays as it is.
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("e\xCC\x81")), "e\xCC\x81");

  TokenizerGguf g = TinyGguf("llama3");
  g.Bool("tokenizer.ggml.add_bos_token", false);
  tok = LoadGguf(g);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_EQ((*tok)->EncodePrompt("abc"), (std::vector<int32_t>{7}));
}

TEST(LoadTokenizerTest, Qwen2GgufNormalizesNfc) {
  auto tok = LoadGguf(TinyGguf("qwen2"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Summary(),
            "byte-level BPE (NFC, qwen2 pre-tokenizer): 14 tokens, 4 merges, 1 "
            "special");
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_EQ((*tok)->EncodePrompt("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ((*tok)->Encode("e\xCC\x81"), (*tok)->Encode("\xC3\xA9"));
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("ae\xCC\x81<|begin_of_text|>")),
            "a\xC3\xA9<|begin_of_text|>");

  TokenizerGguf g = TinyGguf("qwen2");
  g.Bool("tokenizer.ggml.add_bos_token", true);
  tok = LoadGguf(g);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->EncodePrompt("a"), (std::vector<int32_t>{8, 0}));

  auto bad = LoadGguf(TinyGguf("tekken"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("'tekken'"), std::string::npos);
}

// The real SmolLM2 GGUF, when models/ has it (scripts/fetch-model.sh).
TEST(LoadTokenizerTest, SmolLm2Gguf) {
  const std::string model = testing_util::SmolLm2ModelPath();
  ASSERT_FALSE(model.empty());
  auto tok = LoadTokenizer(model);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Summary(),
            "byte-level BPE (smollm pre-tokenizer): 49152 tokens, 48900 "
            "merges, 17 special");
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_EQ((*tok)->TokenId("<|im_end|>"), 2);
  EXPECT_TRUE((*tok)->IsSpecial(2));
  // Ids from Hugging Face tokenizers (tests/reference/check_tokenizer.py).
  EXPECT_EQ((*tok)->Encode("<|im_start|>user\nhi<|im_end|>"),
            (std::vector<int32_t>{1, 4093, 198, 6004, 2}));
  EXPECT_EQ((*tok)->Encode("Hello world 2024!"),
            (std::vector<int32_t>{19556, 905, 216, 34, 32, 34, 36, 17}));
  EXPECT_EQ((*tok)->Encode(" \xC2\xB2"), (std::vector<int32_t>{216, 19133}));
  // SmolLM2's vocabulary lacks 21 of the 256 byte tokens (0x04, 0xC0,
  // 0xFF...): like HF tokenizers and llama.cpp, such bytes are dropped.
  EXPECT_EQ((*tok)->Encode("a\x04"
                           "b"),
            (std::vector<int32_t>{81, 82}));
  // Any other bytes, valid UTF-8 or not, come back unchanged.
  std::string alphabet;
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    if ((*tok)->TokenId(ByteLevelEncode(byte))) alphabet += byte;
  }
  EXPECT_EQ(alphabet.size(), 256u - 21);
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = alphabet[rng() % alphabet.size()];
    EXPECT_EQ((*tok)->Decode((*tok)->Encode(bytes)), bytes);
  }
}

}  // namespace
}  // namespace shardlm
