// MaskWorker: the scheduler's mask thread. A step's constrained rows need
// their grammar's allowed-token masks only when the step samples, after
// its forward pass; the scheduler hands a plan's MaskRows to this thread
// before it submits the step, so the masks are computed while the step
// runs (issue #38: a constrained request does not stall the batch), and
// the sampler waits (LateMasks::Wait) only for what the step did not hide.
#ifndef SHARDLM_ENGINE_MASK_WORKER_H_
#define SHARDLM_ENGINE_MASK_WORKER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/batch_planner.h"
#include "step/late_masks.h"

namespace shardlm {

// The masks of `rows` on this thread, and the seconds the constraints
// spent computing them.
std::vector<RowMask> ComputeMasks(absl::Span<const MaskRow> rows, int64_t vocab,
                                  double* seconds);

class MaskWorker {
 public:
  explicit MaskWorker(int64_t vocab);
  // Finishes the jobs started.
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Starts computing the masks of `rows` (jobs run in the order started)
  // and returns what the step carries; null when `rows` is empty. The
  // constraints must stay alive and untouched until Wait() returns.
  std::shared_ptr<LateMasks> Start(std::vector<MaskRow> rows);

 private:
  struct Job {
    std::vector<MaskRow> rows;
    std::shared_ptr<LateMasks> masks;
  };
  void Loop();

  const int64_t vocab_;
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_MASK_WORKER_H_
