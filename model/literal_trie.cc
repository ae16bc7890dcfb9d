#include "model/literal_trie.h"

#include <algorithm>

namespace shardlm {

LiteralTrie::LiteralTrie(
    std::vector<std::pair<std::string_view, int32_t>> entries) {
  root_.fill(-1);
  // Sorted by unsigned bytes (char_traits<char>), equal texts in the order
  // given: each node's texts are then one run, the text ending at the node
  // (if any) first, its children's runs next in byte order.
  std::stable_sort(
      entries.begin(), entries.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  struct Work {
    int32_t node;       // -1: the root.
    size_t begin, end;  // The run of entries below the node.
    size_t depth;       // Their common prefix's length.
  };
  std::vector<Work> stack = {{-1, 0, entries.size(), 0}};
  while (!stack.empty()) {
    const Work w = stack.back();
    stack.pop_back();
    size_t i = w.begin;
    while (w.node < 0 && i < w.end && entries[i].first.empty()) ++i;
    if (w.node >= 0 && entries[i].first.size() == w.depth) {
      nodes_[w.node].value = entries[i].second;
      ++size_;
      while (i < w.end && entries[i].first.size() == w.depth) ++i;
    }
    const uint32_t first = static_cast<uint32_t>(nodes_.size());
    uint16_t children = 0;
    while (i < w.end) {
      const char byte = entries[i].first[w.depth];
      size_t j = i + 1;
      while (j < w.end && entries[j].first[w.depth] == byte) ++j;
      const int32_t child = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      labels_.push_back(static_cast<uint8_t>(byte));
      if (w.node < 0) root_[static_cast<unsigned char>(byte)] = child;
      stack.push_back({child, i, j, w.depth + 1});
      ++children;
      i = j;
    }
    if (w.node >= 0) {
      nodes_[w.node].first_child = first;
      nodes_[w.node].children = children;
    }
  }
  nodes_.shrink_to_fit();
  labels_.shrink_to_fit();
}

LiteralTrie::Match LiteralTrie::LongestPrefix(std::string_view text) const {
  Match best;
  if (text.empty()) return best;
  int32_t node = root_[static_cast<unsigned char>(text[0])];
  for (size_t i = 1; node >= 0; ++i) {
    const Node& n = nodes_[node];
    if (n.value >= 0) best = {n.value, i};
    if (i == text.size() || n.children == 0) break;
    const uint8_t* begin = labels_.data() + n.first_child;
    const uint8_t* end = begin + n.children;
    const uint8_t byte = static_cast<uint8_t>(text[i]);
    const uint8_t* it = std::lower_bound(begin, end, byte);
    if (it == end || *it != byte) break;
    node = static_cast<int32_t>(n.first_child + (it - begin));
  }
  return best;
}

}  // namespace shardlm
