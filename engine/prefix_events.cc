#include "engine/prefix_events.h"

#include <algorithm>

namespace shardlm {

PrefixEventLog::PrefixEventLog(size_t max_events)
    : max_events_(std::max<size_t>(1, max_events)) {}

void PrefixEventLog::Inserted(uint64_t key) {
  absl::MutexLock lock(&mu_);
  if (!live_.insert(key).second) return;
  ring_.push_back({key, true});
  if (ring_.size() > max_events_) {
    ring_.pop_front();
    ++first_;
  }
}

void PrefixEventLog::Evicted(uint64_t key) {
  absl::MutexLock lock(&mu_);
  if (live_.erase(key) == 0) return;
  ring_.push_back({key, false});
  if (ring_.size() > max_events_) {
    ring_.pop_front();
    ++first_;
  }
}

void PrefixEventLog::Cleared() {
  absl::MutexLock lock(&mu_);
  live_.clear();
  // Every reader's cursor is now older than the kept changes: each gets a
  // reset (to the empty set) on its next read.
  first_ += ring_.size() + 1;
  ring_.clear();
}

PrefixEventBatch PrefixEventLog::Since(std::optional<uint64_t> cursor) const {
  absl::MutexLock lock(&mu_);
  PrefixEventBatch b;
  const uint64_t head = first_ + ring_.size();
  b.cursor = head;
  if (!cursor.has_value() || *cursor < first_ || *cursor > head) {
    b.reset = true;
    b.inserted.assign(live_.begin(), live_.end());
    std::sort(b.inserted.begin(), b.inserted.end());
    return b;
  }
  b.changes.assign(ring_.begin() + static_cast<ptrdiff_t>(*cursor - first_),
                   ring_.end());
  return b;
}

uint64_t PrefixEventLog::head() const {
  absl::MutexLock lock(&mu_);
  return first_ + ring_.size();
}

size_t PrefixEventLog::live_keys() const {
  absl::MutexLock lock(&mu_);
  return live_.size();
}

}  // namespace shardlm
