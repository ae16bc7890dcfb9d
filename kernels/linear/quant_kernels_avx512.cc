// AVX-512 (F, BW, VL) kernels: the template of quant_kernels_avx2.cc on
// 16-lane vectors (codes unpacked by the same AVX2 code), and for Q4_0,
// Q4_1 and Q8_0 the dedicated kernels below that read the blocks in
// registers without unpacking them to memory.
#include <immintrin.h>

#include <cmath>

#include "kernels/linear/quant_kernels.h"
#include "kernels/linear/quant_unpack_avx2.h"

#define SHARDLM_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace shardlm::quant_kernels {
namespace {

// 16 int8 values as f32. The maskz forms: GCC 12's plain
// _mm512_cvtepi8_epi32 and _mm512_cvtepi32_ps pass an undefined register
// through, which -O3 reports as maybe-uninitialized.
SHARDLM_AVX512 inline __m512 I8ToF32x16(__m128i v) {
  return _mm512_maskz_cvtepi32_ps(0xffff,
                                  _mm512_maskz_cvtepi8_epi32(0xffff, v));
}

// The sum of 16 lanes, through memory: GCC 12's _mm512_reduce_add_ps and
// even _mm512_castps512_ps256 go through an undefined register, which -O3
// reports as uninitialized. Once per row, so the store costs nothing.
SHARDLM_AVX512 inline float HSum16(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float pairs[8];
  for (int i = 0; i < 8; ++i) pairs[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) pairs[i] += pairs[i + 4];
  return (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]);
}

// --- Every format: unpacked codes, as in quant_kernels_avx2.cc ---

// As Dot32 in quant_kernels_avx2.cc, on two vectors of 16 (the halves).
template <int kSub, int kRows>
SHARDLM_AVX512 inline void Dot32(__m128i lo, __m128i hi, const float* scale,
                                 const float* x, int64_t in, __m512* acc0,
                                 __m512* acc1) {
  const __m512 w0 = I8ToF32x16(lo), w1 = I8ToF32x16(hi);
  const __m512 s0 = _mm512_set1_ps(scale[0]);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const float* xr = x + r * in;
    if constexpr (kSub == 32) {
      __m512 sum = _mm512_mul_ps(w0, _mm512_loadu_ps(xr));
      sum = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), sum);
      acc0[r] = _mm512_fmadd_ps(s0, sum, acc0[r]);
    } else {
      acc0[r] =
          _mm512_fmadd_ps(s0, _mm512_mul_ps(w0, _mm512_loadu_ps(xr)), acc0[r]);
      acc1[r] =
          _mm512_fmadd_ps(_mm512_set1_ps(scale[1]),
                          _mm512_mul_ps(w1, _mm512_loadu_ps(xr + 16)), acc1[r]);
    }
  }
}

template <typename F, int kRows>
SHARDLM_AVX512 void DotRows(const uint8_t* row, const float* x, int64_t in,
                            const float* xsum, int64_t blocks, float* dots) {
  constexpr int kSubs = F::kElems / F::kSub;
  float scale[kSubs], min[kSubs];
  __m512 even[kRows], odd[kRows];
  float offset[kRows];
  for (int r = 0; r < kRows; ++r) {
    even[r] = odd[r] = _mm512_setzero_ps();
    offset[r] = 0;
  }
  const int64_t subs_per_row = in / F::kSub;
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
  __m128i lo, hi;
  if constexpr (F::kElems == 32) {
    const auto block = [&](int64_t b, const uint8_t* p, __m512* acc) {
      CodesAvx2<F>::Get(p, 0, &lo, &hi);
      ScalesAvx2<F>::Run(p, scale, min);
      Dot32<32, kRows>(lo, hi, scale, x + b * 32, in, acc, nullptr);
      add_mins(b);
    };
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2, row += 2 * F::kBytes) {
      block(b, row, even);
      block(b + 1, row + F::kBytes, odd);
    }
    if (b < blocks) block(b, row, even);
  } else {
    for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
      ScalesAvx2<F>::Run(row, scale, min);
      const float* xb = x + b * F::kElems;
#pragma GCC unroll 8
      for (int i = 0; i < F::kElems / 32; ++i) {
        CodesAvx2<F>::Get(row, i, &lo, &hi);
        if constexpr (F::kSub == 32) {
          Dot32<32, kRows>(lo, hi, scale + i, xb + 32 * i, in,
                           i % 2 == 0 ? even : odd, nullptr);
        } else {
          Dot32<16, kRows>(lo, hi, scale + 2 * i, xb + 32 * i, in, even, odd);
        }
      }
      add_mins(b);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    dots[r] = HSum16(_mm512_add_ps(even[r], odd[r])) + offset[r];
  }
}

// --- Q4_0, Q4_1, Q8_0 in registers ---

// One block is two vectors of 16 weights (Q4: the low nibbles are values
// 0..15, the high ones 16..31; Q8_0: bytes 0..15 and 16..31), made once
// per block and multiplied into each of the kRows rows.
//
// Q4 blocks are dequantized by table lookup: the 16 values a nibble stands
// for in this block (d * (q - 8), or d * q + m) are one vector, and vpermps
// picks each lane's value by the low 4 bits of its index, so the
// zero-extended bytes index the low nibbles as they are and the high ones
// after a shift: no masking, no integer-to-float conversion, and the block
// scale is applied once to the table instead of to the products. Each
// weight is the f32 value the reference decoder gives (Q4_0 exactly,
// d * (q - 8) having at most 15 significant bits; Q4_1's d * q + m in one
// rounding, as its std::fma), multiplied by FMA into f32 accumulators (two
// per row: the low and high halves). On this project's Zen 4 machine this
// is ~10% faster than converting the nibbles; four rows of w at a time
// against one x (sharing its loads) was slower when the weights come from
// DRAM.
template <DType kFormat, int kRows>
SHARDLM_AVX512 void RowDotsQ4(const uint8_t* row, const float* x, int64_t in,
                              const float*, int64_t blocks, float* dots) {
  const __m512 levels =
      _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 centered = _mm512_sub_ps(levels, _mm512_set1_ps(8.0f));
  __m512 acc0[kRows], acc1[kRows];
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = acc1[r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 d = _mm512_set1_ps(HalfF16c(row));
    __m512 table;
    if constexpr (kFormat == DType::kQ4_0) {
      table = _mm512_mul_ps(d, centered);
      row += 2;
    } else {
      table = _mm512_fmadd_ps(d, levels, _mm512_set1_ps(HalfF16c(row + 2)));
      row += 4;
    }
    const __m512i idx = _mm512_maskz_cvtepu8_epi32(
        0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
    const __m512 w0 = _mm512_maskz_permutexvar_ps(0xffff, idx, table);
    const __m512 w1 = _mm512_maskz_permutexvar_ps(
        0xffff, _mm512_maskz_srli_epi32(0xffff, idx, 4), table);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float* xr = x + r * in + b * 32;
      acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc0[r]);
      acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc1[r]);
    }
    row += 16;
  }
  for (int r = 0; r < kRows; ++r) {
    dots[r] = HSum16(_mm512_add_ps(acc0[r], acc1[r]));
  }
}

template <int kRows>
SHARDLM_AVX512 void RowDotsQ8(const uint8_t* row, const float* x, int64_t in,
                              const float*, int64_t blocks, float* dots) {
  __m512 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 d = _mm512_set1_ps(HalfF16c(row));
    // One 32-byte load, not two of 16: with two, the lm_head's shape
    // (576 x 49152, from DRAM) ran at 7 GB/s instead of 19 (gemv_bench).
    const __m256i q =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
    const __m512 w0 = I8ToF32x16(_mm256_castsi256_si128(q));
    const __m512 w1 = I8ToF32x16(_mm256_extracti128_si256(q, 1));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float* xr = x + r * in + b * 32;
      __m512 s = _mm512_mul_ps(w0, _mm512_loadu_ps(xr));
      s = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), s);
      acc[r] = _mm512_fmadd_ps(d, s, acc[r]);
    }
    row += 34;
  }
  for (int r = 0; r < kRows; ++r) dots[r] = HSum16(acc[r]);
}

}  // namespace

// The prefill tiles use the AVX2 dequantizer (Avx2(t).dequant): it runs
// at a small share of the BLAS GEMM's time.
Kernels Avx512(DType t) {
  Kernels k = Avx2(t);
  if (k.max_group == 0) return k;
  switch (t) {
    case DType::kQ4_0:
      k.by[0] = RowDotsQ4<DType::kQ4_0, 1>,
      k.by[1] = RowDotsQ4<DType::kQ4_0, 2>;
      k.by[2] = RowDotsQ4<DType::kQ4_0, 4>,
      k.by[3] = RowDotsQ4<DType::kQ4_0, 8>;
      k.xsum_sub = 0;
      break;
    case DType::kQ4_1:
      k.by[0] = RowDotsQ4<DType::kQ4_1, 1>,
      k.by[1] = RowDotsQ4<DType::kQ4_1, 2>;
      k.by[2] = RowDotsQ4<DType::kQ4_1, 4>,
      k.by[3] = RowDotsQ4<DType::kQ4_1, 8>;
      k.xsum_sub = 0;
      break;
    case DType::kQ8_0:
      k.by[0] = RowDotsQ8<1>, k.by[1] = RowDotsQ8<2>;
      k.by[2] = RowDotsQ8<4>, k.by[3] = RowDotsQ8<8>;
      break;
    default:
      quant::VisitFormat(t, [&]<typename F>() {
        k.by[0] = DotRows<F, 1>, k.by[1] = DotRows<F, 2>;
        k.by[2] = DotRows<F, 4>, k.by[3] = DotRows<F, 8>;
      });
  }
  k.max_group = 8;
  return k;
}

}  // namespace shardlm::quant_kernels
