// The KV cache's element types as flags and the API name them, for every
// part that configures a cache (front ends, executors, workers).
#ifndef SHARDLM_STEP_KV_CACHE_H_
#define SHARDLM_STEP_KV_CACHE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace shardlm {

// f16 halves the bytes of f32 (so a budget holds twice the tokens) and
// keeps greedy tokens and logits close (README, "KV cache dtype").
inline constexpr DType kDefaultCpuKvDType = DType::kF16;

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
