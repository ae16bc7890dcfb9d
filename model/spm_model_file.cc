// SentencePiece model files (ModelProto; a Hugging Face folder's
// tokenizer.model) -> SpmConfig, read as llama.cpp's converter reads them
// into a GGUF (pieces, scores and types; the dummy prefix from the
// normalizer), so that they tokenize as that GGUF does. What would
// tokenize differently is refused by name.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/mapped_file.h"
#include "model/sentencepiece_model.pb.h"
#include "model/spm_tokenizer.h"
#include "model/tokenizer_loaders.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

namespace sp = ::shardlm::sentencepiece;

// Llama 2's is 0.5 MB, Gemma's (256K pieces) 4 MB.
constexpr size_t kMaxModelBytes = size_t{64} << 20;

const char* ModelTypeName(int32_t type) {
  switch (type) {
    case 1:
      return "UNIGRAM";
    case 2:
      return "BPE";
    case 3:
      return "WORD";
    case 4:
      return "CHAR";
  }
  return nullptr;
}

absl::Status Unsupported(std::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      Sv(what),
      " is not supported (SentencePiece BPE with byte_fallback, "
      "the identity normalizer and no whitespace folding is: Llama "
      "2, Mistral)"));
}

// The flags of tokenizer_config.json that change how LlamaTokenizer runs
// the model; nullopt when absent or not a boolean.
struct TokenizerFlags {
  std::optional<bool> add_bos_token, add_eos_token, legacy;
};

TokenizerFlags ReadTokenizerFlags(const std::string& dir) {
  TokenizerFlags flags;
  absl::StatusOr<std::unique_ptr<MappedFile>> file =
      MappedFile::Open(dir + "/tokenizer_config.json");
  if (!file.ok()) return flags;
  const auto bytes = (*file)->bytes();
  const nlohmann::json j =
      nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (!j.is_object()) return flags;
  for (auto [key, out] : {std::pair{"add_bos_token", &flags.add_bos_token},
                          std::pair{"add_eos_token", &flags.add_eos_token},
                          std::pair{"legacy", &flags.legacy}}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_boolean()) *out = it->get<bool>();
  }
  return flags;
}

}  // namespace

absl::StatusOr<SpmConfig> SpmConfigFromModelProto(std::string_view bytes) {
  sp::ModelProto model;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not a SentencePiece model (ModelProto does not parse)");
  }
  const sp::TrainerSpec& trainer = model.trainer_spec();
  const char* type = ModelTypeName(trainer.model_type());
  if (type == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_spec.model_type = ", trainer.model_type(),
                     " is not a SentencePiece model type (1 to 4)"));
  }
  if (trainer.model_type() != 2) {
    return Unsupported(absl::StrCat("trainer_spec.model_type ", type));
  }
  if (!trainer.byte_fallback()) {
    // Characters outside the vocabulary would become <unk> per character;
    // the tokenizer falls back to bytes.
    return Unsupported("trainer_spec.byte_fallback = false");
  }
  if (trainer.treat_whitespace_as_suffix()) {
    return Unsupported("trainer_spec.treat_whitespace_as_suffix = true");
  }
  const sp::NormalizerSpec& norm = model.normalizer_spec();
  if (!norm.precompiled_charsmap().empty()) {
    return Unsupported(absl::StrCat("normalizer_spec.name '", norm.name(),
                                    "' (a precompiled normalization rule)"));
  }
  if (norm.remove_extra_whitespaces()) {
    return Unsupported("normalizer_spec.remove_extra_whitespaces = true");
  }
  if (!norm.escape_whitespaces()) {
    return Unsupported("normalizer_spec.escape_whitespaces = false");
  }
  if (model.has_denormalizer_spec() &&
      !model.denormalizer_spec().precompiled_charsmap().empty()) {
    return Unsupported("a denormalizer_spec rule");
  }

  const int n = model.pieces_size();
  if (n == 0 || n > (1 << 22)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a SentencePiece model of ", n, " pieces"));
  }
  SpmConfig c;
  c.pieces.reserve(n);
  c.scores.reserve(n);
  c.types.reserve(n);
  for (int i = 0; i < n; ++i) {
    const sp::ModelProto::SentencePiece& p = model.pieces(i);
    if (p.type() < 1 || p.type() > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].type = ", p.type(),
                       " is not a piece type (1 to 6)"));
    }
    c.pieces.push_back(p.piece());
    c.scores.push_back(p.score());
    c.types.push_back(static_cast<SpmTokenType>(p.type()));
  }
  for (auto [field, id] : {std::pair{"unk_id", trainer.unk_id()},
                           std::pair{"bos_id", trainer.bos_id()},
                           std::pair{"eos_id", trainer.eos_id()}}) {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer_spec.", field, " = ", id, " is outside the ", n, " pieces"));
    }
  }
  c.bos_id = trainer.bos_id();
  c.eos_id = trainer.eos_id();
  c.add_space_prefix = norm.add_dummy_prefix();
  // As llama.cpp and transformers' LlamaTokenizer (legacy) run it: every
  // text between literal special tokens is encoded on its own, with its
  // own dummy prefix.
  c.prefix_every_segment = true;
  return c;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSpmModelDirectory(
    const std::string& dir) {
  const std::string path = dir + "/tokenizer.model";
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() > kMaxModelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", file->size(), " bytes, more than the ",
                     kMaxModelBytes, " a SentencePiece model can be"));
  }
  const auto bytes = file->bytes();
  absl::StatusOr<SpmConfig> spm = SpmConfigFromModelProto(std::string_view(
      reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!spm.ok()) {
    return absl::Status(spm.status().code(),
                        absl::StrCat(path, ": ", spm.status().message()));
  }
  file.reset();
  // transformers' LlamaTokenizer: BOS added unless add_bos_token is false;
  // legacy = false changes the text after special tokens, add_eos_token
  // appends EOS to every prompt: neither is done here.
  const TokenizerFlags flags = ReadTokenizerFlags(dir);
  const std::string config = dir + "/tokenizer_config.json";
  if (flags.legacy == false) {
    return absl::UnimplementedError(absl::StrCat(
        config,
        ": legacy = false (no dummy prefix after special tokens) is "
        "not supported with tokenizer.model; a tokenizer.json is"));
  }
  if (flags.add_eos_token == true) {
    return absl::UnimplementedError(
        absl::StrCat(config, ": add_eos_token = true is not supported"));
  }
  spm->add_bos = flags.add_bos_token.value_or(true);
  // The bos/eos names (and the chat template) of tokenizer_config.json,
  // or else config.json's ids, as for tokenizer.json folders.
  return CreateSpmWithHfSpecialIds(dir, *std::move(spm), /*keep_bos=*/false);
}

}  // namespace shardlm
