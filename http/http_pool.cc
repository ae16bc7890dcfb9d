#include "http/http_pool.h"

#include <algorithm>
#include <system_error>
#include <utility>

namespace shardlm {

HttpPool::HttpPool(HttpPoolOptions options)
    : options_([&] {
        options.max_threads = std::max(1, options.max_threads);
        options.base_threads = std::max(0, options.base_threads);
        return options;
      }()) {}

bool HttpPool::Submit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (stop_) return false;
  ReapLocked();
  if (busy_ >= options_.max_threads) return false;
  jobs_.push_back(std::move(job));
  if (static_cast<size_t>(idle_) < jobs_.size()) {
    try {
      threads_.emplace_back();
      const ThreadList::iterator self = std::prev(threads_.end());
      *self = std::thread([this, self] { Loop(self); });
    } catch (const std::system_error&) {
      threads_.pop_back();
      jobs_.pop_back();
      return false;
    }
    // Idle from its start: a job submitted before it reaches its first
    // wait must not start yet another thread (the pool never exceeds max).
    ++idle_;
  }
  ++busy_;
  return true;
}

bool HttpPool::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return busy_ == 0;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void HttpPool::Join() {
  ThreadList threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    ReapLocked();
    threads.splice(threads.end(), threads_);
  }
  // A thread that trims itself from here on is joined here too: it only
  // records its exit (in exited_, no longer read) before it returns.
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

int HttpPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size() - exited_.size());
}

void HttpPool::ReapLocked() {
  // An exited thread recorded itself last thing under mu_; joining it
  // waits at most for its return.
  for (ThreadList::iterator it : exited_) {
    if (it->joinable()) it->join();
    threads_.erase(it);
  }
  exited_.clear();
}

void HttpPool::Loop(ThreadList::iterator self) {
  mu_.Lock();
  const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !jobs_.empty() || stop_;
  };
  while (true) {  // Counted idle (by Submit, then here after each job).
    const bool woken =
        mu_.AwaitWithTimeout(absl::Condition(&ready), options_.idle_timeout);
    if (!woken) {
      // Idle too long: above the base, this thread ends.
      const int alive = static_cast<int>(threads_.size() - exited_.size());
      if (alive > options_.base_threads) {
        --idle_;
        exited_.push_back(self);
        mu_.Unlock();
        return;
      }
      continue;
    }
    --idle_;
    if (jobs_.empty()) {  // Stopping.
      mu_.Unlock();
      return;
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    mu_.Unlock();
    job();
    job = nullptr;
    mu_.Lock();
    --busy_;
    ++idle_;
  }
}

}  // namespace shardlm
