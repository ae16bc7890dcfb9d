#include "coordinator/step_executor.h"

#include <utility>

namespace shardlm {

// Out of line, and the value moved out of the StatusOr rather than the
// StatusOr itself: inlined into every executor's translation unit, gcc 12
// warned that the moved StatusOr "may be used uninitialized".
absl::Status StepExecutor::Submit(const StepInput& step) {
  submitted_.push_back(Forward(step));
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> StepExecutor::Collect() {
  if (submitted_.empty()) {
    return absl::FailedPreconditionError("Collect with no step in flight");
  }
  absl::StatusOr<StepOutput>& front = submitted_.front();
  if (!front.ok()) {
    absl::Status failed = front.status();
    submitted_.pop_front();
    return failed;
  }
  StepOutput out = *std::move(front);
  submitted_.pop_front();
  return out;
}

}  // namespace shardlm
