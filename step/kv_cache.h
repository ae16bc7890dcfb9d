// The KV cache's element types as flags and the API name them, for every
// part that configures a cache (front ends, executors, workers).
#ifndef SHARDLM_STEP_KV_CACHE_H_
#define SHARDLM_STEP_KV_CACHE_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace shardlm {

// f16 halves the bytes of f32 (so a budget holds twice the tokens) and
// keeps greedy tokens and logits close (README, "KV cache dtype").
inline constexpr DType kDefaultCpuKvDType = DType::kF16;
inline constexpr int32_t kDefaultBlockSize = 16;
inline constexpr double kDefaultGpuMemoryUtilization = 0.90;

// How a KV cache is sized and stored, per rank: the one set of options
// every part that configures a cache takes (engine, executors, the control
// plane's assignment, workers), with its defaults written once here (as
// TensorRT-LLM's KvCacheConfig and vLLM's CacheConfig).
struct KvCacheOptions {
  int32_t block_size = kDefaultBlockSize;  // Tokens per block.
  // The device tier per rank; 0: one full context on CPUs, what
  // gpu_memory_utilization leaves on GPUs.
  int64_t kv_cache_bytes = 0;
  // The host (CPU offload) tier per rank: preempted sequences swap there,
  // long ones spill there, evicted prefix blocks stay cached there.
  int64_t cpu_offload_bytes = 0;
  // Unset: the device's default (f16 on CPUs, bf16 on GPUs, whose kernels
  // take bf16 only).
  std::optional<DType> dtype;
  // On a GPU, the share of its memory this process may use; what weights
  // and activations leave becomes KV cache (unless kv_cache_bytes is set).
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  // Reuse the KV of full blocks shared with earlier requests.
  bool prefix_caching = true;
  // A CRC-32C of every block copied into the host tier, checked when it
  // is copied back; a mismatch recomputes the sequences instead of
  // producing tokens (CPU workers).
  bool checksum = false;

  // InvalidArgument naming the field (as its flag) when out of range.
  absl::Status Validate() const;
  // dtype, or the CPU default.
  DType DTypeOnCpu() const { return dtype.value_or(kDefaultCpuKvDType); }
};

// --kv-cache-dtype: "f32", "f16", "bf16" or "int8" (DType::kI8).
// InvalidArgument naming the choices for anything else.
absl::StatusOr<DType> ParseKvCacheDType(std::string_view name);
// The flag's spelling of `t` ("f16", ...).
const char* KvCacheDTypeName(DType t);

// How a cache of `dtype` stores values: bytes of one KV head's K (or V) in
// a block of `block_size` tokens (int8: the values, then one f32 scale per
// token).
int64_t KvHeadBlockBytes(DType dtype, int64_t block_size, int64_t head_dim);
// K and V bytes of one token of context over `layers` layers of `kv_heads`
// heads of `head_dim`.
int64_t KvBytesPerToken(int64_t layers, int64_t kv_heads, int64_t head_dim,
                        DType dtype);

}  // namespace shardlm

#endif  // SHARDLM_STEP_KV_CACHE_H_
