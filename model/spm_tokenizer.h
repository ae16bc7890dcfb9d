// SentencePiece-style BPE over a scored vocabulary, as llama.cpp runs the
// GGUF tokenizer model "llama" (Llama 2, Mistral v0.1-v0.3, TinyLlama):
// spaces become U+2581 "▁" and the text gets one in front (the dummy
// prefix), then adjacent pieces merge best score first while the merged
// piece is in the vocabulary; characters left outside it fall back to
// their bytes' <0xXX> tokens. Control, user-defined and unknown tokens
// written literally in the text are matched whole, and the text after
// each gets its own dummy prefix (llama.cpp's rule) unless the
// configuration says only the start does. The same for Hugging Face
// tokenizer.json files of that kind (BPE with byte_fallback), whose
// merges then rank the pairs.
#ifndef SHARDLM_MODEL_SPM_TOKENIZER_H_
#define SHARDLM_MODEL_SPM_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/literal_trie.h"
#include "model/tokenizer.h"

namespace shardlm {

// GGUF tokenizer.ggml.token_type values.
enum class SpmTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct SpmConfig {
  std::vector<std::string> pieces;  // "▁the", "<0x0A>", "<s>".
  std::vector<float> scores;        // Higher merges first.
  std::vector<SpmTokenType> types;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = true;           // tokenizer.ggml.add_bos_token.
  bool add_space_prefix = true;  // tokenizer.ggml.add_space_prefix.
  // The dummy prefix starts the text after every literal token too
  // (llama.cpp; Hugging Face's Prepend normalizer), not only the first.
  bool prefix_every_segment = true;
  // No dummy prefix for text that already starts with a space (Hugging
  // Face's Metaspace pre-tokenizer).
  bool prefix_unless_space = false;
  // Hugging Face BPE merges (tokenizer.json), lowest rank first. When set,
  // only these pairs merge, lowest rank first, instead of any two pieces
  // whose concatenation is a piece, best score first.
  std::vector<std::pair<std::string, std::string>> merges;
  std::string chat_template;
};

// From tokenizer.ggml.{tokens,scores,token_type,bos_token_id,eos_token_id,
// add_bos_token,add_space_prefix}, chat_template. InvalidArgument naming
// the key when one is malformed.
absl::StatusOr<SpmConfig> SpmConfigFromGguf(const GgufFile& gguf);
// From the bytes of a SentencePiece model file (a serialized ModelProto, as
// Hugging Face folders ship it as tokenizer.model), read as llama.cpp's
// converter reads one into GGUF: pieces, scores, types, unk/bos/eos ids and
// the dummy prefix. InvalidArgument when the bytes are not a model;
// Unimplemented naming the field for models that would tokenize otherwise
// (Unigram, WORD and CHAR models, no byte_fallback, a normalization rule,
// whitespace folding). add_bos stays true.
absl::StatusOr<SpmConfig> SpmConfigFromModelProto(std::string_view bytes);
// (Folders are read by LoadTokenizerDirectory: tokenizer.json files of this
// kind, BPE with byte_fallback as Llama 2 and Mistral folders ship them, or
// tokenizer.model when there is no tokenizer.json.)

// Immutable after Create; all methods are thread-safe.
class SpmTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SpmTokenizer>> Create(SpmConfig config);

  std::vector<int32_t> Encode(std::string_view text) const override;
  // "▁" as a space, byte tokens as their byte, special tokens as their
  // text. (Decoding a whole encoded text therefore starts with the dummy
  // prefix's space.)
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
  SpmTokenizer() = default;
  // Appends the tokens of text holding no literal special token.
  void EncodeText(std::string_view text, bool dummy_prefix,
                  std::vector<int32_t>* ids) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<std::string> bytes_;  // What each id decodes to.
  std::vector<bool> special_;
  std::unordered_map<std::string, int32_t> piece_ids_;
  // Left piece, '\xff' (never in UTF-8), right piece -> merge rank.
  std::unordered_map<std::string, int32_t> merge_ranks_;
  std::array<int32_t, 256> byte_ids_;  // -1: no <0xXX> token.
  // Tokens matched literally (control, unknown, user-defined) -> id.
  LiteralTrie literals_;
  int64_t num_literal_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = true, add_space_prefix_ = true, prefix_every_segment_ = true,
       prefix_unless_space_ = false;
  std::string chat_template_;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_SPM_TOKENIZER_H_
