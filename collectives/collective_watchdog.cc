#include "collectives/collective_watchdog.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardlm {

CollectiveWatchdog::CollectiveWatchdog(WatchdogOptions options)
    : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();  // A running abort callback finishes first.
  std::list<WatchedWork> left;
  {
    absl::MutexLock lock(&mu_);
    left = TakePending();
  }
  Release(left);
}

absl::Status CollectiveWatchdog::Watch(WatchedWork work) {
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) {
      pending_.push_back(std::move(work));
      return absl::OkStatus();
    }
    failed = status_;
  }
  if (work.release) work.release();
  return failed;
}

absl::Status CollectiveWatchdog::Fail(absl::Status error) {
  std::list<WatchedWork> dropped;
  absl::Status recorded;
  {
    absl::MutexLock lock(&mu_);
    Record(error);
    dropped = TakePending();
    recorded = status_;
    ++settling_;
  }
  Release(dropped);
  absl::MutexLock lock(&mu_);
  --settling_;
  return recorded;
}

absl::Status CollectiveWatchdog::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status CollectiveWatchdog::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CollectiveWatchdog* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
        if (!w->status_.ok()) return w->settling_ == 0;
        return w->pending_.empty() && w->polling_ == 0;
      },
      this));
  return status_;
}

int64_t CollectiveWatchdog::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(pending_.size()) + polling_;
}

int64_t CollectiveWatchdog::rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

void CollectiveWatchdog::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval);
      if (stop_) return;
    }
    if (!Poll()) return;
  }
}

bool CollectiveWatchdog::Poll() {
  std::list<WatchedWork> batch;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return false;
    batch.swap(pending_);
    polling_ = static_cast<int64_t>(batch.size());
  }
  // The time first: a piece found not done after it was read was not done
  // at it either.
  const absl::Time now = options_.now();
  absl::Status failure;
  if (options_.async_error) failure = options_.async_error();
  std::list<WatchedWork> finished;
  for (auto it = batch.begin(); failure.ok() && it != batch.end();) {
    const absl::StatusOr<bool> done = it->done();
    if (!done.ok()) {
      failure =
          absl::Status(done.status().code(),
                       absl::StrCat(it->what, ": ", done.status().message()));
    } else if (*done) {
      finished.splice(finished.end(), batch, it++);
      continue;
    } else if (now > it->deadline) {
      failure = absl::DeadlineExceededError(absl::StrCat(
          it->what, ": not done within ", absl::FormatDuration(it->timeout),
          " (the watchdog of ", options_.name, " aborted the group)"));
    }
    ++it;
  }
  Release(finished);

  bool abort_now = false;
  std::list<WatchedWork> dropped;
  absl::Status recorded;
  {
    absl::MutexLock lock(&mu_);
    // Pieces watched during this round go after the older ones.
    pending_.splice(pending_.begin(), batch);
    polling_ = 0;
    ++rounds_;
    if (!failure.ok()) abort_now = Record(failure);
    if (!status_.ok()) {
      dropped = TakePending();
      ++settling_;
    }
    recorded = status_;
  }
  if (recorded.ok()) return true;
  if (abort_now && options_.abort) options_.abort(recorded);
  Release(dropped);
  absl::MutexLock lock(&mu_);
  --settling_;
  return false;
}

bool CollectiveWatchdog::Record(const absl::Status& error) {
  if (!status_.ok() || error.ok()) return false;
  status_ = error;
  return true;
}

std::list<WatchedWork> CollectiveWatchdog::TakePending() {
  std::list<WatchedWork> taken;
  taken.swap(pending_);
  return taken;
}

void CollectiveWatchdog::Release(std::list<WatchedWork>& pieces) {
  for (WatchedWork& w : pieces) {
    if (w.release) w.release();
  }
  pieces.clear();
}

}  // namespace shardlm
