// The bounded thread pool behind the HTTP server: a thread per job up to a
// maximum, kept for the next job, and trimmed back to a base once idle, so
// that a burst of requests does not leave its threads behind for good
// (issue 39).
#ifndef SHARDLM_HTTP_HTTP_POOL_H_
#define SHARDLM_HTTP_HTTP_POOL_H_

#include <deque>
#include <functional>
#include <list>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardlm {

struct HttpPoolOptions {
  int max_threads = 1;  // Jobs running at once; Submit refuses beyond.
  // Threads kept however long they idle; one above this exits after
  // idle_timeout without a job.
  int base_threads = 4;
  absl::Duration idle_timeout = absl::Seconds(10);
};

// Thread-safe. Jobs never wait in a queue behind others: a job either gets
// a thread at once (an idle one, or a new one within max_threads) or is
// refused.
class HttpPool {
 public:
  explicit HttpPool(HttpPoolOptions options);
  ~HttpPool() { Join(); }
  HttpPool(const HttpPool&) = delete;
  HttpPool& operator=(const HttpPool&) = delete;

  // Runs `job` on a thread of the pool; false when max_threads jobs are
  // running, the pool is stopping, or the system refuses another thread.
  bool Submit(std::function<void()> job);
  // Waits until no job is queued or running; false at the deadline.
  bool WaitIdle(absl::Time deadline);
  // Lets the running jobs finish, then joins every thread. Idempotent.
  void Join();
  // Threads alive now (running, idle, or not yet trimmed).
  int threads() const;

 private:
  using ThreadList = std::list<std::thread>;
  void Loop(ThreadList::iterator self);
  // Joins the threads that trimmed themselves.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const HttpPoolOptions options_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // Queued or running.
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // Waiting for a job.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ThreadList threads_ ABSL_GUARDED_BY(mu_);  // Alive (or exiting).
  std::vector<ThreadList::iterator> exited_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardlm

#endif  // SHARDLM_HTTP_HTTP_POOL_H_
