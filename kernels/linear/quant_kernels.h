// The CPU kernels of LinearQuantized for one weight format on one ISA
// (internal to kernels/linear/). The driver (linear_quantized_cpu.cc) owns
// threads, prefetch and the split into row groups; a QuantKernels row owns
// the arithmetic on blocks. One file per ISA, each with a row per format:
// quant_kernels_portable.cc (the reference), quant_kernels_avx2.cc,
// quant_kernels_avx512.cc.
#ifndef SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_
#define SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
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

// The integer form (Precision::kFast): x is quantized per run of 32 values
// (QuantizeRowsQ8): row r's int8 values start at xq + r * in and its
// scales at xd + r * (in / 32). dots[r] = sum over runs of (weight scale x
// x scale) x the exact int32 dot product of the codes, plus the mins times
// xsum (the f32 x's sums, as RowDots reads them). Each row's sums are
// formed in the same order whatever kRows is.
using IntRowDots = void (*)(const uint8_t* row, const int8_t* xq,
                            const float* xd, int64_t in, const float* xsum,
                            int64_t blocks, float* dots);

// DType::kF32 has row dots too (no dequant, no xsum): `row` is the row's
// `in` floats and `blocks` is `in` (Linear's f32 path, linear_cpu.cc).
struct Kernels {
  // by[r - 1] takes r rows of x (one pass over the row of w for all of
  // them); null past max_group.
  RowDots by[8] = {};
  int max_group = 0;  // 4 or 8.
  DequantRow dequant = nullptr;
  // Sub-block of the x sums RowDots reads (the format's, when it has
  // mins); 0: it reads none.
  int64_t xsum_sub = 0;
  // int_by[r - 1]: the integer form for r rows; int_group 0 when the
  // format has none (f32 weights). int_xsum_sub: the sub-block of the x
  // sums it reads (the format's, when it has mins).
  IntRowDots int_by[8] = {};
  int int_group = 0;
  int64_t int_xsum_sub = 0;
};

// x [n, in] (in a multiple of 32) to int8 per run of 32 values: d =
// max |x| / 127, q = x / d rounded to nearest (ties to even); xq [n, in],
// xd [n, in / 32].
void QuantizeRowsQ8(const float* x, int64_t n, int64_t in, int8_t* xq,
                    float* xd);

// Sets k.by[r - 1] = make.template operator()<r>() for r = 1 .. kRows, and
// k.max_group = kRows: one instantiation of a kernel template per group.
template <int kRows, typename Make>
void SetRowDots(Kernels& k, Make make) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((k.by[I] = make.template operator()<I + 1>()), ...);
  }
  (std::make_integer_sequence<int, kRows>{});
  k.max_group = kRows;
}

// The same for the integer form: k.int_by and k.int_group.
template <int kRows, typename Make>
void SetIntRowDots(Kernels& k, Make make) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((k.int_by[I] = make.template operator()<I + 1>()), ...);
  }
  (std::make_integer_sequence<int, kRows>{});
  k.int_group = kRows;
}

// The kernels of weight format `t` on each ISA; max_group 0 when the ISA
// has none for it (the caller's CPU check comes first: calling the AVX
// ones on a CPU without them is the caller's error).
Kernels Portable(DType t);
Kernels Avx2(DType t);
Kernels Avx512(DType t);

// The kernels of `t` on the ISA kernels/cpu_isa.h chose; InvalidArgument
// when it has none for `t`.
absl::StatusOr<Kernels> ForActiveIsa(DType t);

// y = x w^T through `k`'s row dots: w is `out` rows of `row_bytes` bytes
// (`blocks` as RowDots takes it), x [n, in], y [n, out]. Each y[r, o] is
// what row r gets alone, whatever n (the batch-invariant path). At most
// kDecodeMaxRows rows read each row of w once for all of them; more run
// in tiles of w rows kept in cache across groups of x rows. Threads:
// ParallelFor shares out contiguous ranges of whole 16-row tiles of the
// output.
// With `q` (x quantized by QuantizeRowsQ8), through k's integer form.
struct QuantizedRows {
  const int8_t* q;
  const float* d;
};
void LinearByRowDots(const Kernels& k, const uint8_t* w, int64_t row_bytes,
                     int64_t blocks, const float* x, int64_t n, int64_t in,
                     int64_t out, float* y, bool accumulate,
                     const QuantizedRows* q = nullptr);

}  // namespace shardlm::quant_kernels

#endif  // SHARDLM_KERNELS_LINEAR_QUANT_KERNELS_H_
