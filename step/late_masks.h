// Structured-output masks that arrive after their step was submitted: the
// coordinator computes the allowed-token masks of a step's constrained
// rows on its mask thread while the step's forward pass runs, and the
// sampler waits for them only when it samples (issue #38: a constrained
// request does not stall the batch). In-process only: the control plane's
// codec writes a step's masks once they are there, so a plan on the wire
// always carries them whole.
#ifndef SHARDLM_STEP_LATE_MASKS_H_
#define SHARDLM_STEP_LATE_MASKS_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "step/step.h"

namespace shardlm {

// One constrained logit row's mask (SampleHistory::allowed's format).
struct RowMask {
  int32_t row = 0;
  std::vector<uint64_t> allowed;
};

class LateMasks {
 public:
  // Once, by the producer; wakes every Wait().
  void Set(std::vector<RowMask> masks, double compute_seconds);
  // Blocks until Set(); the masks stay valid as long as this object. The
  // time spent blocked is added to waited_seconds().
  const std::vector<RowMask>& Wait() const;
  // What computing the masks took, and what samplers spent waiting for
  // them (the part of it the step did not hide). Both after Wait().
  double compute_seconds() const;
  double waited_seconds() const;

 private:
  mutable absl::Mutex mu_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RowMask> masks_ ABSL_GUARDED_BY(mu_);
  double compute_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  mutable double waited_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

// The step's per-row sample histories (one per logit row, or empty when
// no row needs one) with its late masks in place, waiting for them: each
// constrained row's allowed mask, and its min_tokens stop-token mask
// dropped where the grammar allows nothing else (a complete structured
// output may only end: the grammar wins over min_tokens rather than leave
// no token to sample). `step.history` itself without late masks.
std::vector<SampleHistory> ResolvedHistory(const StepInput& step);

}  // namespace shardlm

#endif  // SHARDLM_STEP_LATE_MASKS_H_
