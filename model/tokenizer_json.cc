// Hugging Face tokenizer.json: byte-level BPE -> BpeConfig, SentencePiece-style
// BPE (byte_fallback) -> SpmConfig.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "model/spm_tokenizer.h"
#include "model/tokenizer_loaders.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", Sv(what)));
}

// "type" of a JSON object, or "" when it has none.
std::string TypeOf(const Json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

bool BoolField(const Json& j, const char* key, bool default_value) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : default_value;
}

bool IsNullOrAbsent(const Json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null();
}

absl::StatusOr<int32_t> Id(const Json& j, std::string_view what) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0 ||
      j.get<int64_t>() > INT32_MAX) {
    return Invalid(absl::StrCat(
        Sv(what), " is not an id (",
        j.dump(-1, ' ', false, Json::error_handler_t::replace), ")"));
  }
  return static_cast<int32_t>(j.get<int64_t>());
}

// ByteLevel with add_prefix_space=false; use_regex as `use_regex` (true:
// it splits with the GPT-2 regex itself; false: a Split came before).
absl::Status CheckByteLevel(const Json& j, bool use_regex) {
  if (BoolField(j, "add_prefix_space", true)) {
    return absl::UnimplementedError(
        "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
  }
  if (BoolField(j, "use_regex", true) != use_regex) {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: ByteLevel use_regex=", use_regex ? "false" : "true",
        " is not supported here"));
  }
  return absl::OkStatus();
}

// The Split regexes we implement by hand (pretokenizer.cc), exactly as the
// models' tokenizer.json files write them.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4oPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Split(Regex(pattern), behavior Isolated, invert false) with one of the
// known patterns.
absl::StatusOr<PreTokenizerKind> ParseSplit(const Json& j) {
  auto pattern = j.find("pattern");
  const Json* regex = nullptr;
  if (pattern != j.end() && pattern->is_object()) {
    auto it = pattern->find("Regex");
    if (it != pattern->end() && it->is_string()) regex = &*it;
  }
  auto behavior = j.find("behavior");
  if (regex == nullptr || behavior == j.end() || *behavior != "Isolated" ||
      BoolField(j, "invert", false)) {
    return absl::UnimplementedError(
        "tokenizer.json: only Split(Regex, behavior Isolated, invert false) "
        "is supported");
  }
  const std::string& text = regex->get_ref<const std::string&>();
  if (text == kLlama3Pattern) return PreTokenizerKind::kLlama3;
  if (text == kQwen2Pattern) return PreTokenizerKind::kQwen2;
  if (text == kGpt4oPattern) return PreTokenizerKind::kGpt4o;
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: Split regex ", Json(text).dump(),
                   " is not one we implement (Llama 3's, Qwen2's or "
                   "o200k's)"));
}

// ByteLevel -> gpt2; Sequence[Digits(individual_digits), ByteLevel] ->
// smollm; Sequence[Split(Regex), ByteLevel(use_regex=false)] -> llama3,
// qwen2 or gpt-4o by the regex; anything else is not supported.
absl::StatusOr<PreTokenizerKind> ParsePreTokenizer(const Json& root) {
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || !it->is_object()) {
    return Invalid("pre_tokenizer is missing or not an object");
  }
  const Json& pre = *it;
  std::vector<const Json*> steps;
  if (TypeOf(pre) == "Sequence") {
    auto list = pre.find("pretokenizers");
    if (list == pre.end() || !list->is_array()) {
      return Invalid("pre_tokenizer Sequence has no pretokenizers array");
    }
    for (const Json& step : *list) steps.push_back(&step);
  } else {
    steps.push_back(&pre);
  }
  std::vector<std::string> types;
  for (const Json* step : steps) types.push_back(TypeOf(*step));
  if (types == std::vector<std::string>{"ByteLevel"}) {
    RETURN_IF_ERROR(CheckByteLevel(*steps[0], /*use_regex=*/true));
    return PreTokenizerKind::kGpt2;
  }
  if (types == std::vector<std::string>{"Digits", "ByteLevel"} &&
      BoolField(*steps[0], "individual_digits", false)) {
    RETURN_IF_ERROR(CheckByteLevel(*steps[1], /*use_regex=*/true));
    return PreTokenizerKind::kSmollm;
  }
  if (types == std::vector<std::string>{"Split", "ByteLevel"}) {
    ASSIGN_OR_RETURN(PreTokenizerKind kind, ParseSplit(*steps[0]));
    RETURN_IF_ERROR(CheckByteLevel(*steps[1], /*use_regex=*/false));
    return kind;
  }
  return absl::UnimplementedError(absl::StrCat(
      "tokenizer.json: pre_tokenizer [", absl::StrJoin(types, ", "),
      "] is not supported (ByteLevel; Digits(individual_digits) then "
      "ByteLevel; Split(Regex) then ByteLevel)"));
}

// null -> no normalization; NFC -> *nfc. Anything else is not supported.
absl::Status ParseNormalizer(const Json& root, bool* nfc) {
  if (IsNullOrAbsent(root, "normalizer")) return absl::OkStatus();
  const std::string type = TypeOf(root["normalizer"]);
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: normalizer ", type.empty() ? "?" : type,
                   " is not supported (none or NFC)"));
}

// The post-processor's effect on a single sequence: ByteLevel (offsets
// only) adds nothing; TemplateProcessing may put one special token in front
// (Llama 3's <|begin_of_text|>), which becomes add_bos and bos_id. Any other
// template would add tokens we do not, so it is refused.
absl::Status ParsePostProcessor(const Json& root, BpeConfig* config) {
  if (IsNullOrAbsent(root, "post_processor")) return absl::OkStatus();
  const Json& post = root["post_processor"];
  std::vector<const Json*> steps;
  if (TypeOf(post) == "Sequence") {
    auto list = post.find("processors");
    if (list == post.end() || !list->is_array()) {
      return Invalid("post_processor Sequence has no processors array");
    }
    for (const Json& step : *list) steps.push_back(&step);
  } else {
    steps.push_back(&post);
  }
  for (const Json* step : steps) {
    const std::string type = TypeOf(*step);
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing") {
      return absl::UnimplementedError(absl::StrCat(
          "tokenizer.json: post_processor ", type.empty() ? "?" : type,
          " is not supported (ByteLevel, TemplateProcessing)"));
    }
    auto single = step->find("single");
    const auto unsupported = absl::UnimplementedError(
        "tokenizer.json: a TemplateProcessing post_processor is supported "
        "only as [one SpecialToken, Sequence A] or [Sequence A]");
    if (single == step->end() || !single->is_array() || single->empty() ||
        single->size() > 2 || !single->back().is_object() ||
        !single->back().contains("Sequence")) {
      return unsupported;
    }
    if (single->size() == 1) continue;
    const Json& first = (*single)[0];
    if (!first.is_object() || !first.contains("SpecialToken") ||
        !first["SpecialToken"].is_object() ||
        !first["SpecialToken"].contains("id") ||
        !first["SpecialToken"]["id"].is_string()) {
      return unsupported;
    }
    const std::string name = first["SpecialToken"]["id"].get<std::string>();
    const Json* ids = nullptr;
    if (auto specials = step->find("special_tokens");
        specials != step->end() && specials->is_object() &&
        specials->contains(name) && (*specials)[name].is_object() &&
        (*specials)[name].contains("ids")) {
      ids = &(*specials)[name]["ids"];
    }
    if (ids == nullptr || !ids->is_array() || ids->size() != 1) {
      return Invalid(absl::StrCat("post_processor special token \"", name,
                                  "\" has no single id"));
    }
    ASSIGN_OR_RETURN(config->bos_id,
                     Id((*ids)[0], absl::StrCat("post_processor special "
                                                "token \"",
                                                name, "\" id")));
    config->add_bos = true;
  }
  return absl::OkStatus();
}

absl::Status ParseVocab(const Json& model, BpeConfig* config) {
  auto it = model.find("vocab");
  if (it == model.end() || !it->is_object()) {
    return Invalid("model.vocab is missing or not an object");
  }
  const size_t count = it->size();
  // Ids index a dense table; refuse tables mostly made of holes.
  const int64_t max_id = 2 * static_cast<int64_t>(count) + 1024;
  for (const auto& [token, value] : it->items()) {
    ASSIGN_OR_RETURN(int32_t id,
                     Id(value, absl::StrCat("model.vocab[\"", token, "\"]")));
    if (id >= max_id) {
      return Invalid(absl::StrCat("model.vocab[\"", token, "\"] id ", id,
                                  " is far beyond the ", count, " tokens"));
    }
    if (static_cast<size_t>(id) >= config->tokens.size()) {
      config->tokens.resize(id + 1);
    }
    if (!config->tokens[id].empty()) {
      return Invalid(absl::StrCat("model.vocab id ", id, " is used by both \"",
                                  config->tokens[id], "\" and \"", token,
                                  "\""));
    }
    if (token.empty()) return Invalid("model.vocab has an empty token");
    config->tokens[id] = token;
  }
  return absl::OkStatus();
}

absl::Status ParseMerges(const Json& model, BpeConfig* config) {
  auto it = model.find("merges");
  if (it == model.end() || !it->is_array()) {
    return Invalid("model.merges is missing or not an array");
  }
  config->merges.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    if (m.is_string()) {  // "a b" (tokenizers < 0.20).
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos ||
          s.find(' ', space + 1) != std::string::npos) {
        return Invalid(absl::StrCat("model.merges[", i, "] \"", s,
                                    "\" is not two tokens and one space"));
      }
      config->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {  // ["a", "b"].
      config->merges.emplace_back(m[0].get<std::string>(),
                                  m[1].get<std::string>());
    } else {
      return Invalid(absl::StrCat("model.merges[", i,
                                  "] is neither \"a b\" nor [\"a\", \"b\"]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, BpeConfig* config) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Invalid("added_tokens is not an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object())
      return Invalid(absl::StrCat(where, " is not an object"));
    auto id = t.find("id");
    auto content = t.find("content");
    if (id == t.end()) return Invalid(absl::StrCat(where, " has no id"));
    ASSIGN_OR_RETURN(int32_t token_id, Id(*id, absl::StrCat(where, ".id")));
    if (content == t.end() || !content->is_string() ||
        content->get<std::string>().empty()) {
      return Invalid(absl::StrCat(where, ".content is missing or empty"));
    }
    if (token_id >= 2 * static_cast<int64_t>(config->tokens.size()) + 1024) {
      return Invalid(absl::StrCat(where, ".id ", token_id,
                                  " is far beyond the vocabulary"));
    }
    // lstrip/rstrip/single_word are not implemented; byte-level BPE
    // tokenizers such as SmolLM's do not set them.
    config->added_tokens.push_back({token_id, content->get<std::string>(),
                                    BoolField(t, "special", false)});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// bos/eos from tokenizer_config.json ("bos_token": "<s>" or
// {"content": "<s>"}) or else config.json ("bos_token_id": 1 or [1, 2]).
std::optional<int32_t> FindToken(const BpeConfig& config,
                                 const std::string& name) {
  for (const AddedToken& added : config.added_tokens) {
    if (added.content == name) return added.id;
  }
  for (size_t id = 0; id < config.tokens.size(); ++id) {
    if (config.tokens[id] == name) return static_cast<int32_t>(id);
  }
  return std::nullopt;
}

void ReadSpecialIds(const std::string& dir, BpeConfig* config) {
  int64_t vocab_size = static_cast<int64_t>(config->tokens.size());
  for (const AddedToken& added : config->added_tokens) {
    vocab_size = std::max<int64_t>(vocab_size, added.id + 1);
  }
  if (absl::StatusOr<std::string> text =
          ReadFile(dir + "/tokenizer_config.json");
      text.ok()) {
    Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      // A string, or (newer files) a list of {"name", "template"} of
      // which "default" is the chat one.
      if (auto t = j.find("chat_template"); t != j.end()) {
        if (t->is_string()) config->chat_template = t->get<std::string>();
        if (t->is_array()) {
          for (const Json& named : *t) {
            if (named.is_object() && named.value("name", "") == "default" &&
                named.contains("template") && named["template"].is_string()) {
              config->chat_template = named["template"].get<std::string>();
            }
          }
        }
      }
      for (auto [key, out] : {std::pair{"bos_token", &config->bos_id},
                              std::pair{"eos_token", &config->eos_id}}) {
        if (out == &config->bos_id && config->add_bos) continue;
        auto it = j.find(key);
        if (it == j.end()) continue;
        const Json* v = &*it;
        if (v->is_object() && v->contains("content")) v = &(*v)["content"];
        if (!v->is_string()) continue;
        if (auto id = FindToken(*config, v->get<std::string>())) *out = *id;
      }
      return;
    }
  }
  if (absl::StatusOr<std::string> text = ReadFile(dir + "/config.json");
      text.ok()) {
    Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return;
    for (auto [key, out] : {std::pair{"bos_token_id", &config->bos_id},
                            std::pair{"eos_token_id", &config->eos_id}}) {
      if (out == &config->bos_id && config->add_bos) continue;
      auto it = j.find(key);
      if (it == j.end()) continue;
      const Json* v = &*it;
      if (v->is_array() && !v->empty()) v = &(*v)[0];
      if (v->is_number_integer() && v->get<int64_t>() >= 0 &&
          v->get<int64_t>() < vocab_size) {
        *out = static_cast<int32_t>(v->get<int64_t>());
      }
    }
  }
}

// The text of a tokenizer.json as a JSON object (parsed once per load).
absl::StatusOr<Json> ParseRoot(std::string_view text) {
  Json root = Json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("not valid JSON");
  if (!root.is_object()) return Invalid("top level is not an object");
  return root;
}

absl::StatusOr<BpeConfig> BpeConfigFromRoot(const Json& root) {
  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return Invalid("model is missing or not an object");
  }
  const std::string type = TypeOf(*model);
  if (!type.empty() && type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: model type ", type, " is not supported (BPE is)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model->find(key);
    if (it != model->end() && it->is_string() &&
        !it->get<std::string>().empty()) {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: BPE ", key, " is not supported"));
    }
  }
  if (!IsNullOrAbsent(root, "decoder") &&
      TypeOf(*root.find("decoder")) != "ByteLevel") {
    return absl::UnimplementedError(
        "tokenizer.json: decoder must be ByteLevel");
  }
  BpeConfig config;
  RETURN_IF_ERROR(ParseNormalizer(root, &config.nfc));
  ASSIGN_OR_RETURN(config.pre, ParsePreTokenizer(root));
  RETURN_IF_ERROR(ParseVocab(*model, &config));
  RETURN_IF_ERROR(ParseMerges(*model, &config));
  RETURN_IF_ERROR(ParseAddedTokens(root, &config));
  RETURN_IF_ERROR(ParsePostProcessor(root, &config));
  config.ignore_merges = BoolField(*model, "ignore_merges", false);
  return config;
}

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // "▁"

bool IsStringReplace(const Json& j, std::string_view from,
                     std::string_view to) {
  if (TypeOf(j) != "Replace" || !j.contains("pattern") ||
      !j["pattern"].is_object() || !j.contains("content")) {
    return false;
  }
  const Json& p = j["pattern"];
  return p.contains("String") && p["String"] == from && j["content"] == to;
}

// A Split of the pre-tokenizer at " " (Gemma 3's files: behavior
// MergedWithPrevious): after a normalizer that made every space "▁" it
// finds nothing to split at, whatever its behavior.
bool IsSpaceSplit(const Json& j) {
  if (TypeOf(j) != "Split" || !j.contains("pattern") ||
      !j["pattern"].is_object() || BoolField(j, "invert", false)) {
    return false;
  }
  const Json& p = j["pattern"];
  return p.contains("String") && p["String"] == " ";
}

// The dummy prefix of a SentencePiece-style tokenizer.json: the
// normalizer Sequence[Prepend("▁"), Replace(" ", "▁")] (Llama 2, Mistral
// v0.1; every segment between added tokens is normalized, so each gets
// one), Replace(" ", "▁") alone or as a one-step Sequence (Gemma: no
// dummy prefix; Gemma 3's files add the pre-tokenizer Split(" "), which
// the normalizer leaves nothing to do), or the pre-tokenizer
// Metaspace("▁", prepend_scheme, split false) (newer files; "first": only
// the start of the input; never in front of a space).
absl::Status ParseSpmPrefix(const Json& root, SpmConfig* config) {
  const bool normalizer = !IsNullOrAbsent(root, "normalizer");
  const bool pre = !IsNullOrAbsent(root, "pre_tokenizer");
  if (normalizer && (!pre || IsSpaceSplit(root["pre_tokenizer"]))) {
    const Json& n = root["normalizer"];
    const Json* steps = TypeOf(n) == "Sequence" && n.contains("normalizers") &&
                                n["normalizers"].is_array()
                            ? &n["normalizers"]
                            : nullptr;
    if (steps != nullptr && steps->size() == 2 &&
        TypeOf((*steps)[0]) == "Prepend" &&
        (*steps)[0].value("prepend", "") == kSpmSpace &&
        IsStringReplace((*steps)[1], " ", kSpmSpace)) {
      config->add_space_prefix = true;
      config->prefix_every_segment = true;
      return absl::OkStatus();
    }
    if (IsStringReplace(n, " ", kSpmSpace) ||
        (steps != nullptr && steps->size() == 1 &&
         IsStringReplace((*steps)[0], " ", kSpmSpace))) {
      config->add_space_prefix = false;
      return absl::OkStatus();
    }
  }
  if (pre && !normalizer) {
    const Json& m = root["pre_tokenizer"];
    if (TypeOf(m) == "Metaspace" && m.value("replacement", "") == kSpmSpace &&
        !BoolField(m, "split", true)) {
      std::string scheme = m.value("prepend_scheme", "");
      if (scheme.empty()) {
        scheme = BoolField(m, "add_prefix_space", true) ? "always" : "never";
      }
      if (scheme == "always" || scheme == "first" || scheme == "never") {
        config->add_space_prefix = scheme != "never";
        config->prefix_every_segment = scheme == "always";
        config->prefix_unless_space = true;
        return absl::OkStatus();
      }
    }
  }
  return absl::UnimplementedError(
      "tokenizer.json: a byte_fallback BPE needs the normalizer "
      "Sequence[Prepend(\"▁\"), Replace(\" \", \"▁\")] or Replace(\" \", "
      "\"▁\") (and no pre_tokenizer, or Split(\" \")), or the pre_tokenizer "
      "Metaspace(\"▁\", split false); this one has another");
}

// SentencePiece-style BPE: model BPE with byte_fallback.
bool IsSpmRoot(const Json& root) {
  auto model = root.find("model");
  return model != root.end() && model->is_object() &&
         BoolField(*model, "byte_fallback", false);
}

absl::StatusOr<SpmConfig> SpmConfigFromRoot(const Json& root) {
  auto model = root.find("model");
  if (model == root.end() || !model->is_object() || TypeOf(*model) != "BPE") {
    return Invalid("model is not a BPE object");
  }
  SpmConfig config;
  RETURN_IF_ERROR(ParseSpmPrefix(root, &config));
  // Vocabulary, merges, added tokens and BOS as for byte-level BPE; the
  // pieces are SentencePiece's own ("▁the", "<0x0A>"), not byte-level.
  BpeConfig parsed;
  RETURN_IF_ERROR(ParseVocab(*model, &parsed));
  RETURN_IF_ERROR(ParseMerges(*model, &parsed));
  RETURN_IF_ERROR(ParseAddedTokens(root, &parsed));
  RETURN_IF_ERROR(ParsePostProcessor(root, &parsed));
  const std::string unk = model->value("unk_token", "");
  config.pieces = std::move(parsed.tokens);
  config.types.assign(config.pieces.size(), SpmTokenType::kNormal);
  for (const AddedToken& added : parsed.added_tokens) {
    if (static_cast<size_t>(added.id) >= config.pieces.size()) {
      config.pieces.resize(added.id + 1);
      config.types.resize(added.id + 1, SpmTokenType::kUnused);
    }
    config.pieces[added.id] = added.content;
    config.types[added.id] = !added.special         ? SpmTokenType::kUserDefined
                             : added.content == unk ? SpmTokenType::kUnknown
                                                    : SpmTokenType::kControl;
  }
  for (size_t id = 0; id < config.pieces.size(); ++id) {
    const std::string& p = config.pieces[id];
    if (p.empty()) {
      return Invalid(absl::StrCat("model.vocab has no token ", id));
    }
    if (p.size() == 6 && p.starts_with("<0x") && p.ends_with(">") &&
        config.types[id] == SpmTokenType::kNormal) {
      config.types[id] = SpmTokenType::kByte;
    }
  }
  config.scores.assign(config.pieces.size(), 0.0f);
  config.merges = std::move(parsed.merges);
  config.add_bos = parsed.add_bos;
  config.bos_id = parsed.bos_id;
  return config;
}

}  // namespace

absl::StatusOr<BpeConfig> BpeConfigFromTokenizerJson(std::string_view text) {
  ASSIGN_OR_RETURN(const Json root, ParseRoot(text));
  return BpeConfigFromRoot(root);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateSpmWithHfSpecialIds(
    const std::string& dir, SpmConfig spm, bool keep_bos) {
  BpeConfig names;
  names.tokens = std::move(spm.pieces);  // Lent for the lookups.
  names.bos_id = spm.bos_id;
  names.eos_id = spm.eos_id;
  names.add_bos = keep_bos;  // ReadSpecialIds leaves bos_id alone then.
  ReadSpecialIds(dir, &names);
  spm.pieces = std::move(names.tokens);
  spm.bos_id = names.bos_id;
  spm.eos_id = names.eos_id;
  spm.chat_template = std::move(names.chat_template);
  ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> tok,
                   SpmTokenizer::Create(std::move(spm)));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerDirectory(
    const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (std::filesystem::exists(dir + "/tokenizer.model", ec)) {
      return LoadSpmModelDirectory(dir);
    }
    return absl::NotFoundError(
        absl::StrCat(dir, " has neither tokenizer.json nor tokenizer.model"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<Json> root = ParseRoot(text);
  if (!root.ok()) {
    return absl::Status(root.status().code(),
                        absl::StrCat(path, ": ", root.status().message()));
  }
  text.clear();
  text.shrink_to_fit();
  if (IsSpmRoot(*root)) {
    absl::StatusOr<SpmConfig> spm = SpmConfigFromRoot(*root);
    if (!spm.ok()) {
      return absl::Status(spm.status().code(),
                          absl::StrCat(path, ": ", spm.status().message()));
    }
    // bos/eos (and the chat template) from tokenizer_config.json or
    // config.json; a BOS the post-processor adds keeps its id. (The root
    // names no eos: spm's is -1.)
    const bool keep_bos = spm->add_bos;
    return CreateSpmWithHfSpecialIds(dir, *std::move(spm), keep_bos);
  }
  absl::StatusOr<BpeConfig> config = BpeConfigFromRoot(*root);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  ReadSpecialIds(dir, &*config);
  ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                   BpeTokenizer::Create(*std::move(config)));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace shardlm
