// Builds byte-level BPE configurations from the two on-disk forms:
// GGUF metadata (tokenizer.ggml.*) and Hugging Face tokenizer.json.
// Malformed input gives InvalidArgument naming the field; well-formed but
// unsupported tokenizers (another model type, normalizer or pre-tokenizer)
// give Unimplemented.
#ifndef SHARDLM_MODEL_TOKENIZER_LOADERS_H_
#define SHARDLM_MODEL_TOKENIZER_LOADERS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/spm_tokenizer.h"

namespace shardlm {

// From tokenizer.ggml.{model,tokens,merges,token_type,pre,bos_token_id,
// eos_token_id,add_bos_token}. CONTROL tokens (type 3) become special added
// tokens, USER_DEFINED ones (type 4) non-special added tokens. `pre` also
// sets ignore_merges, add_bos (default) and nfc as the model's tokenizer has
// them (see BpeConfigFromGguf in tokenizer.cc).
absl::StatusOr<BpeConfig> BpeConfigFromGguf(const GgufFile& gguf);

// What GGUF tokenizers of every model kind share:
// tokenizer.ggml.{bos,eos}_token_id (checked against `vocab`),
// tokenizer.ggml.add_bos_token when given, tokenizer.chat_template. Absent
// keys keep the defaults; InvalidArgument naming a key of the wrong type or
// range.
struct GgufTokenizerCommon {
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::optional<bool> add_bos;
  std::string chat_template;
};
absl::StatusOr<GgufTokenizerCommon> ReadGgufTokenizerCommon(
    const GgufFile& gguf, size_t vocab);

// OK for NotFound (an optional key left at its default), else `status`.
absl::Status OptionalKey(const absl::Status& status);

// From the text of a tokenizer.json. eos_id stays -1, and bos_id unless the
// post_processor puts a BOS in front of every sequence (then add_bos too):
// they live in tokenizer_config.json or config.json (see
// LoadTokenizerDirectory).
absl::StatusOr<BpeConfig> BpeConfigFromTokenizerJson(std::string_view json);

// `dir`/tokenizer.json, with bos/eos from tokenizer_config.json or else
// config.json when present (a BOS from the post_processor stays); with no
// tokenizer.json, `dir`/tokenizer.model (LoadSpmModelDirectory).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerDirectory(
    const std::string& dir);

// `dir`/tokenizer.model, a SentencePiece BPE model (SpmConfigFromModelProto)
// run as transformers' LlamaTokenizer runs it with legacy behaviour (and
// llama.cpp the GGUF converted from it): BOS unless tokenizer_config.json's
// add_bos_token is false; bos/eos names and the chat template from
// tokenizer_config.json. legacy = false and add_eos_token = true there are
// Unimplemented.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSpmModelDirectory(
    const std::string& dir);

// The SentencePiece tokenizer of `spm` with bos_id (unless keep_bos: a BOS
// the tokenizer file already fixed), eos_id and chat_template taken from
// `dir`/tokenizer_config.json (token names looked up in spm's pieces), or
// else config.json's ids, as for a byte-level BPE folder. Missing or
// malformed files change nothing.
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateSpmWithHfSpecialIds(
    const std::string& dir, SpmConfig spm, bool keep_bos);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_TOKENIZER_LOADERS_H_
