// Element types of tensors, including block-quantized GGUF formats.
#ifndef SHARDLM_CORE_DTYPE_H_
#define SHARDLM_CORE_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace shardlm {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // 32 values: f16 scale d, 32 x int8. value = d * q.
  kQ4_0,  // 32 values: f16 d, 16 bytes of nibbles. value = d * (q - 8).
  kQ4_1,  // 32 values: f16 d, f16 m, 16 bytes. value = d * q + m.
  kI32,
  kI8,  // Raw bytes of the int8 KV cache (values and their f32 scales).
};

// Quantized types store `BlockElems` values in `BlockBytes` bytes; plain
// types have blocks of one element.
int64_t BlockElems(DType t);
int64_t BlockBytes(DType t);
// A C string so that it streams and StrCats everywhere.
const char* DTypeName(DType t);
bool IsQuantized(DType t);

// Bytes needed for `n` consecutive values. InvalidArgument when `n` is not a
// whole number of blocks or the size overflows.
absl::StatusOr<int64_t> BytesFor(DType t, int64_t n);

}  // namespace shardlm

#endif  // SHARDLM_CORE_DTYPE_H_
