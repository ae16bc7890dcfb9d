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
