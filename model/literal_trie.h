// The tokens a tokenizer matches literally in text (control, user-defined
// and added tokens such as "<start_of_turn>") as a byte trie: the longest
// one a text starts with costs one step per byte matched, however many
// tokens share its first bytes (Gemma 3 has ~6,300 starting with '<').
#ifndef SHARDLM_MODEL_LITERAL_TRIE_H_
#define SHARDLM_MODEL_LITERAL_TRIE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm {

// Immutable after construction; all methods are thread-safe.
class LiteralTrie {
 public:
  struct Match {
    int32_t value = -1;  // -1: no token matches.
    size_t size = 0;     // Bytes of text the token covers.
  };

  LiteralTrie() { root_.fill(-1); }
  // Non-empty texts and their values (>= 0); a text given more than once
  // keeps the value of its first entry. The views are read only here.
  explicit LiteralTrie(
      std::vector<std::pair<std::string_view, int32_t>> entries);

  // Whether some token starts with byte `b` (the quick test before
  // LongestPrefix for each position of a text).
  bool MayStartWith(char b) const {
    return root_[static_cast<unsigned char>(b)] >= 0;
  }
  // The longest token `text` starts with.
  Match LongestPrefix(std::string_view text) const;
  // Distinct texts.
  size_t size() const { return size_; }

 private:
  struct Node {
    int32_t value = -1;        // The token ending here; -1: none.
    uint32_t first_child = 0;  // Children: nodes_[first_child, + children).
    uint16_t children = 0;
  };
  std::array<int32_t, 256> root_;  // Node of each first byte; -1: none.
  std::vector<Node> nodes_;
  std::vector<uint8_t> labels_;  // [nodes_] the byte leading to each node;
                                 // siblings ascending.
  size_t size_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_LITERAL_TRIE_H_
