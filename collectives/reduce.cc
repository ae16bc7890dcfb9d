#include "collectives/reduce.h"

#include <algorithm>
#include <cstring>

namespace shardlm {
namespace {

template <typename T>
void Reduce(const void* gathered, int size, int64_t numel, ReduceOp op,
            void* out_raw) {
  T* out = static_cast<T*>(out_raw);
  const T* in = static_cast<const T*>(gathered);
  std::memmove(out, in, numel * sizeof(T));
  for (int r = 1; r < size; ++r) {
    const T* x = in + r * numel;
    if (op == ReduceOp::kSum) {
      for (int64_t i = 0; i < numel; ++i) out[i] += x[i];
    } else {
      for (int64_t i = 0; i < numel; ++i) out[i] = std::max(out[i], x[i]);
    }
  }
}

}  // namespace

void ReduceInRankOrder(const void* gathered, int size, DType dtype,
                       int64_t numel, ReduceOp op, void* out) {
  if (dtype == DType::kF32) {
    Reduce<float>(gathered, size, numel, op, out);
  } else {
    Reduce<int32_t>(gathered, size, numel, op, out);
  }
}

}  // namespace shardlm
