// CreateCudaExecutor and QueryCuda in a binary built without CUDA: every
// request for a GPU gets an error that says so.
#include "absl/strings/str_cat.h"
#include "backend/device.h"
#include "executor/cuda_executor.h"
#include "executor/in_process_executor.h"

namespace shardlm {

CudaAvailability QueryCuda() { return {.built_with_cuda = false}; }

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource&, const CudaExecutorOptions& options) {
  return absl::FailedPreconditionError(absl::StrCat(
      "CUDA device ", options.device,
      ": this shardlm was built without CUDA (SHARDLM_CUDA=OFF or no nvcc)"));
}

}  // namespace shardlm
