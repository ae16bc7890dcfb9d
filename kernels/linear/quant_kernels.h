// The CPU kernels of LinearQuantized for one weight format on one ISA
// (internal to kernels/linear/). The driver (linear_quantized_cpu.cc) owns
// threads, prefetch and the split into row groups; a QuantKernels row owns
// the arithmetic on blocks. One file per ISA, each with a row per format:
// quant_kernels_portable.cc (the reference), quant_kernels_avx2.cc,
// quant_kernels_avx512.cc.
#ifndef SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_
#define SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_

#include <cstdint>

#include "core/dtype.h"

namespace shardlm::quant_kernels {

// Dot products of one row of w (`blocks` blocks at `row`) with kRows rows
// of x: dots[r] = row . x_r, where row r of x starts at x + r * in, and,
// for formats with mins, xsum[r * (in / sub_block) + i] is the sum of row
// r's values in sub-block i (the mins multiply it). Each row's sums are
// formed in the same order whatever kRows is, so a row's dot product is
// the same alone or in a group.
using RowDots = void (*)(const uint8_t* row, const float* x, int64_t in,
                         const float* xsum, int64_t blocks, float* dots);

// `blocks` blocks at `row` to f32 (prefill tiles), the values the
// reference decoder (Traits(t).to_f32) gives up to the rounding of one
// multiply-add.
using DequantRow = void (*)(const uint8_t* row, int64_t blocks, float* dst);

struct Kernels {
  RowDots by[4] = {};  // by[k] takes 2^k rows of x; null past max_group.
  int max_group = 0;   // 1, 2, 4 or 8.
  DequantRow dequant = nullptr;
  // Sub-block of the x sums RowDots reads (the format's, when it has
  // mins); 0: it reads none.
  int64_t xsum_sub = 0;
};

// The kernels of weight format `t` on each ISA; max_group 0 when the ISA
// has none for it (the caller's CPU check comes first: calling the AVX
// ones on a CPU without them is the caller's error).
Kernels Portable(DType t);
Kernels Avx2(DType t);
Kernels Avx512(DType t);

}  // namespace shardlm::quant_kernels

#endif  // SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_
