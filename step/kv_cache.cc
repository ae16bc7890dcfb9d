#include "step/kv_cache.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace shardlm {

absl::StatusOr<DType> ParseKvCacheDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) {
    if (name == KvCacheDTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("KV cache dtype '", std::string(name),
                   "': expected f32, f16, bf16 or int8"));
}

const char* KvCacheDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "int8";
    default:
      return DTypeName(t);
  }
}

absl::Status KvCacheOptions::Validate() const {
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size ", block_size, " is outside [1, 4096]"));
  }
  if (kv_cache_bytes < 0 || cpu_offload_bytes < 0) {
    return absl::InvalidArgumentError(
        "--kv-cache-bytes and --cpu-offload-bytes must be >= 0");
  }
  if (dtype.has_value() && !ParseKvCacheDType(KvCacheDTypeName(*dtype)).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype ", DTypeName(*dtype),
                     ": expected f32, f16, bf16 or int8"));
  }
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-utilization ",
                                                   gpu_memory_utilization,
                                                   " must be in (0, 1]"));
  }
  return absl::OkStatus();
}

int64_t KvHeadBlockBytes(DType dtype, int64_t block_size, int64_t head_dim) {
  return dtype == DType::kI8 ? (head_dim + 4) * block_size
                             : head_dim * block_size * BlockBytes(dtype);
}

int64_t KvBytesPerToken(int64_t layers, int64_t kv_heads, int64_t head_dim,
                        DType dtype) {
  return 2 * layers * kv_heads *
         KvHeadBlockBytes(dtype, /*block_size=*/1, head_dim);
}

}  // namespace shardlm
