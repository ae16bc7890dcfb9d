#include "grammar/token_mask.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardlm {

VocabTrie::VocabTrie(const Tokenizer& tokenizer) {
  const int32_t vocab = tokenizer.vocab_size();
  bytes_.resize(vocab);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    bytes_[id] = std::string(tokenizer.TokenBytes(id));
    if (!bytes_[id].empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  // In sorted order a string comes before its extensions, so appending
  // nodes along each string's path yields a preorder; a node's subtree ends
  // when it leaves the path.
  nodes_.push_back({});
  std::vector<uint32_t> path = {0};  // path[d]: the node at depth d.
  std::string_view prev;
  for (int32_t id : ids) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    while (common < s.size() && common < prev.size() &&
           s[common] == prev[common]) {
      ++common;
    }
    while (path.size() > common + 1) {
      nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      Node n;
      n.depth = static_cast<uint16_t>(d + 1);
      n.byte = static_cast<uint8_t>(s[d]);
      n.tokens_begin = n.tokens_end = static_cast<uint32_t>(tokens_.size());
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(n);
    }
    Node& at = nodes_[path.back()];
    if (at.tokens_end != tokens_.size()) {
      at.tokens_begin = static_cast<uint32_t>(tokens_.size());
    }
    tokens_.push_back(id);
    at.tokens_end = static_cast<uint32_t>(tokens_.size());
    max_depth_ = std::max<int>(max_depth_, static_cast<int>(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
    path.pop_back();
  }
}

CompiledGrammar::CompiledGrammar(Grammar grammar,
                                 std::shared_ptr<const VocabTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)) {}

void CompiledGrammar::ComputeStackMask(const Grammar::Stack& stack,
                                       TokenMask& mask) const {
  const std::vector<VocabTrie::Node>& nodes = trie_->nodes();
  const std::vector<int32_t>& tokens = trie_->tokens();
  // levels[d]: the state after the first d bytes of the current node's
  // prefix.
  std::vector<Grammar::State> levels(trie_->max_depth() + 1);
  levels[0] = {stack};
  for (uint32_t i = 1; i < nodes.size();) {
    const VocabTrie::Node& n = nodes[i];
    Grammar::State& here = levels[n.depth];
    here.clear();
    for (const Grammar::Stack& s : levels[n.depth - 1]) {
      grammar_.AdvanceStack(s, n.byte, here);
    }
    if (here.empty()) {
      i = n.end;  // No token under this prefix can be taken.
      continue;
    }
    if (here.size() > 1) Grammar::Normalize(here);
    for (uint32_t t = n.tokens_begin; t < n.tokens_end; ++t) {
      mask[tokens[t] >> 6] |= uint64_t{1} << (tokens[t] & 63);
    }
    ++i;
  }
}

void CompiledGrammar::OrStackMask(const Grammar::Stack& stack,
                                  TokenMask& mask) const {
  std::shared_ptr<const TokenMask> cached;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(stack); it != cache_.end()) {
      cached = it->second;
      ++hits_;
    } else {
      ++misses_;
    }
  }
  if (cached == nullptr) {
    auto computed = std::make_shared<TokenMask>(mask.size(), 0);
    ComputeStackMask(stack, *computed);
    cached = computed;
    absl::MutexLock lock(&mu_);
    // Bounded: when full, start over (simple, and JSON's working set of
    // stacks is far smaller than the bound).
    if (cache_.size() >= kMaxCachedStacks) cache_.clear();
    cache_.emplace(stack, cached);
  }
  const size_t n = std::min(mask.size(), cached->size());
  for (size_t w = 0; w < n; ++w) mask[w] |= (*cached)[w];
}

void CompiledGrammar::StateMask(const Grammar::State& state,
                                TokenMask& mask) const {
  for (const Grammar::Stack& s : state) {
    if (!s.empty()) OrStackMask(s, mask);
  }
}

int64_t CompiledGrammar::cache_hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t CompiledGrammar::cache_misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

GrammarConstraint::GrammarConstraint(
    std::shared_ptr<const CompiledGrammar> grammar,
    std::vector<int32_t> stop_tokens)
    : grammar_(std::move(grammar)),
      stop_tokens_(std::move(stop_tokens)),
      state_(grammar_->grammar().Start()) {}

void GrammarConstraint::Allowed(int64_t vocab, std::vector<uint64_t>& mask) {
  const absl::Time start = absl::Now();
  mask.assign((vocab + 63) / 64, 0);
  // Tokens the tokenizer has but the model does not are never allowed.
  TokenMask tokens((grammar_->trie().vocab() + 63) / 64, 0);
  grammar_->StateMask(state_, tokens);
  bool any = false;
  for (size_t w = 0; w < mask.size() && w < tokens.size(); ++w) {
    mask[w] = tokens[w];
    any |= tokens[w] != 0;
  }
  if (vocab % 64 != 0 && !mask.empty()) {
    mask.back() &= (uint64_t{1} << (vocab % 64)) - 1;
  }
  // Complete: the output may end. A dead end (no token fits, which a
  // grammar over the size limits can reach) ends it too rather than
  // sampling outside the grammar.
  if (Grammar::IsComplete(state_) || !any) {
    for (int32_t t : stop_tokens_) {
      if (t >= 0 && t < vocab) mask[t >> 6] |= uint64_t{1} << (t & 63);
    }
  }
  mask_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status GrammarConstraint::Accept(int32_t token) {
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) !=
      stop_tokens_.end()) {
    return absl::OkStatus();  // The end; the state no longer matters.
  }
  if (token < 0 || token >= grammar_->trie().vocab() ||
      grammar_->trie().bytes(token).empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("token ", token, " is not allowed by the grammar"));
  }
  Grammar::State next = state_;
  if (!grammar_->grammar().AdvanceBytes(next, grammar_->trie().bytes(token))) {
    return absl::FailedPreconditionError(
        absl::StrCat("token ", token, " does not extend the grammar's prefix"));
  }
  state_ = std::move(next);
  return absl::OkStatus();
}

}  // namespace shardlm
