// GrammarCache: compiled grammars by their source, so that requests with
// the same schema share one grammar and its mask cache, and the
// vocabulary's trie is built once per tokenizer.
#ifndef SHARDLM_GRAMMAR_GRAMMAR_CACHE_H_
#define SHARDLM_GRAMMAR_GRAMMAR_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grammar/token_mask.h"
#include "model/tokenizer.h"

namespace shardlm {

// kToolCalls: the source is CompileToolCalls' specification.
enum class GrammarKind { kJsonObject, kJsonSchema, kGbnf, kToolCalls };

// Thread-safe.
class GrammarCache {
 public:
  // `tokenizer` is not owned and must outlive the cache. At most
  // `capacity` grammars are kept (least recently used dropped; requests
  // holding one keep it alive).
  explicit GrammarCache(const Tokenizer* tokenizer, size_t capacity = 16);

  // The compiled grammar of `source` (ignored for kJsonObject);
  // InvalidArgument from the compiler for a source it refuses.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(
      GrammarKind kind, std::string_view source);

 private:
  std::shared_ptr<const VocabTrie> Trie();

  const Tokenizer* tokenizer_;
  const size_t capacity_;
  absl::Mutex mu_;
  std::shared_ptr<const VocabTrie> trie_ ABSL_GUARDED_BY(mu_);
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>>
      grammars_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardlm

#endif  // SHARDLM_GRAMMAR_GRAMMAR_CACHE_H_
