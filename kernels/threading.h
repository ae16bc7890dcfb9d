// Threads for CPU kernels: how many, and the loop that shares work among
// them (ParallelFor).
//
// The kernels used OpenMP teams. An OpenMP region ends at a barrier that
// waits for every thread of the team, so when another process took one of
// two cores, each of the ~200 regions of a decode step waited for a
// descheduled thread's scheduler quantum: --threads 2 decoded at a third
// of --threads 1's speed (issue 60). ParallelFor instead counts chunks of
// work, not threads: a worker that is not running claims nothing, the
// calling thread takes what is left, and only a chunk already claimed is
// waited for. Idle workers spin briefly, then yield, then sleep.
#ifndef SHARDLM_KERNELS_THREADING_H_
#define SHARDLM_KERNELS_THREADING_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"

namespace shardlm {

// Sets the threads this thread's kernels use (itself and n - 1 workers of
// its own); n <= 0 means DefaultCpuThreads(). Each thread that runs
// kernels has its own setting and workers, as OpenMP's teams had (the
// in-process executor runs one rank per thread).
void SetCpuThreads(int n);
// SetCpuThreads(n) unless this thread already did (cheap on every step).
void EnsureCpuThreads(int n);
// This thread's kernel threads.
int CpuThreads();

// The threads this process may use: the CPUs of its affinity mask, capped
// by its cgroup's CPU quota (cpu.max, or cfs_quota_us under cgroup v1)
// rounded up. `why`, when given, says which bound decided it.
int DefaultCpuThreads(std::string* why = nullptr);
// The same from given inputs (for tests): `affinity` CPUs, `cgroup_v2_max`
// the text of cpu.max ("max 100000", "150000 100000") or empty, and the
// v1 quota and period (quota <= 0: none).
int CpuThreadsFor(int affinity, const std::string& cgroup_v2_max,
                  int64_t v1_quota_us, int64_t v1_period_us,
                  std::string* why = nullptr);

// Runs body(begin, end) over contiguous ranges that together cover
// [0, n) once, on this thread and its workers, and returns when all have
// run. The ranges are `chunks` near-equal parts (0: four per thread;
// never more than n or 65535), claimed in order, one at a time. Runs
// body(0, n) here when n <= 1, with one thread, or when called from
// inside a ParallelFor's body.
void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> body,
                 int64_t chunks = 0);

// item(i) for every i in [0, n): through ParallelFor when `parallel`, else
// in order on this thread (for loops too small to share).
template <typename Item>
void ParallelForEach(int64_t n, bool parallel, const Item& item) {
  const auto range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) item(i);
  };
  if (parallel) {
    ParallelFor(n, range);
  } else {
    range(0, n);
  }
}

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_THREADING_H_
