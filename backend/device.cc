#include "backend/device.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardlm {

absl::StatusOr<CudaWeights> ParseCudaWeights(std::string_view flag) {
  if (flag == "bf16") return CudaWeights::kBf16;
  if (flag == "quantized") return CudaWeights::kQuantized;
  return absl::InvalidArgumentError(absl::StrCat(
      "--cuda-weights '", std::string(flag), "': want bf16 or quantized"));
}

const char* CudaWeightsName(CudaWeights w) {
  return w == CudaWeights::kQuantized ? "quantized" : "bf16";
}

absl::StatusOr<DeviceRequest> ParseDeviceFlag(std::string_view flag) {
  if (flag == "auto") return DeviceRequest{};
  if (flag == "cpu") {
    return DeviceRequest{.automatic = false, .kind = DeviceKind::kCpu};
  }
  if (flag == "cuda") {
    return DeviceRequest{.automatic = false, .kind = DeviceKind::kCuda};
  }
  int ordinal = -1;
  if (flag.substr(0, 5) == "cuda:" &&
      absl::SimpleAtoi(std::string(flag.substr(5)), &ordinal) && ordinal >= 0 &&
      flag.find_first_not_of("0123456789", 5) == std::string_view::npos) {
    return DeviceRequest{
        .automatic = false, .kind = DeviceKind::kCuda, .ordinal = ordinal};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be auto, cpu, cuda or cuda:N, got '",
                   std::string(flag), "'"));
}

absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceRequest& request,
                                          const CudaAvailability& cuda,
                                          std::string_view not_on_gpu) {
  const std::string none =
      !cuda.built_with_cuda
          ? "this shardlm was built without CUDA (SHARDLM_CUDA=OFF or no nvcc)"
          : cuda.why_none;
  if (request.automatic) {
    if (cuda.built_with_cuda && cuda.devices > 0 && !not_on_gpu.empty()) {
      return DeviceChoice{.kind = DeviceKind::kCpu,
                          .reason = absl::StrCat("device auto: the CPU, since ",
                                                 std::string(not_on_gpu),
                                                 " does not run on GPUs yet")};
    }
    if (cuda.built_with_cuda && cuda.devices > 0) {
      return DeviceChoice{
          .kind = DeviceKind::kCuda,
          .ordinal = 0,
          .reason = absl::StrCat("device auto: CUDA device 0 of ", cuda.devices,
                                 " (--device cpu to run on the CPU)")};
    }
    return DeviceChoice{
        .kind = DeviceKind::kCpu,
        .reason = absl::StrCat("device auto: the CPU, since ", none)};
  }
  if (request.kind == DeviceKind::kCpu) {
    return DeviceChoice{.kind = DeviceKind::kCpu, .reason = "device: the CPU"};
  }
  if (!cuda.built_with_cuda || cuda.devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", none));
  }
  if (request.ordinal >= cuda.devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device cuda:", request.ordinal, ": only ", cuda.devices,
                     " CUDA device(s) are visible"));
  }
  return DeviceChoice{
      .kind = DeviceKind::kCuda,
      .ordinal = request.ordinal,
      .reason = absl::StrCat("device: CUDA device ", request.ordinal, " of ",
                             cuda.devices)};
}

absl::StatusOr<std::vector<int>> AssignGpus(int ranks, int devices,
                                            bool allow_shared) {
  if (ranks < 1 || devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(ranks, " ranks on ", devices, " CUDA devices"));
  }
  if (ranks > devices && !allow_shared) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks 0 and ", devices, " would share CUDA device 0 (",
                     ranks, " ranks, ", devices,
                     " visible device(s)): one GPU per rank, or "
                     "--allow-shared-gpu (tests only)"));
  }
  std::vector<int> out(ranks);
  for (int r = 0; r < ranks; ++r) out[r] = r % devices;
  return out;
}

absl::StatusOr<GpuKvPlan> PlanGpuKv(const GpuMemory& memory, double utilization,
                                    int64_t block_bytes, int64_t max_blocks) {
  if (!(utilization > 0 && utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization must be in (0, 1], got ", utilization));
  }
  if (block_bytes <= 0 || max_blocks <= 0 || memory.total_bytes <= 0 ||
      memory.free_bytes < 0 || memory.free_bytes > memory.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU KV plan: block of ", block_bytes, " bytes, at most ",
                     max_blocks, " blocks, ", memory.free_bytes, " of ",
                     memory.total_bytes, " bytes free"));
  }
  const auto gib = [](int64_t b) {
    return absl::StrFormat("%.2f GiB", b / 1073741824.0);
  };
  const int64_t cap =
      static_cast<int64_t>(std::floor(utilization * memory.total_bytes));
  const int64_t in_use = memory.total_bytes - memory.free_bytes;
  const int64_t budget = cap - in_use - kGpuMemoryMargin;
  const std::string arithmetic = absl::StrCat(
      utilization, " x ", gib(memory.total_bytes), " - ", gib(in_use),
      " in use (weights, activations, other processes) - ",
      gib(kGpuMemoryMargin), " margin = ", gib(std::max<int64_t>(budget, 0)));
  if (budget < block_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no KV block fits on the GPU: ", arithmetic,
                     ", and a block takes ", block_bytes,
                     " bytes (raise --gpu-memory-utilization, or use a GPU "
                     "with more free memory)"));
  }
  GpuKvPlan plan;
  plan.blocks = std::min(budget / block_bytes, max_blocks);
  plan.budget_bytes = budget;
  plan.explanation = absl::StrCat(
      plan.blocks, " KV blocks (", gib(plan.blocks * block_bytes),
      "): ", arithmetic,
      plan.blocks == max_blocks ? absl::StrCat(", capped at ", max_blocks)
                                : "");
  return plan;
}

}  // namespace shardlm
