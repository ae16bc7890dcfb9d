// Byte-level BPE (GPT-2 style) tokenizer, built from a vocabulary and a
// ranked merge list however they were loaded (GGUF metadata or
// tokenizer.json; see tokenizer.cc and tokenizer_json.cc).
#ifndef SHARDLM_MODEL_BPE_TOKENIZER_H_
#define SHARDLM_MODEL_BPE_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/literal_trie.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace shardlm {

// GPT-2's bytes_to_unicode: byte b becomes one printable code point, UTF-8
// encoded ("Ġ" for ' ', "Ċ" for '\n', itself for most of ASCII).
std::string ByteLevelEncode(std::string_view bytes);
// The inverse; nullopt when a code point is not the image of a byte.
std::optional<std::string> ByteLevelDecode(std::string_view text);

// A token matched literally in the input before pre-tokenization (GGUF
// CONTROL / USER_DEFINED tokens, tokenizer.json added_tokens).
struct AddedToken {
  int32_t id = 0;
  std::string content;  // Literal text; also what the token decodes to.
  bool special = true;  // IsSpecial(); false for user-defined tokens.
};

struct BpeConfig {
  // tokens[id] in the byte-level alphabet ("Ġthe"). Ids without a token
  // hold an empty string.
  std::vector<std::string> tokens;
  // Merge pairs of token strings, lowest rank (most preferred) first.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added_tokens;  // Ids may be beyond tokens.size().
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  PreTokenizerKind pre = PreTokenizerKind::kGpt2;
  // HF BPE ignore_merges: a piece that is itself in the vocabulary is one
  // token without running merges.
  bool ignore_merges = false;
  // Tokenizer::add_bos(): prompts start with bos_id.
  bool add_bos = false;
  // Text between added tokens is put in Unicode NFC before pre-tokenizing
  // (HF normalizer NFC, as Qwen2's).
  bool nfc = false;
  // The model's Jinja chat template (GGUF tokenizer.chat_template,
  // tokenizer_config.json chat_template); empty when it has none.
  std::string chat_template;
};

// Immutable after Create; all methods are thread-safe.
class BpeTokenizer : public Tokenizer {
 public:
  // Pieces longer than this are merged in cuts of at most this many bytes
  // (see EncodePiece); tokens are exact for every piece up to it.
  static constexpr size_t kMaxMergedPieceBytes = 16 * 1024;

  // InvalidArgument naming the problem when a merge refers to a token not
  // in the vocabulary or an id is out of range.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(BpeConfig config);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string_view TokenBytes(int32_t id) const override;
  int32_t vocab_size() const override {
    return static_cast<int32_t>(bytes_.size());
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos() const override { return add_bos_; }
  bool IsSpecial(int32_t id) const override;
  std::optional<int32_t> TokenId(std::string_view token) const override;
  std::string Summary() const override;
  std::string_view chat_template() const override { return chat_template_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // The merged token.
  };
  BpeTokenizer() = default;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;
  struct Scratch;
  // Appends the BPE tokens of one pre-tokenized piece (raw bytes), merged
  // in cuts of at most kMaxMergedPieceBytes.
  void EncodePiece(std::string_view piece, Scratch* scratch,
                   std::vector<int32_t>* ids) const;
  // Appends the BPE tokens of `piece` merged whole.
  void EncodeMerged(std::string_view piece, Scratch* scratch,
                    std::vector<int32_t>* ids) const;
  // Appends the tokens of text that holds no added token.
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const;

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::vector<std::string> bytes_;  // [vocab_size] what each id decodes to.
  std::vector<bool> special_;       // [vocab_size]
  std::unordered_map<std::string, int32_t> token_ids_;  // Vocabulary text.
  std::unordered_map<std::string, int32_t> added_ids_;  // Added content.
  std::unordered_map<uint64_t, Merge> merges_;          // PairKey(left, right).
  std::array<int32_t, 256> byte_ids_;  // -1: byte not in vocab.
  // Content -> index into added_ (the first of those written alike).
  LiteralTrie added_trie_;
  std::vector<AddedToken> added_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  PreTokenizerKind pre_ = PreTokenizerKind::kGpt2;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  bool nfc_ = false;
  std::string chat_template_;
  size_t num_merges_ = 0;
  size_t num_special_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_BPE_TOKENIZER_H_
