// AVX2 + FMA + F16C kernels, one template for every block format: a
// block's codes are unpacked to int8 (quant_unpack_avx2.h), each sub-block
// of them converted to f32 once for the step's rows of x and multiplied in
// by FMA, and the sub-block's scale applied to the row's partial sum:
//
//   dot = sum over sub-blocks s of scale_s * sum_j(code_j * x_j)
//         + min_s * sum_j(x_j)          (formats with mins; sums given)
//
// so the activations stay f32 (no int8 quantization of x) and the result
// is the dequantized weights' dot product up to f32 summation order. Two
// accumulators per row (even and odd sub-blocks) keep the FMA latency off
// the critical path at one row; up to 4 rows (16 ymm registers). Compiled
// with -mno-avx512f (kernels/CMakeLists.txt): in a -march=native build on
// an AVX-512 machine it is still the code an AVX2 CPU runs.
#include <immintrin.h>

#include <cmath>

#include "kernels/linear/quant_kernels.h"
#include "kernels/linear/quant_unpack_avx2.h"

namespace shardlm::quant_kernels {
namespace {

SHARDLM_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 codes (two halves of 16) as four vectors of 8 floats.
SHARDLM_AVX2 inline void ToFloats(__m128i lo, __m128i hi, __m256* w) {
  w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

// 32 weights' codes w times kRows rows of x (row r at x + r * in), scaled
// per sub-block: kSub 32: acc0[r] += scale[0] * sum(w x); kSub 16:
// acc0[r] += scale[0] * (first 16), acc1[r] += scale[1] * (last 16).
template <int kSub, int kRows>
SHARDLM_AVX2 inline void Dot32(const __m256* w, const float* scale,
                               const float* x, int64_t in, __m256* acc0,
                               __m256* acc1) {
  const __m256 s0 = _mm256_set1_ps(scale[0]);
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    const float* xr = x + r * in;
    __m256 sum = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
    sum = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), sum);
    if constexpr (kSub == 32) {
      sum = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), sum);
      sum = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), sum);
      acc0[r] = _mm256_fmadd_ps(s0, sum, acc0[r]);
    } else {
      acc0[r] = _mm256_fmadd_ps(s0, sum, acc0[r]);
      __m256 sum1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(xr + 16));
      sum1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), sum1);
      acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale[1]), sum1, acc1[r]);
    }
  }
}

template <typename F, int kRows>
SHARDLM_AVX2 void DotRows(const uint8_t* row, const float* x, int64_t in,
                          const float* xsum, int64_t blocks, float* dots) {
  constexpr int kSubs = F::kElems / F::kSub;
  float scale[kSubs], min[kSubs];
  __m256 even[kRows], odd[kRows];
  float offset[kRows];
  for (int r = 0; r < kRows; ++r) {
    even[r] = odd[r] = _mm256_setzero_ps();
    offset[r] = 0;
  }
  const int64_t subs_per_row = in / F::kSub;
  // The mins' terms, in sub-block order.
  const auto add_mins = [&](int64_t b) {
    if constexpr (F::kHasMin) {
      for (int r = 0; r < kRows; ++r) {
        const float* xs = xsum + r * subs_per_row + b * kSubs;
        for (int s = 0; s < kSubs; ++s) {
          offset[r] = std::fma(min[s], xs[s], offset[r]);  // Any kRows.
        }
      }
    }
  };
  __m256 w[4];
  __m128i lo, hi;
  if constexpr (F::kElems == 32) {
    // One sub-block per block: blocks alternate between the accumulators.
    const auto block = [&](int64_t b, const uint8_t* p, __m256* acc) {
      CodesAvx2<F>::Get(p, 0, &lo, &hi);
      ScalesAvx2<F>::Run(p, scale, min);
      ToFloats(lo, hi, w);
      Dot32<32, kRows>(w, scale, x + b * 32, in, acc, nullptr);
      add_mins(b);
    };
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2, row += 2 * F::kBytes) {
      block(b, row, even);
      block(b + 1, row + F::kBytes, odd);
    }
    if (b < blocks) block(b, row, even);
  } else {
    // Even and odd sub-blocks in their accumulators.
    for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
      ScalesAvx2<F>::Run(row, scale, min);
      const float* xb = x + b * F::kElems;
#pragma GCC unroll 8
      for (int i = 0; i < F::kElems / 32; ++i) {
        CodesAvx2<F>::Get(row, i, &lo, &hi);
        ToFloats(lo, hi, w);
        if constexpr (F::kSub == 32) {
          Dot32<32, kRows>(w, scale + i, xb + 32 * i, in,
                           i % 2 == 0 ? even : odd, nullptr);
        } else {
          Dot32<16, kRows>(w, scale + 2 * i, xb + 32 * i, in, even, odd);
        }
      }
      add_mins(b);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    dots[r] = HSum(_mm256_add_ps(even[r], odd[r])) + offset[r];
  }
}

// 8 int8 codes as f32.
SHARDLM_AVX2 inline __m256 Codes8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// scale * code + min in one rounding (std::fma in the portable decoder).
template <typename F>
SHARDLM_AVX2 void Dequant(const uint8_t* row, int64_t blocks, float* dst) {
  constexpr int kSubs = F::kElems / F::kSub;
  alignas(32) int8_t codes[F::kElems];
  float scale[kSubs], min[kSubs];
  for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
    UnpackAvx2<F>(row, codes, scale, min);
    for (int s = 0; s < kSubs; ++s) {
      const __m256 sc = _mm256_set1_ps(scale[s]);
      const __m256 mn = _mm256_set1_ps(min[s]);
      for (int k = 0; k < F::kSub; k += 8, dst += 8) {
        const __m256 c = Codes8(codes + s * F::kSub + k);
        _mm256_storeu_ps(dst, F::kHasMin ? _mm256_fmadd_ps(sc, c, mn)
                                         : _mm256_mul_ps(sc, c));
      }
    }
  }
}

// f32 weights: 8 lanes per row over the row's length (`blocks` is it), in
// two accumulators per row (alternate runs of 8), then the lanes' sum and
// the tail's, in order.
template <int kRows>
SHARDLM_AVX2 void F32Rows(const uint8_t* row, const float* x, int64_t in,
                          const float*, int64_t, float* dots) {
  const float* w = reinterpret_cast<const float*>(row);
  __m256 acc0[kRows], acc1[kRows];
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 16 <= in; j += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + j);
    const __m256 w1 = _mm256_loadu_ps(w + j + 8);
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * in + j), acc0[r]);
      acc1[r] =
          _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * in + j + 8), acc1[r]);
    }
  }
  const int64_t vec_end = j + (in - j) / 8 * 8;
  for (; j < vec_end; j += 8) {
    const __m256 wv = _mm256_loadu_ps(w + j);
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * in + j), acc0[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float tail = 0;
    for (int64_t e = j; e < in; ++e) tail += w[e] * x[r * in + e];
    dots[r] = HSum(_mm256_add_ps(acc0[r], acc1[r])) + tail;
  }
}

}  // namespace

#define SHARDLM_INT_DOT_TARGET SHARDLM_AVX2
#define SHARDLM_INT_DOT_VNNI 0
#define SHARDLM_INT_DOT_NS int_dots_avx2
#include "kernels/linear/quant_int_dots.inc"
#undef SHARDLM_INT_DOT_TARGET
#undef SHARDLM_INT_DOT_VNNI
#undef SHARDLM_INT_DOT_NS

Kernels Avx2(DType t) {
  Kernels k;
  if (t == DType::kF32) {
    SetRowDots<4>(k, []<int R>() -> RowDots { return F32Rows<R>; });
    return k;
  }
  quant::VisitFormat(t, [&]<typename F>() {
    SetRowDots<4>(k, []<int R>() -> RowDots { return DotRows<F, R>; });
    SetIntRowDots<4>(k, []<int R>() -> IntRowDots {
      return int_dots_avx2::IntDotRows<F, R>;
    });
    k.dequant = Dequant<F>;
    k.xsum_sub = F::kHasMin ? F::kSub : 0;
    k.int_xsum_sub = k.xsum_sub;
  });
  return k;
}

}  // namespace shardlm::quant_kernels
