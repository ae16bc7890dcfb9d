#include "model/spm_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/tokenizer_loaders.h"

namespace shardlm {
namespace {

constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581 "▁".
constexpr int64_t kMaxPieceBytes = 1 << 16;

// The length of the UTF-8 sequence a lead byte starts (1 for stray bytes).
size_t Utf8Length(unsigned char lead) {
  if (lead >= 0xf0 && lead < 0xf8) return 4;
  if (lead >= 0xe0 && lead < 0xf0) return 3;
  if (lead >= 0xc0 && lead < 0xe0) return 2;
  return 1;
}

std::string ReplaceAll(std::string_view s, std::string_view from,
                       std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i).starts_with(from)) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<SpmConfig> SpmConfigFromGguf(const GgufFile& gguf) {
  SpmConfig c;
  ASSIGN_OR_RETURN(std::vector<std::string_view> tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  c.pieces.assign(tokens.begin(), tokens.end());
  const size_t n = c.pieces.size();
  c.scores.assign(n, 0.0f);
  if (const GgufValue* v = gguf.Find("tokenizer.ggml.scores"); v != nullptr) {
    if (v->type != GgufType::kArray || v->array.size() != n ||
        (v->element_type != GgufType::kFloat32 &&
         v->element_type != GgufType::kFloat64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.ggml.scores must be ", n, " floats, one per token"));
    }
    for (size_t i = 0; i < n; ++i) {
      c.scores[i] = static_cast<float>(std::get<double>(v->array[i]));
    }
  }
  c.types.assign(n, SpmTokenType::kNormal);
  if (absl::StatusOr<std::vector<int64_t>> types =
          gguf.GetIntArray("tokenizer.ggml.token_type");
      types.ok()) {
    if (types->size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.token_type has ", types->size(),
                       " entries for ", n, " tokens"));
    }
    for (size_t i = 0; i < n; ++i) {
      if ((*types)[i] < 1 || (*types)[i] > 6) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.token_type[", i, "] = ", (*types)[i],
                         " is not a token type (1 to 6)"));
      }
      c.types[i] = static_cast<SpmTokenType>((*types)[i]);
    }
  } else {
    RETURN_IF_ERROR(OptionalKey(types.status()));
  }
  ASSIGN_OR_RETURN(GgufTokenizerCommon common,
                   ReadGgufTokenizerCommon(gguf, n));
  c.bos_id = common.bos_id;
  c.eos_id = common.eos_id;
  if (common.add_bos) c.add_bos = *common.add_bos;
  c.chat_template = std::move(common.chat_template);
  if (absl::StatusOr<bool> v = gguf.GetBool("tokenizer.ggml.add_space_prefix");
      v.ok()) {
    c.add_space_prefix = *v;
  } else {
    RETURN_IF_ERROR(OptionalKey(v.status()));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::Create(
    SpmConfig config) {
  const size_t n = config.pieces.size();
  if (n == 0 || n > (size_t{1} << 22)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a SentencePiece vocabulary of ", n, " tokens"));
  }
  if (config.scores.size() != n || config.types.size() != n) {
    return absl::InvalidArgumentError("scores and types must match tokens");
  }
  for (int32_t id : {config.bos_id, config.eos_id}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bos/eos id ", id, " outside the vocabulary of ", n));
    }
  }
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer());
  t->byte_ids_.fill(-1);
  t->bytes_.resize(n);
  t->special_.assign(n, false);
  std::vector<std::pair<std::string_view, int32_t>> literals;
  for (size_t i = 0; i < n; ++i) {
    const std::string& piece = config.pieces[i];
    if (piece.empty() || static_cast<int64_t>(piece.size()) > kMaxPieceBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " has ", piece.size(), " bytes"));
    }
    const int32_t id = static_cast<int32_t>(i);
    t->piece_ids_[piece] = id;  // The last of duplicates, as llama.cpp.
    switch (config.types[i]) {
      case SpmTokenType::kByte: {
        unsigned int b = 0;
        char end = 0;
        if (piece.size() != 6 ||
            std::sscanf(piece.c_str(), "<0x%2X>%c", &b, &end) != 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("byte token ", i, " '", piece, "' is not <0xXX>"));
        }
        t->byte_ids_[b] = id;
        t->bytes_[i] = std::string(1, static_cast<char>(b));
        break;
      }
      case SpmTokenType::kControl:
      case SpmTokenType::kUnknown:
        t->special_[i] = true;
        t->bytes_[i] = piece;
        literals.emplace_back(piece, id);
        ++t->num_literal_;
        if (config.types[i] == SpmTokenType::kUnknown) t->unk_id_ = id;
        break;
      case SpmTokenType::kUserDefined:
        t->bytes_[i] = ReplaceAll(piece, kSpace, " ");
        literals.emplace_back(piece, id);
        ++t->num_literal_;
        break;
      default:
        t->bytes_[i] = ReplaceAll(piece, kSpace, " ");
    }
  }
  // Of pieces written alike, the lowest id matches.
  t->literals_ = LiteralTrie(std::move(literals));
  t->pieces_ = std::move(config.pieces);
  t->scores_ = std::move(config.scores);
  t->bos_id_ = config.bos_id;
  t->eos_id_ = config.eos_id;
  t->add_bos_ = config.add_bos;
  t->add_space_prefix_ = config.add_space_prefix;
  t->prefix_every_segment_ = config.prefix_every_segment;
  t->prefix_unless_space_ = config.prefix_unless_space;
  for (size_t r = 0; r < config.merges.size(); ++r) {
    const auto& [left, right] = config.merges[r];
    t->merge_ranks_.emplace(absl::StrCat(left, "\xff", right),
                            static_cast<int32_t>(r));
  }
  t->chat_template_ = std::move(config.chat_template);
  return t;
}

void SpmTokenizer::EncodeText(std::string_view raw, bool dummy_prefix,
                              std::vector<int32_t>* ids) const {
  if (prefix_unless_space_ && raw.starts_with(' ')) dummy_prefix = false;
  std::string text = dummy_prefix ? std::string(kSpace) : std::string();
  text += ReplaceAll(raw, " ", kSpace);
  if (text.empty()) return;
  // Symbols: UTF-8 characters in a linked list, merged in place.
  struct Symbol {
    size_t begin, size;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  for (size_t at = 0; at < text.size();) {
    const size_t len = std::min(
        Utf8Length(static_cast<unsigned char>(text[at])), text.size() - at);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({at, len, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    at += len;
  }
  struct Bigram {
    float score;
    int left, right;
    size_t size;
  };
  // Best score first; among equal scores the leftmost.
  const auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(
      worse);
  const auto try_pair = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view l(text.data() + symbols[left].begin,
                             symbols[left].size);
    const std::string_view r(text.data() + symbols[right].begin,
                             symbols[right].size);
    float score;
    if (merge_ranks_.empty()) {
      auto it = piece_ids_.find(absl::StrCat(Sv(l), Sv(r)));
      if (it == piece_ids_.end()) return;
      score = scores_[it->second];
    } else {
      auto it = merge_ranks_.find(absl::StrCat(Sv(l), "\xff", Sv(r)));
      if (it == merge_ranks_.end()) return;
      score = -static_cast<float>(it->second);
    }
    queue.push({score, left, right, l.size() + r.size()});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) {
    try_pair(i - 1, i);
  }
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Stale: one side merged since.
    if (left.size == 0 || right.size == 0 || left.size + right.size != b.size) {
      continue;
    }
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_pair(left.prev, b.left);
    try_pair(b.left, left.next);
  }
  for (int i = 0; i >= 0 && !symbols.empty(); i = symbols[i].next) {
    const std::string_view piece(text.data() + symbols[i].begin,
                                 symbols[i].size);
    if (auto it = piece_ids_.find(std::string(piece)); it != piece_ids_.end()) {
      ids->push_back(it->second);
      continue;
    }
    for (unsigned char byte : piece) {  // Byte fallback.
      const int32_t id = byte_ids_[byte];
      ids->push_back(id >= 0 ? id : unk_id_ >= 0 ? unk_id_ : 0);
    }
  }
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Literal tokens: leftmost match, longest among those starting there;
  // the text after each (and at the start) gets a dummy prefix.
  bool after_special = true;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    if (!literals_.MayStartWith(text[i])) {
      ++i;
      continue;
    }
    const LiteralTrie::Match match = literals_.LongestPrefix(text.substr(i));
    if (match.value < 0) {
      ++i;
      continue;
    }
    if (i > start) {
      EncodeText(text.substr(start, i - start),
                 add_space_prefix_ && after_special, &ids);
    }
    ids.push_back(match.value);
    after_special = prefix_every_segment_;
    i += match.size;
    start = i;
  }
  if (start < text.size()) {
    EncodeText(text.substr(start), add_space_prefix_ && after_special, &ids);
  }
  return ids;
}

std::string_view SpmTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return bytes_[id];
}

bool SpmTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::optional<int32_t> SpmTokenizer::TokenId(std::string_view token) const {
  auto it = piece_ids_.find(std::string(token));
  if (it == piece_ids_.end()) return std::nullopt;
  return it->second;
}

std::string SpmTokenizer::Summary() const {
  int64_t bytes = 0;
  for (int32_t id : byte_ids_) bytes += id >= 0;
  return absl::StrCat(
      "SentencePiece BPE (llama): ", vocab_size(), " tokens, ", bytes,
      " byte tokens, ", num_literal_, " matched literally",
      add_space_prefix_ ? ", dummy prefix" : "", add_bos_ ? ", adds BOS" : "");
}

}  // namespace shardlm
