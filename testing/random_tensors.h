// Helpers for kernel tests: seeded random tensors and comparisons.
#ifndef SHARDLM_TESTING_RANDOM_TENSORS_H_
#define SHARDLM_TESTING_RANDOM_TENSORS_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "core/max_abs_diff.h"
#include "core/quant_blocks.h"
#include "core/tensor.h"

namespace shardlm::testing_util {

inline Tensor RandomTensor(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = *Tensor::Host(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (float& v : t.f32()) v = dist(rng);
  return t;
}

// Random blocks of quantized type `t` for [rows, cols]
// (quant::FillRandomBlocks: every code possible, d in [0.01, 0.05)).
inline Tensor RandomQuantized(DType t, int64_t rows, int64_t cols,
                              uint32_t seed) {
  Tensor w = *Tensor::Host(t, {rows, cols});
  std::mt19937 rng(seed);
  quant::FillRandomBlocks(t, static_cast<uint8_t*>(w.raw()),
                          rows * cols / BlockElems(t), 0.05f, rng);
  return w;
}

inline Tensor ZerosLike(const Tensor& t) {
  return *Tensor::Host(DType::kF32, t.shape());
}

// NaN-proof (core/max_abs_diff.h).
inline double MaxAbsDiff(const float* a, const double* b, int64_t n) {
  return shardlm::MaxAbsDiff(a, b, static_cast<size_t>(n));
}

}  // namespace shardlm::testing_util

#endif  // SHARDLM_TESTING_RANDOM_TENSORS_H_
