// CUDA errors as absl::Status, for the CUDA libraries' own .cc/.cu files
// (includes the CUDA runtime header; keep it out of public headers).
#ifndef SHARDLM_BACKEND_CUDA_STATUS_H_
#define SHARDLM_BACKEND_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"

namespace shardlm {

// OK for cudaSuccess; otherwise ResourceExhausted for out-of-memory,
// FailedPrecondition for a missing device or driver, Internal for the
// rest, each naming `what` and CUDA's error string.
inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string msg = std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace shardlm

// Returns the Status of a CUDA runtime call from the enclosing function
// when it fails.
#define RETURN_IF_CUDA_ERROR(call) \
  RETURN_IF_ERROR(::shardlm::CudaStatus((call), #call))

#endif  // SHARDLM_BACKEND_CUDA_STATUS_H_
