#include "launch/drain.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

namespace shardlm {
namespace {

std::atomic<pid_t> waiter{0};

// Async-signal-safe: a thread-directed copy of the signal for the waiter,
// which blocks it outside sigwait.
void Forward(int sig) {
  const pid_t tid = waiter.load();
  if (tid != 0) syscall(SYS_tgkill, getpid(), tid, sig);
}

}  // namespace

void RouteStopSignalsHere() {
  waiter.store(static_cast<pid_t>(syscall(SYS_gettid)));
  struct sigaction action = {};
  action.sa_handler = Forward;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int DrainOnSignal(ApiServer& server, int sig, const sigset_t& stop_signals,
                  absl::Duration timeout, const char* who) {
  std::fprintf(stderr,
               "[shardlm] %s: draining (up to %s; new requests are refused; "
               "a second signal stops at once)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM",
               absl::FormatDuration(timeout).c_str());
  // Polled in sigtimedwait, which also paces the loop.
  bool second = false;
  const bool drained = server.Drain(timeout, [&] {
    const timespec pace = {0, 50'000'000};
    second = second || sigtimedwait(&stop_signals, nullptr, &pace) > 0;
    return second;
  });
  if (drained) {
    std::fprintf(stderr, "[shardlm] %s: drained; shutting down\n", who);
    return 0;
  }
  std::fprintf(stderr, "[shardlm] %s: %s; the requests left were cancelled\n",
               who, second ? "second signal" : "drain timeout");
  return second ? 1 : 0;
}

void NotifyWorkerStopOnSignal(const sigset_t& stop_signals,
                              absl::Duration drain_timeout,
                              absl::Notification* stop) {
  std::thread([stop, signals = stop_signals, drain_timeout] {
    int sig = 0;
    RouteStopSignalsHere();
    sigwait(&signals, &sig);
    const timespec wait = absl::ToTimespec(drain_timeout + absl::Seconds(5));
    sigtimedwait(&signals, nullptr, &wait);
    if (!stop->HasBeenNotified()) stop->Notify();
  }).detach();
}

}  // namespace shardlm
