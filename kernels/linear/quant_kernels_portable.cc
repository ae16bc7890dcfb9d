// The reference kernels: every format through its portable Unpack
// (core/quant_blocks.h), one row of x at a time, scalar f32.
#include <algorithm>
#include <cmath>

#include "core/quant_blocks.h"
#include "kernels/linear/quant_kernels.h"

namespace shardlm::quant_kernels {
namespace {

// Per sub-block: scale * sum(code * x), plus min * sum(x) with a min.
template <typename F>
float RowDot(const uint8_t* row, const float* x, const float* xsum,
             int64_t blocks) {
  constexpr int kSubs = F::kElems / F::kSub;
  int8_t codes[F::kElems];
  float scale[kSubs], min[kSubs];
  float acc = 0;
  for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
    quant::Unpack<F>(row, codes, scale, min);
    for (int s = 0; s < kSubs; ++s, x += F::kSub) {
      float sum = 0;
      for (int j = 0; j < F::kSub; ++j) {
        sum += static_cast<float>(codes[s * F::kSub + j]) * x[j];
      }
      acc += scale[s] * sum;
      if constexpr (F::kHasMin) acc += min[s] * xsum[b * kSubs + s];
    }
  }
  return acc;
}

template <typename F, int kRows>
void DotRows(const uint8_t* row, const float* x, int64_t in, const float* xsum,
             int64_t blocks, float* dots) {
  for (int r = 0; r < kRows; ++r) {
    // xsum is null for formats without mins: no offset may be applied to it.
    const float* xs = F::kHasMin ? xsum + r * (in / F::kSub) : nullptr;
    dots[r] = RowDot<F>(row, x + r * in, xs, blocks);
  }
}

// The integer form: per run of 32 values (16 for formats with sub-blocks
// of 16), the exact int32 sum of code x q, scaled by (weight scale x x
// scale); runs in order.
template <typename F, int kRows>
void IntDotRows(const uint8_t* row, const int8_t* xq, const float* xd,
                int64_t in, const float* xsum, int64_t blocks, float* dots) {
  constexpr int kSubs = F::kElems / F::kSub;
  int8_t codes[F::kElems];
  float scale[kSubs], min[kSubs];
  float acc[kRows] = {}, offset[kRows] = {};
  for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
    quant::Unpack<F>(row, codes, scale, min);
    for (int r = 0; r < kRows; ++r) {
      const int8_t* q = xq + r * in + b * F::kElems;
      const float* d = xd + r * (in / 32) + b * (F::kElems / 32);
      for (int s = 0; s < kSubs; ++s) {
        int32_t sum = 0;
        for (int j = 0; j < F::kSub; ++j) {
          sum += int32_t{codes[s * F::kSub + j]} * q[s * F::kSub + j];
        }
        // Explicit fmas: C++ lets GCC contract a * b + c per instantiation,
        // and a row's sums must not depend on kRows.
        const float sd = scale[s] * d[s * F::kSub / 32];
        acc[r] = std::fma(sd, static_cast<float>(sum), acc[r]);
        if constexpr (F::kHasMin) {
          offset[r] = std::fma(min[s], xsum[r * (in / F::kSub) + b * kSubs + s],
                               offset[r]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) dots[r] = acc[r] + offset[r];
}

// f32 weights: `blocks` is the row's length; one sum per row, in order.
template <int kRows>
void F32Rows(const uint8_t* row, const float* x, int64_t in, const float*,
             int64_t, float* dots) {
  const float* w = reinterpret_cast<const float*>(row);
  for (int r = 0; r < kRows; ++r) {
    const float* xr = x + r * in;
    float acc = 0;
    for (int64_t j = 0; j < in; ++j) acc += w[j] * xr[j];
    dots[r] = acc;
  }
}

}  // namespace

void QuantizeRowsQ8(const float* x, int64_t n, int64_t in, int8_t* xq,
                    float* xd) {
  for (int64_t run = 0; run < n * in / 32; ++run) {
    const float* v = x + run * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    xd[run] = d;
    for (int j = 0; j < 32; ++j) {
      xq[run * 32 + j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
    }
  }
}

Kernels Portable(DType t) {
  Kernels k;
  if (t == DType::kF32) {
    SetRowDots<8>(k, []<int R>() -> RowDots { return F32Rows<R>; });
    return k;
  }
  quant::VisitFormat(t, [&]<typename F>() {
    SetRowDots<8>(k, []<int R>() -> RowDots { return DotRows<F, R>; });
    SetIntRowDots<8>(k, []<int R>() -> IntRowDots { return IntDotRows<F, R>; });
    k.dequant = quant::Decode<F>;
    k.xsum_sub = F::kHasMin ? F::kSub : 0;
    k.int_xsum_sub = k.xsum_sub;
  });
  return k;
}

}  // namespace shardlm::quant_kernels
