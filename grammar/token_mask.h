// Token masks: which vocabulary tokens can extend a grammar's valid prefix,
// computed against the model's real vocabulary (a byte-level BPE token may
// span several grammar symbols, or end inside one).
//
// VocabTrie holds every token's bytes once per tokenizer, as a trie in
// preorder; a mask is a walk of the trie against the recognizer, pruning a
// subtree as soon as its prefix is a dead end. A recognizer state is a set
// of stacks and a token is allowed when some stack accepts it, so a state's
// mask is the union of its stacks' masks, and those are cached per stack by
// the compiled grammar (JSON revisits the same stacks all the time: every
// character of a string, every item of an array).
#ifndef SHARDLM_GRAMMAR_TOKEN_MASK_H_
#define SHARDLM_GRAMMAR_TOKEN_MASK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grammar/grammar.h"
#include "grammar/token_constraint.h"
#include "model/tokenizer.h"

namespace shardlm {

// Immutable, thread-safe.
class VocabTrie {
 public:
  // Every token of `tokenizer` but the special ones (control tokens are
  // never grammar text; stop tokens are allowed by the constraint itself).
  explicit VocabTrie(const Tokenizer& tokenizer);

  struct Node {
    uint32_t end = 0;  // One past the last node of its subtree.
    uint32_t tokens_begin = 0, tokens_end = 0;  // Into tokens().
    uint16_t depth = 0;
    uint8_t byte = 0;
  };
  // Node 0 is the root (the empty prefix); the rest in preorder.
  const std::vector<Node>& nodes() const { return nodes_; }
  // Token ids, grouped by the node their bytes end at.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::string& bytes(int32_t token) const { return bytes_[token]; }
  int32_t vocab() const { return static_cast<int32_t>(bytes_.size()); }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  std::vector<std::string> bytes_;  // Per id; empty for special tokens.
  int max_depth_ = 0;
};

using TokenMask = std::vector<uint64_t>;  // Bit t: token t.

// A grammar with its vocabulary and its mask cache, shared by every
// request that uses the same grammar. Thread-safe.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const VocabTrie> trie);

  const Grammar& grammar() const { return grammar_; }
  const VocabTrie& trie() const { return *trie_; }
  // ORs into `mask` ((vocab + 63) / 64 words) the tokens that `stack` can
  // take. Cached; at most kMaxCachedStacks stacks are kept.
  void OrStackMask(const Grammar::Stack& stack, TokenMask& mask) const;
  // The tokens some stack of `state` can take (stop tokens not included).
  void StateMask(const Grammar::State& state, TokenMask& mask) const;

  static constexpr size_t kMaxCachedStacks = 2048;

  int64_t cache_hits() const;
  int64_t cache_misses() const;

 private:
  // The walk, uncached.
  void ComputeStackMask(const Grammar::Stack& stack, TokenMask& mask) const;

  Grammar grammar_;
  std::shared_ptr<const VocabTrie> trie_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<Grammar::Stack, std::shared_ptr<const TokenMask>>
      cache_ ABSL_GUARDED_BY(mu_);
  mutable int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

// One request's constraint: the recognizer's state after the tokens
// generated so far.
class GrammarConstraint : public TokenConstraint {
 public:
  // `stop_tokens`: allowed whenever the output so far is complete.
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar,
                    std::vector<int32_t> stop_tokens);

  void Allowed(int64_t vocab, std::vector<uint64_t>& mask) override;
  absl::Status Accept(int32_t token) override;
  double mask_seconds() const override { return mask_seconds_; }

  bool complete() const { return Grammar::IsComplete(state_); }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> stop_tokens_;
  Grammar::State state_;
  double mask_seconds_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_GRAMMAR_TOKEN_MASK_H_
