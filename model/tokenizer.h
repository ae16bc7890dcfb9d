// Tokenizer interface and the incremental detokenizer.
#ifndef SHARDLM_MODEL_TOKENIZER_H_
#define SHARDLM_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardlm {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Special (control) tokens written literally in `text`, such as
  // "<|im_start|>", become their own ids. Never adds BOS (see EncodePrompt).
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // The raw bytes a token stands for (may be part of a UTF-8 character).
  // Special tokens give their literal text. Empty for ids out of range.
  virtual std::string_view TokenBytes(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none.
  virtual int32_t eos_id() const = 0;
  // Whether the model expects bos_id() in front of every prompt (GGUF
  // tokenizer.ggml.add_bos_token, Llama 3's tokenizer.json post-processor).
  virtual bool add_bos() const { return false; }
  virtual bool IsSpecial(int32_t id) const = 0;
  // The id of a token given by its text in the vocabulary ("<|im_end|>").
  virtual std::optional<int32_t> TokenId(std::string_view token) const = 0;
  // One line: kind, vocabulary size, merges, special tokens.
  virtual std::string Summary() const = 0;
  // The model's Jinja chat template source, empty when it has none (see
  // ChatTemplate::ForModel).
  virtual std::string_view chat_template() const { return {}; }

  // Concatenated bytes of `ids` (not necessarily valid UTF-8 if the ids
  // end inside a character).
  std::string Decode(absl::Span<const int32_t> ids) const;

  // The ids of a prompt as the model was trained to see it: Encode(text),
  // with bos_id() in front when add_bos() and bos_id() >= 0, unless the
  // text itself already starts with the BOS token (a chat template that
  // writes "<|begin_of_text|>"), so that it is never doubled.
  std::vector<int32_t> EncodePrompt(std::string_view text) const;
};

// Turns a stream of token ids into text without ever emitting half a UTF-8
// character: bytes of an incomplete character wait for the next token.
// Invalid sequences are replaced by U+FFFD once they cannot complete.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer* tokenizer)
      : tokenizer_(tokenizer) {}
  // Text that became complete with this token (may be empty).
  std::string Push(int32_t id);
  // Whatever is left at the end of the stream (U+FFFD for a cut character).
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;  // Not owned.
  std::string pending_;
};

// Loads the tokenizer of a model path as OpenWeights() understands it: the
// vocabulary and merges in GGUF metadata, or tokenizer.json in a directory.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& path);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_TOKENIZER_H_
