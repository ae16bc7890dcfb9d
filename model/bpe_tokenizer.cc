#include "model/bpe_tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/normalizer.h"

namespace shardlm {
namespace {

// GPT-2 bytes_to_unicode(): printable bytes keep their value as code point,
// the other 68 take U+0100, U+0101, ... in byte order.
struct ByteLevelTables {
  std::array<uint16_t, 256> byte_to_cp;
  std::array<int16_t, 324> cp_to_byte;  // -1: not the image of a byte.
  ByteLevelTables() {
    cp_to_byte.fill(-1);
    uint16_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? b : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    // Only code points below U+0800 occur in the byte-level alphabet.
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string ByteLevelEncode(std::string_view bytes) {
  const ByteLevelTables& t = Tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(t.byte_to_cp[b], &out);
  return out;
}

std::optional<std::string> ByteLevelDecode(std::string_view text) {
  const ByteLevelTables& t = Tables();
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cp = NextCodePoint(text, &pos);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(
    BpeConfig config) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  size_t vocab_size = config.tokens.size();
  for (const AddedToken& added : config.added_tokens) {
    if (added.id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "added token \"", added.content, "\" has negative id ", added.id));
    }
    vocab_size = std::max(vocab_size, static_cast<size_t>(added.id) + 1);
  }
  if (vocab_size > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("vocabulary too large");
  }
  tok->bytes_.resize(vocab_size);
  tok->special_.assign(vocab_size, false);
  tok->token_ids_.reserve(config.tokens.size());
  for (size_t id = 0; id < config.tokens.size(); ++id) {
    const std::string& token = config.tokens[id];
    if (token.empty()) continue;
    // Last duplicate wins, as in llama.cpp's token_to_id.
    tok->token_ids_[token] = static_cast<int32_t>(id);
    // A token outside the byte-level alphabet stands for its own UTF-8
    // bytes, as in the HF ByteLevel decoder.
    std::optional<std::string> bytes = ByteLevelDecode(token);
    tok->bytes_[id] = bytes.has_value() ? *std::move(bytes) : token;
  }
  const ByteLevelTables& t = Tables();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(t.byte_to_cp[b], &s);
    auto it = tok->token_ids_.find(s);
    tok->byte_ids_[b] = it == tok->token_ids_.end() ? -1 : it->second;
  }

  tok->merges_.reserve(config.merges.size());
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    const auto& [a, b] = config.merges[rank];
    auto ia = tok->token_ids_.find(a);
    auto ib = tok->token_ids_.find(b);
    auto im = tok->token_ids_.find(absl::StrCat(a, b));
    if (ia == tok->token_ids_.end() || ib == tok->token_ids_.end() ||
        im == tok->token_ids_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " (\"", a, "\" \"", b,
                       "\") uses a token missing from the vocabulary"));
    }
    // A repeated pair takes its last rank, as in HF BPE::from_merges.
    tok->merges_[PairKey(ia->second, ib->second)] = {static_cast<int32_t>(rank),
                                                     im->second};
  }
  tok->num_merges_ = config.merges.size();

  for (AddedToken& added : config.added_tokens) {
    if (added.content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token ", added.id, " has empty content"));
    }
    tok->bytes_[added.id] = added.content;
    if (added.special && !tok->special_[added.id]) {
      tok->special_[added.id] = true;
      ++tok->num_special_;
    }
    tok->added_ids_[added.content] = added.id;
    tok->added_.push_back(std::move(added));
  }
  std::vector<std::pair<std::string_view, int32_t>> contents;
  contents.reserve(tok->added_.size());
  for (size_t i = 0; i < tok->added_.size(); ++i) {
    contents.emplace_back(tok->added_[i].content, static_cast<int32_t>(i));
  }
  tok->added_trie_ = LiteralTrie(std::move(contents));

  for (int32_t id : {config.bos_id, config.eos_id}) {
    if (id < -1 || id >= static_cast<int64_t>(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bos/eos id ", id, " outside the vocabulary of ", vocab_size));
    }
  }
  tok->bos_id_ = config.bos_id;
  tok->eos_id_ = config.eos_id;
  tok->pre_ = config.pre;
  tok->ignore_merges_ = config.ignore_merges;
  tok->add_bos_ = config.add_bos;
  tok->nfc_ = config.nfc;
  tok->chat_template_ = std::move(config.chat_template);
  return tok;
}

struct BpeTokenizer::Scratch {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour.
    int32_t prev;
    int32_t next;  // -1 at the end.
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;  // Index of the left symbol (positions never move).
    int32_t left;
    int32_t right;
    int32_t merged;
    // Min-heap on (rank, pos): lowest rank first, leftmost among equals.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

void BpeTokenizer::EncodePiece(std::string_view piece, Scratch* scratch,
                               std::vector<int32_t>* ids) const {
  // A piece longer than kMaxMergedPieceBytes is merged in cuts of at most
  // that many bytes, each ending at a UTF-8 boundary (as llama.cpp bounds
  // its work on one word): the merge state costs ~40 bytes per byte of a
  // cut, not of a whole 1 MiB word. Tokens are those of the whole piece for
  // every piece up to the bound (tests/reference/check_tokenizer.py).
  while (piece.size() > kMaxMergedPieceBytes) {
    size_t cut = kMaxMergedPieceBytes;
    // Back off over continuation bytes (at most 3) to a code point's start.
    for (int k = 0;
         k < 3 && (static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80;
         ++k) {
      --cut;
    }
    EncodeMerged(piece.substr(0, cut), scratch, ids);
    piece.remove_prefix(cut);
  }
  EncodeMerged(piece, scratch, ids);
}

void BpeTokenizer::EncodeMerged(std::string_view piece, Scratch* scratch,
                                std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    auto it = token_ids_.find(ByteLevelEncode(piece));
    if (it != token_ids_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  auto& symbols = scratch->symbols;
  auto& heap = scratch->heap;
  symbols.clear();
  heap.clear();
  for (unsigned char b : piece) {
    // A byte missing from the vocabulary is dropped, as HF BPE does
    // without an unknown token.
    if (byte_ids_[b] < 0) continue;
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({byte_ids_[b], n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  }
  auto push_pair = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, symbols[pos].id, symbols[next].id,
                    it->second.id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
    push_pair(i);
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[c.pos];
    if (left.id != c.left || left.next < 0) continue;  // Stale.
    Scratch::Symbol& right = symbols[left.next];
    if (right.id != c.right) continue;  // Stale.
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    ids->push_back(symbols[i].id);
  }
}

void BpeTokenizer::EncodeOrdinary(std::string_view text,
                                  std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  Scratch scratch;
  std::string normalized;
  if (nfc_) {
    normalized = NormalizeNfc(text);
    text = normalized;
  }
  // Each piece is merged as the pre-tokenizer finds it: no list of pieces.
  ForEachPiece(text, pre_, [&](std::string_view piece) {
    EncodePiece(piece, &scratch, ids);
  });
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Added tokens: leftmost match, longest among those starting there.
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    if (!added_trie_.MayStartWith(text[i])) {
      ++i;
      continue;
    }
    const LiteralTrie::Match match = added_trie_.LongestPrefix(text.substr(i));
    if (match.value < 0) {
      ++i;
      continue;
    }
    EncodeOrdinary(text.substr(start, i - start), &ids);
    ids.push_back(added_[match.value].id);
    i += match.size;
    start = i;
  }
  EncodeOrdinary(text.substr(start), &ids);
  return ids;
}

std::string_view BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return bytes_[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_ids_.find(key); it != added_ids_.end()) {
    return it->second;
  }
  if (auto it = token_ids_.find(key); it != token_ids_.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::string BpeTokenizer::Summary() const {
  return absl::StrCat("byte-level BPE (", nfc_ ? "NFC, " : "",
                      PreTokenizerName(pre_), " pre-tokenizer): ", vocab_size(),
                      " tokens, ", num_merges_, " merges, ", num_special_,
                      " special", add_bos_ ? ", adds BOS" : "");
}

}  // namespace shardlm
