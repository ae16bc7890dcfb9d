// The graceful stop of `serve` and `launch` (docs/operations in README):
// on SIGTERM or SIGINT the server drains, and a second signal stops it at
// once.
#ifndef SHARDLM_LAUNCH_DRAIN_H_
#define SHARDLM_LAUNCH_DRAIN_H_

#include <signal.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "api/api_server.h"

namespace shardlm {

// Makes sigwait on the calling thread see every SIGINT and SIGTERM sent to
// the process. Threads that do not block them (OpenBLAS starts its pool
// before main can block anything) would otherwise take one, and its default
// action ends the process on the spot; a handler forwards it to this
// thread instead. Call from the one thread that waits for the signals.
void RouteStopSignalsHere();

// Called after sigwait took the first of `stop_signals` (`sig`): drains
// `server` for up to `timeout`, saying so on stderr with `who`, and returns
// the exit code: 0 when every request finished or the timeout cancelled
// the rest, 1 when a second signal cut the drain short.
int DrainOnSignal(ApiServer& server, int sig, const sigset_t& stop_signals,
                  absl::Duration timeout, const char* who);

// A worker's side of the stop (launch's workers, shardlm worker): signals
// usually reach every rank at once (mpirun forwards them; every pod gets
// its own). The coordinator drains first and then tells the workers to
// leave, so a worker waits for that, for a second signal, or for the
// drain's end plus a margin, and then notifies `stop` (its agent ends
// cleanly: its stream closes, so the coordinator sees the rank leave at
// once). Starts a detached thread that takes `stop_signals`; `stop` must
// live as long as the process.
void NotifyWorkerStopOnSignal(const sigset_t& stop_signals,
                              absl::Duration drain_timeout,
                              absl::Notification* stop);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_DRAIN_H_
