// A budget of bytes for the requests in flight (issue 39): before a request
// pays for a stage (its HTTP body, its gRPC message, the JSON parse, the
// tokenization, the queued request), it takes a share of the budget sized
// to what that stage costs at most, and gives it back when the request ends.
// A share that does not fit waits briefly for others to end, then is
// refused (429 with Retry-After over HTTP, RESOURCE_EXHAUSTED over gRPC),
// so that hostile or simply too many large requests get an error instead of
// an allocation the server cannot afford.
//
// The budget counts what the server decided a stage may cost, not what the
// allocator reports; docs/limits.md states each stage's charge and why it
// bounds that stage.
//
// Thread-safe.
#ifndef SHARDLM_HTTP_MEMORY_BUDGET_H_
#define SHARDLM_HTTP_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardlm {

class MemoryBudget;

// Bytes taken from a MemoryBudget; given back on destruction (or Release).
// Move-only. An empty share (default-constructed) holds nothing.
class MemoryShare {
 public:
  MemoryShare() = default;
  ~MemoryShare() { Release(); }
  MemoryShare(MemoryShare&& other) noexcept { *this = std::move(other); }
  MemoryShare& operator=(MemoryShare&& other) noexcept;
  MemoryShare(const MemoryShare&) = delete;
  MemoryShare& operator=(const MemoryShare&) = delete;

  int64_t bytes() const { return bytes_; }
  // Gives the bytes back now. Idempotent.
  void Release();
  // Gives back what is above `bytes` (a stage that turned out cheaper than
  // its bound). Never grows the share.
  void ShrinkTo(int64_t bytes);

 private:
  friend class MemoryBudget;
  MemoryShare(MemoryBudget* budget, int64_t bytes)
      : budget_(budget), bytes_(bytes) {}
  MemoryBudget* budget_ = nullptr;  // Not owned; outlives the share.
  int64_t bytes_ = 0;
};

class MemoryBudget {
 public:
  // How long Take waits by default for room before refusing.
  static constexpr absl::Duration kDefaultWait = absl::Milliseconds(250);
  // The default size clamped to this range.
  static constexpr int64_t kMinDefaultBytes = int64_t{256} << 20;
  static constexpr int64_t kMaxDefaultBytes = int64_t{16} << 30;

  // `limit_bytes` > 0. `flag` names how to raise it in refusals (e.g.
  // "--request-memory-mb").
  explicit MemoryBudget(int64_t limit_bytes,
                        std::string flag = "--request-memory-mb");
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` for `what` (a stage, e.g. "the HTTP body"), waiting up to
  // `wait` for them to fit. ResourceExhausted saying what, how much and
  // which flag raises the limit when they do not fit by then (at once when
  // they exceed the whole limit). A share of 0 bytes always succeeds.
  absl::StatusOr<MemoryShare> Take(int64_t bytes, absl::string_view what,
                                   absl::Duration wait = kDefaultWait);

  int64_t limit() const { return limit_; }
  int64_t in_use() const;
  // The most in use at once since the start.
  int64_t peak() const;
  // Takes refused since the start.
  int64_t refused() const;

  // The default limit: one eighth of the memory this process may use (the
  // machine's, or its cgroup's limit when lower), clamped to
  // [kMinDefaultBytes, kMaxDefaultBytes].
  static int64_t DefaultLimitBytes();
  // What DefaultLimitBytes divides: min(physical memory, cgroup v2
  // memory.max or v1 memory.limit_in_bytes); 0 when unknown.
  static int64_t AvailableMemoryBytes();

 private:
  friend class MemoryShare;
  void Give(int64_t bytes);

  const int64_t limit_;
  const std::string flag_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_HTTP_MEMORY_BUDGET_H_
