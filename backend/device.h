// Where a model runs (--device) and how much of a GPU its KV cache takes
// (--gpu-memory-utilization): the decisions, as plain functions of what
// the machine reports, so that they are tested without a GPU.
#ifndef SHARDLM_BACKEND_DEVICE_H_
#define SHARDLM_BACKEND_DEVICE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace shardlm {

enum class DeviceKind { kCpu, kCuda };

// A parsed --device value: "auto", "cpu", "cuda" or "cuda:N".
struct DeviceRequest {
  bool automatic = true;  // "auto": CUDA when usable, else the CPU.
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;  // For cuda:N.
};

absl::StatusOr<DeviceRequest> ParseDeviceFlag(std::string_view flag);

// --cuda-weights: how a GPU holds GGUF matrices. kBf16 dequantizes every
// format to bf16 at upload (the default, the only form that has run on a
// GPU). kQuantized keeps Q8_0 and Q4_0 projection matrices in their blocks
// (kernels/linear/quant_device_layout.h: 1.0625 and 0.5625 bytes a weight
// against 2), read by a quantized GEMV at decode (up to 8 rows) and
// dequantized chunk by chunk for cuBLAS above; other formats, the
// embedding and experts stay bf16. Not run on a GPU yet.
enum class CudaWeights : uint8_t { kBf16, kQuantized };
absl::StatusOr<CudaWeights> ParseCudaWeights(std::string_view flag);
const char* CudaWeightsName(CudaWeights w);
inline constexpr char kCudaWeightsHelp[] =
    "how a GPU holds GGUF matrices: bf16 (dequantized at load) or quantized "
    "(Q8_0 and Q4_0 projections stay in their blocks: about 2x and 3.5x "
    "fewer bytes a decode step reads; other formats stay bf16; not yet run "
    "on a GPU)";

// What this process can use: whether the binary has the CUDA backend, and
// how many GPUs it sees (or why none).
struct CudaAvailability {
  bool built_with_cuda = false;
  int devices = 0;
  std::string why_none;  // When devices == 0.
};

// This binary's CudaAvailability (asks the CUDA runtime when built with it).
CudaAvailability QueryCuda();

struct DeviceChoice {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;
  std::string reason;  // One line for the log: what was chosen and why.
};

// Resolves a request against what is available. "auto" picks GPU 0 when a
// GPU is visible, the binary has CUDA and `not_on_gpu` is empty (else it
// names what of the configuration does not run on GPUs), else the CPU;
// the reason says why. An explicit "cuda" without CUDA, or a GPU ordinal
// out of range, is FailedPrecondition / InvalidArgument naming what is
// missing (an unsupported configuration is the engine's to refuse).
absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceRequest& request,
                                          const CudaAvailability& cuda,
                                          std::string_view not_on_gpu = "");

// The GPU of each of `ranks` ranks of this process: rank r takes device
// r % devices. Two ranks on one device is FailedPrecondition naming both,
// unless `allow_shared` (tests: NCCL refuses it, so their communicators
// stage through the host).
absl::StatusOr<std::vector<int>> AssignGpus(int ranks, int devices,
                                            bool allow_shared);

// KV cache sizing on a GPU once the weights and activation buffers are
// allocated: the KV pool gets `utilization` of the device's memory, minus
// everything already in use (by this process or others) and a margin for
// what is allocated later (cuBLAS workspaces, CUDA graphs).
struct GpuMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // Now, after weights and activations.
};

struct GpuKvPlan {
  int64_t blocks = 0;
  int64_t budget_bytes = 0;  // What the blocks may use.
  std::string explanation;   // The arithmetic, for the log.
};

inline constexpr int64_t kGpuMemoryMargin = int64_t{256} << 20;

// InvalidArgument when `utilization` is outside (0, 1]; ResourceExhausted,
// with the figures, when not one block fits. At most `max_blocks` blocks.
absl::StatusOr<GpuKvPlan> PlanGpuKv(const GpuMemory& memory, double utilization,
                                    int64_t block_bytes, int64_t max_blocks);

}  // namespace shardlm

#endif  // SHARDLM_BACKEND_DEVICE_H_
