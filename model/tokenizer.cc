#include "model/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/spm_tokenizer.h"
#include "model/tokenizer_loaders.h"

namespace shardlm {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Moves whole UTF-8 characters from the front of *pending to *out. A
// maximal ill-formed subpart (Unicode 3.9, "substitution of maximal
// subparts") becomes one U+FFFD. An incomplete but so far well-formed
// character at the end stays in *pending unless `final`.
void Drain(std::string* pending, bool final, std::string* out) {
  const auto* s = reinterpret_cast<const unsigned char*>(pending->data());
  const size_t n = pending->size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = s[i];
    if (b0 < 0x80) {
      out->push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // Allowed second byte.
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t k = 1;
    while (k < len && i + k < n) {
      const unsigned char b = s[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (k == len) {
      out->append(pending->data() + i, len);
      i += len;
    } else if (i + k == n && !final) {
      break;  // May still complete with the next token's bytes.
    } else {
      out->append(kReplacement);
      i += k;
    }
  }
  pending->erase(0, i);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  if (absl::StatusOr<std::string_view> model =
          gguf->GetString("tokenizer.ggml.model");
      model.ok() && *model == "llama") {
    absl::StatusOr<SpmConfig> spm = SpmConfigFromGguf(*gguf);
    if (!spm.ok()) {
      return absl::Status(spm.status().code(),
                          absl::StrCat(path, ": ", spm.status().message()));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> tok,
                     SpmTokenizer::Create(*std::move(spm)));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  absl::StatusOr<BpeConfig> config = BpeConfigFromGguf(*gguf);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                   BpeTokenizer::Create(*std::move(config)));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    std::string_view bytes = TokenBytes(id);
    out.append(bytes.data(), bytes.size());
  }
  return out;
}

std::vector<int32_t> Tokenizer::EncodePrompt(std::string_view text) const {
  std::vector<int32_t> ids = Encode(text);
  if (add_bos() && bos_id() >= 0 && (ids.empty() || ids.front() != bos_id())) {
    ids.insert(ids.begin(), bos_id());
  }
  return ids;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  std::string_view bytes = tokenizer_->TokenBytes(id);
  pending_.append(bytes.data(), bytes.size());
  std::string out;
  Drain(&pending_, /*final=*/false, &out);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out;
  Drain(&pending_, /*final=*/true, &out);
  return out;
}

absl::StatusOr<BpeConfig> BpeConfigFromGguf(const GgufFile& gguf) {
  absl::StatusOr<std::string_view> model =
      gguf.GetString("tokenizer.ggml.model");
  if (absl::IsNotFound(model.status())) {
    return absl::InvalidArgumentError("GGUF has no tokenizer.ggml.model");
  }
  RETURN_IF_ERROR(model.status());
  if (*model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.model '", Sv(*model),
                     "' is not supported (gpt2, byte-level BPE, and llama, "
                     "SentencePiece BPE, are)"));
  }
  BpeConfig config;
  std::string_view pre = "gpt2";
  if (absl::StatusOr<std::string_view> p = gguf.GetString("tokenizer.ggml.pre");
      p.ok()) {
    pre = *p;
  } else {
    RETURN_IF_ERROR(OptionalKey(p.status()));
  }
  // llama.cpp's names (llama-vocab.cpp) for the pre-tokenizers we have.
  // Its llama3 group also drops merges for pieces in the vocabulary and
  // adds BOS unless tokenizer.ggml.add_bos_token says otherwise. Qwen2's
  // Hugging Face tokenizer normalizes to NFC first (llama.cpp does not);
  // we follow the tokenizer the model was trained with.
  if (pre == "smollm") {
    config.pre = PreTokenizerKind::kSmollm;
  } else if (pre == "gpt2") {
    config.pre = PreTokenizerKind::kGpt2;
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    config.pre = PreTokenizerKind::kLlama3;
    config.ignore_merges = true;
    config.add_bos = true;
  } else if (pre == "qwen2") {
    config.pre = PreTokenizerKind::kQwen2;
    config.nfc = true;
  } else if (pre == "gpt-4o" || pre == "llama4") {
    // o200k (gpt-oss, Llama 4): merges apply as they are, no BOS by default.
    config.pre = PreTokenizerKind::kGpt4o;
  } else {
    // llama.cpp's "default" and the other models' regexes differ from
    // these; guessing would tokenize plausibly but wrongly.
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.pre '", Sv(pre),
                     "' is not supported (smollm, gpt2, llama-bpe, llama3, "
                     "llama-v3, qwen2, gpt-4o, llama4 are)"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string_view> tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  ASSIGN_OR_RETURN(std::vector<std::string_view> merges,
                   gguf.GetStringArray("tokenizer.ggml.merges"));
  std::vector<int64_t> types;
  if (absl::StatusOr<std::vector<int64_t>> t =
          gguf.GetIntArray("tokenizer.ggml.token_type");
      t.ok()) {
    types = *std::move(t);
    if (types.size() != tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.token_type has ", types.size(),
                       " entries for ", tokens.size(), " tokens"));
    }
  } else {
    RETURN_IF_ERROR(OptionalKey(t.status()));
  }

  config.tokens.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    config.tokens.emplace_back(tokens[id]);
    const int64_t type = types.empty() ? 1 : types[id];
    if (type == 3 || type == 4) {  // CONTROL, USER_DEFINED.
      if (tokens[id].empty()) continue;
      config.added_tokens.push_back(
          {static_cast<int32_t>(id), std::string(tokens[id]), type == 3});
    }
  }
  config.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    // As llama.cpp: the separator is the first space after the first byte.
    const size_t space =
        merges[i].size() > 1 ? merges[i].find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", i, "] '", Sv(merges[i]),
                       "' is not two tokens separated by a space"));
    }
    config.merges.emplace_back(std::string(merges[i].substr(0, space)),
                               std::string(merges[i].substr(space + 1)));
  }
  ASSIGN_OR_RETURN(GgufTokenizerCommon common,
                   ReadGgufTokenizerCommon(gguf, tokens.size()));
  config.bos_id = common.bos_id;
  config.eos_id = common.eos_id;
  if (common.add_bos) config.add_bos = *common.add_bos;
  config.chat_template = std::move(common.chat_template);
  return config;
}

absl::Status OptionalKey(const absl::Status& status) {
  return absl::IsNotFound(status) ? absl::OkStatus() : status;
}

absl::StatusOr<GgufTokenizerCommon> ReadGgufTokenizerCommon(
    const GgufFile& gguf, size_t vocab) {
  GgufTokenizerCommon c;
  for (auto [key, out] :
       {std::pair{"tokenizer.ggml.bos_token_id", &c.bos_id},
        std::pair{"tokenizer.ggml.eos_token_id", &c.eos_id}}) {
    absl::StatusOr<int64_t> id = gguf.GetInt(key);
    if (!id.ok()) {
      RETURN_IF_ERROR(OptionalKey(id.status()));
      continue;
    }
    if (*id < 0 || *id >= static_cast<int64_t>(vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " ", *id, " is outside the vocabulary of ", vocab));
    }
    *out = static_cast<int32_t>(*id);
  }
  if (absl::StatusOr<bool> add_bos =
          gguf.GetBool("tokenizer.ggml.add_bos_token");
      add_bos.ok()) {
    c.add_bos = *add_bos;
  } else {
    RETURN_IF_ERROR(OptionalKey(add_bos.status()));
  }
  if (absl::StatusOr<std::string_view> t =
          gguf.GetString("tokenizer.chat_template");
      t.ok()) {
    c.chat_template = std::string(*t);
  } else {
    RETURN_IF_ERROR(OptionalKey(t.status()));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer path ", path, " does not exist"));
  }
  if (std::filesystem::is_directory(st)) return LoadTokenizerDirectory(path);
  return LoadGgufTokenizer(path);
}

}  // namespace shardlm
