// When a CUDA runner's step runs as a CUDA graph, and the graphs it keeps:
// plain C++, so that the policy is tested without a GPU.
//
// Only pure decode steps are captured (one token per sequence, each a logit
// row in order): their shape repeats step after step. Prefill and mixed
// steps change their token count and tiles nearly every step, so a graph
// of one would be captured and instantiated (more work than launching its
// kernels) to be replayed rarely; they launch eagerly. A decode step of n
// sequences is padded to GraphBatchSize(n) with padding sequences (token 0
// at position 0 over block 0, writing no K/V: AttentionBatch::padding), so
// that a few dozen graphs serve every batch size; each graph is kept in a
// GraphCache under its step shape until the shape's buffers move.
#ifndef SHARDLM_WORKER_CUDA_GRAPHS_H_
#define SHARDLM_WORKER_CUDA_GRAPHS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <set>
#include <vector>

#include "absl/types/span.h"
#include "step/step.h"

namespace shardlm {

// Most sequences a decode graph takes (the step buffers' graph range).
inline constexpr int64_t kMaxGraphBatch = 256;

// The batch size a decode step of n sequences runs at as a graph: 1, 2, 4,
// 8, then the next multiple of 8 (35 sizes up to kMaxGraphBatch; at most 7
// padding rows from 8 on). 0 when n is outside [1, kMaxGraphBatch].
int64_t GraphBatchSize(int64_t n);

// The step buffers' rows (and tokens) that decode steps of up to `rows`
// sequences need: their graphs run at GraphBatchSize(rows).
inline int64_t GraphPaddedRows(int64_t rows) {
  const int64_t size = GraphBatchSize(rows);
  return size > rows ? size : rows;
}

// Whether `step` is a pure decode step: tokens, one per sequence in order
// (token_seq[i] == i), each a logit row in order (logit_rows[i] == i).
bool IsDecodeStep(const StepInput& step);

// A decode step's inputs padded to `size` sequences: the step's tokens,
// positions and tables first, then `padding` sequences of token 0 at
// position 0 over a table naming block 0 (read, never written).
struct PaddedDecode {
  std::vector<int32_t> tokens, positions, token_seq, logit_rows;
  std::vector<absl::Span<const int32_t>> block_tables;  // Views of the step's.
  int64_t padding = 0;
};
// Requires IsDecodeStep(step) and size >= its token count.
PaddedDecode PadDecodeStep(const StepInput& step, int64_t size);

// The captured graphs of one runner, by step shape (every kernel argument
// follows from the key: sizes, layout, buffer generations). At most
// `capacity` graphs; the least recently used is destroyed (through
// `destroy`, which must wait for a replay in flight) when another is
// inserted. A shape whose capture failed runs eagerly from then on; after
// `max_failures` such shapes, Disabled() says to stop capturing at all.
class GraphCache {
 public:
  using Key = std::vector<int64_t>;
  GraphCache(size_t capacity, int max_failures,
             std::function<void(void*)> destroy);
  ~GraphCache();  // Destroys every graph held.
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The graph captured for `key` (now the most recently used), or null.
  void* Find(const Key& key);
  // Takes `graph` (non-null) for `key`, which must not be held.
  void Insert(const Key& key, void* graph);
  // Destroys every graph (their buffers moved); failures are kept.
  void Clear();
  void MarkFailed(const Key& key);
  bool Failed(const Key& key) const { return failed_.count(key) > 0; }
  bool Disabled() const {
    return static_cast<int>(failed_.size()) >= max_failures_;
  }
  size_t size() const { return graphs_.size(); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    void* graph;
    std::list<Key>::iterator use;  // Into uses_.
  };
  size_t capacity_;
  int max_failures_;
  std::function<void(void*)> destroy_;
  std::map<Key, Entry> graphs_;
  std::list<Key> uses_;  // Most recently used first.
  std::set<Key> failed_;
  int64_t evictions_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_GRAPHS_H_
