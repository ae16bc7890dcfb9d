// CollectiveWatchdog: the deadline of work that a communicator has queued
// and returned from (an asynchronous NCCL collective, a CUDA graph replay
// holding collectives), enforced by a thread of its own.
//
// The owner hands over each piece of work with a name for errors (group,
// op, the peers waited for), a deadline and a `done` poll (for NCCL:
// cudaEventQuery on an event recorded after the enqueue). A background
// thread polls every `interval`: the group's `async_error` (for NCCL:
// ncclCommGetAsyncError) and every pending piece's `done`. The first piece
// past its deadline and not done, an async error, or a `done` that returns
// an error makes the watchdog fail: it records that status
// (DeadlineExceeded naming the piece, or the error), calls `abort` once
// (for NCCL: ncclCommAbort, which also ends the stuck kernels), releases
// every pending piece and polls no more. Later Watch calls return the
// recorded status. Nothing here knows about CUDA or NCCL.
//
// Thread-safe: Watch, Fail, status, Wait and pending may be called from any
// thread. The callbacks run on the watchdog's thread (`release` also on the
// thread of Watch after a failure, or of the destructor), never under the
// watchdog's lock, so they may take locks of the owner's (NcclCommunicator's
// abort takes its communicator's), but must not call back into the
// watchdog. The destructor stops and joins the thread: no callback runs
// after it returns, and pending pieces are released, not aborted.
#ifndef SHARDLM_COLLECTIVES_COLLECTIVE_WATCHDOG_H_
#define SHARDLM_COLLECTIVES_COLLECTIVE_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardlm {

// One piece of queued work.
struct WatchedWork {
  // For errors, e.g. "tp group of stage 0: AllReduce on rank 1 (device 1),
  // waiting for the other ranks of the group".
  std::string what;
  absl::Time deadline;     // On the watchdog's clock (CollectiveWatchdog::now).
  absl::Duration timeout;  // What the deadline allowed, for the message.
  // True once the work is complete, false while it runs; an error fails
  // the watchdog with that error.
  std::function<absl::StatusOr<bool>()> done;
  // Called once when the watchdog lets go of the piece (done, failed, or
  // destroyed), e.g. to return its event to a pool. Optional.
  std::function<void()> release;
};

struct WatchdogOptions {
  std::string name;                                 // The group, for errors.
  absl::Duration interval = absl::Milliseconds(1);  // Between poll rounds.
  // Polled once a round before the pieces; an error fails the watchdog
  // with it. Optional.
  std::function<absl::Status()> async_error;
  // Called once, on the watchdog's thread, with the recorded status when
  // the watchdog fails (not when the owner calls Fail). Optional.
  std::function<void(const absl::Status&)> abort;
  // The clock deadlines are read against; tests inject a manual one.
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

class CollectiveWatchdog {
 public:
  // Starts the polling thread.
  explicit CollectiveWatchdog(WatchdogOptions options);
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;
  ~CollectiveWatchdog();

  // Watches `work` until it is done or the watchdog fails. After a failure
  // it releases `work` at once and returns the recorded status.
  absl::Status Watch(WatchedWork work);

  // For an owner that found an error itself (and aborted, or is about to):
  // records `error` unless a status is recorded already, releases every
  // pending piece and stops polling. Does not call `abort`. Returns the
  // recorded status.
  absl::Status Fail(absl::Status error);

  // OK, or the recorded failure.
  absl::Status status() const;

  // Returns once every watched piece is done (OK), or the watchdog has
  // failed, its abort callback has returned and its pieces are released
  // (the recorded status).
  // Bounded by the pieces' deadlines on the watchdog's clock.
  absl::Status Wait();

  // Pieces watched and not yet released.
  int64_t pending() const;
  // Poll rounds completed since construction: lets a test that moves its
  // clock wait for the watchdog to have seen the new time.
  int64_t rounds() const;
  // The watchdog's clock.
  absl::Time now() const { return options_.now(); }

 private:
  void Loop();
  // One round: async error, then every piece. Returns false once failed.
  bool Poll();
  // Records `error` if none is; true when this call recorded it.
  bool Record(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes every pending piece out to release, outside the lock.
  std::list<WatchedWork> TakePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Release(std::list<WatchedWork>& pieces);

  const WatchdogOptions options_;
  mutable absl::Mutex mu_;
  std::list<WatchedWork> pending_ ABSL_GUARDED_BY(mu_);
  // Pieces the poller has taken out of pending_ for this round.
  int64_t polling_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Failure paths that have not yet aborted and released their pieces.
  int settling_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_COLLECTIVE_WATCHDOG_H_
