// The prefix cache's key insertions and evictions, kept for readers on
// other threads (the WatchState stream a router reads, DESIGN.md section
// 1), so that a reader's copy of the cached keys is exact, not guessed.
//
// Memory is bounded: the log keeps the set of live keys (at most the KV
// block count) and the last `max_events` changes. A reader that fell
// further behind gets the live set again (a reset) instead of the changes.
#ifndef SHARDLM_ENGINE_PREFIX_EVENTS_H_
#define SHARDLM_ENGINE_PREFIX_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace shardlm {

// What changed since a reader's cursor.
struct PrefixEventBatch {
  // True: `inserted` is the whole live set and replaces the reader's copy.
  // False: apply `changes` in order (a key may be inserted, evicted and
  // inserted again between two reads).
  bool reset = false;
  std::vector<uint64_t> inserted;  // Only with reset.
  // (key, true: inserted / false: evicted), oldest first. Empty with reset.
  std::vector<std::pair<uint64_t, bool>> changes;
  uint64_t cursor = 0;  // Pass to the next Since().
};

// Thread-safe.
class PrefixEventLog {
 public:
  explicit PrefixEventLog(size_t max_events = size_t{1} << 16);

  // The writer (the block manager, on the scheduler thread).
  void Inserted(uint64_t key);
  void Evicted(uint64_t key);
  void Cleared();

  // The changes after `cursor`; no cursor (a new reader) or one older than
  // the changes kept gives a reset.
  PrefixEventBatch Since(std::optional<uint64_t> cursor) const;
  // Changes recorded so far (the cursor a reader that is up to date has).
  uint64_t head() const;
  size_t live_keys() const;

 private:
  const size_t max_events_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<uint64_t> live_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, bool>> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t first_ ABSL_GUARDED_BY(mu_) = 0;  // Cursor of ring_.front().
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_PREFIX_EVENTS_H_
