// The reference kernels: every format through its portable Unpack
// (core/quant_blocks.h), one row of x at a time, scalar f32.
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

Kernels Portable(DType t) {
  Kernels k;
  if (t == DType::kF32) {
    SetRowDots<8>(k, []<int R>() -> RowDots { return F32Rows<R>; });
    return k;
  }
  quant::VisitFormat(t, [&]<typename F>() {
    SetRowDots<8>(k, []<int R>() -> RowDots { return DotRows<F, R>; });
    k.dequant = quant::Decode<F>;
    k.xsum_sub = F::kHasMin ? F::kSub : 0;
  });
  return k;
}

}  // namespace shardlm::quant_kernels
