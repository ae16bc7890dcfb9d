#include "step/late_masks.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace shardlm {

void LateMasks::Set(std::vector<RowMask> masks, double compute_seconds) {
  absl::MutexLock lock(&mu_);
  masks_ = std::move(masks);
  compute_seconds_ = compute_seconds;
  set_ = true;
}

const std::vector<RowMask>& LateMasks::Wait() const {
  const auto start = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  if (!set_) {
    mu_.Await(absl::Condition(&set_));
    waited_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  // Never changes once set.
  return masks_;
}

double LateMasks::compute_seconds() const {
  absl::MutexLock lock(&mu_);
  return compute_seconds_;
}

double LateMasks::waited_seconds() const {
  absl::MutexLock lock(&mu_);
  return waited_seconds_;
}

std::vector<SampleHistory> ResolvedHistory(const StepInput& step) {
  if (step.late_masks == nullptr) return step.history;
  std::vector<SampleHistory> history = step.history;
  history.resize(step.logit_rows.size());
  for (const RowMask& m : step.late_masks->Wait()) {
    SHARDLM_CHECK(m.row >= 0 && m.row < static_cast<int32_t>(history.size()),
                  "a late mask for a row the step does not have");
    SampleHistory& h = history[m.row];
    h.allowed = m.allowed;
    if (h.masked.empty() || h.allowed.empty()) continue;
    std::vector<uint64_t> rest = h.allowed;
    for (int32_t t : h.masked) {
      if (t >= 0 && (t >> 6) < static_cast<int32_t>(rest.size())) {
        rest[t >> 6] &= ~(uint64_t{1} << (t & 63));
      }
    }
    if (std::all_of(rest.begin(), rest.end(),
                    [](uint64_t w) { return w == 0; })) {
      h.masked.clear();
    }
  }
  if (std::all_of(history.begin(), history.end(),
                  [](const SampleHistory& h) { return h.empty(); })) {
    history.clear();
  }
  return history;
}

}  // namespace shardlm
