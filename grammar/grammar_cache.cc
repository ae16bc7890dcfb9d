#include "grammar/grammar_cache.h"

#include "absl/strings/str_cat.h"
#include "grammar/json_schema.h"

namespace shardlm {

GrammarCache::GrammarCache(const Tokenizer* tokenizer, size_t capacity)
    : tokenizer_(tokenizer), capacity_(capacity) {}

std::shared_ptr<const VocabTrie> GrammarCache::Trie() {
  absl::MutexLock lock(&mu_);
  if (trie_ == nullptr) trie_ = std::make_shared<VocabTrie>(*tokenizer_);
  return trie_;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    GrammarKind kind, std::string_view source) {
  std::string key = std::to_string(static_cast<int>(kind)) + ":";
  if (kind != GrammarKind::kJsonObject) key += source;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = grammars_.begin(); it != grammars_.end(); ++it) {
      if (it->first == key) {
        grammars_.splice(grammars_.begin(), grammars_, it);
        return it->second;
      }
    }
  }
  // Compiled outside the lock: a large schema does not stall others.
  absl::StatusOr<Grammar> grammar;
  switch (kind) {
    case GrammarKind::kJsonObject:
      grammar = JsonObjectGrammar();
      break;
    case GrammarKind::kJsonSchema:
      grammar = CompileJsonSchema(source);
      break;
    case GrammarKind::kGbnf:
      grammar = ParseGbnf(source);
      break;
    case GrammarKind::kToolCalls:
      grammar = CompileToolCalls(source);
      break;
  }
  if (!grammar.ok()) return grammar.status();
  auto compiled =
      std::make_shared<const CompiledGrammar>(*std::move(grammar), Trie());
  absl::MutexLock lock(&mu_);
  grammars_.emplace_front(key, compiled);
  if (grammars_.size() > capacity_) grammars_.pop_back();
  return compiled;
}

}  // namespace shardlm
