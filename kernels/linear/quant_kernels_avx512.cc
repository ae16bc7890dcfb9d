// AVX-512 (F, BW, VL) kernels. Formats of at most 32 levels look their
// weights up in per-sub-block tables (LookupRows); Q6_K takes the template
// of quant_kernels_avx2.cc on 16-lane vectors (codes unpacked by the same
// AVX2 code), and Q8_0 a kernel of its own.
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

// --- Formats of at most 32 levels: table lookup ---

// A format whose code is Level(index) for a raw index of at most 32
// values: Indices(block, i, h) gives the raw indices of values
// 32i + 16h .. 32i + 16h + 15 in 16 lanes. The kernel makes each
// sub-block's table of its weights, fma(scale, Level(j), min) for
// j < kLevels (the reference decoder's value of every level, in one
// rounding), and vpermps (vpermt2ps for 32 levels) picks each weight from
// it by its index: no integer-to-float conversion, and the scale is applied
// once per table instead of once per row. vpermps reads only the low 4
// bits of a lane (vpermt2ps 5), so nibbles need a shift, not a mask, and a
// 2-bit field's table repeats every 4 levels. 5th bits come from a mask
// register (a masked or). On Zen 4 this is 1.3x (Q4_0, IQ4_NL) to 1.1x
// (Q5_0) the converting template (gemv_bench, 2048 x 2048, one thread).
template <typename F>
struct Lookup {
  static constexpr int kLevels = 0;  // No table: converted codes.
};

SHARDLM_AVX512 inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
SHARDLM_AVX512 inline __m512i Widen(__m128i bytes) {
  return _mm512_maskz_cvtepu8_epi32(0xffff, bytes);
}
// Nibble h of 16 bytes as lane indices (the high bits stay: vpermps
// ignores them).
SHARDLM_AVX512 inline __m512i Nibble(const uint8_t* p, int h) {
  const __m512i w = Widen(Load16(p));
  return h == 0 ? w : _mm512_maskz_srli_epi32(0xffff, w, 4);
}
// The same masked to 4 bits, plus 16 in the lanes whose bit of `high` is
// set: the 5-bit indices of Q5 formats.
SHARDLM_AVX512 inline __m512i Nibble5(__m512i nibble, __mmask16 high) {
  const __m512i low = _mm512_and_si512(nibble, _mm512_set1_epi32(0xf));
  return _mm512_mask_or_epi32(low, high, low, _mm512_set1_epi32(16));
}

template <>
struct Lookup<quant::Q4_0> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return j - 8; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int, int h) {
    return Nibble(b + 2, h);
  }
};
template <>
struct Lookup<quant::Q4_1> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return j; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int, int h) {
    return Nibble(b + 4, h);
  }
};
template <>
struct Lookup<quant::IQ4_NL> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return quant::kIq4Values[j]; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int, int h) {
    return Nibble(b + 2, h);
  }
};
template <>
struct Lookup<quant::IQ4_XS> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return quant::kIq4Values[j]; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int i, int h) {
    return Nibble(b + 8 + 16 * i, h);
  }
};
template <>
struct Lookup<quant::Q4_K> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return j; }
  // Values 32i..: nibble i % 2 of qs[32 (i / 2) ..].
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int i, int h) {
    return Nibble(b + 16 + 32 * (i / 2) + 16 * h, i % 2);
  }
};
template <>
struct Lookup<quant::Q5_0> {
  static constexpr int kLevels = 32;
  static constexpr float Level(int j) { return j - 16; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int, int h) {
    return Nibble5(Nibble(b + 6, h),
                   static_cast<__mmask16>(quant::LoadU32(b + 2) >> (16 * h)));
  }
};
template <>
struct Lookup<quant::Q5_1> {
  static constexpr int kLevels = 32;
  static constexpr float Level(int j) { return j; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int, int h) {
    return Nibble5(Nibble(b + 8, h),
                   static_cast<__mmask16>(quant::LoadU32(b + 4) >> (16 * h)));
  }
};
template <>
struct Lookup<quant::Q5_K> {
  static constexpr int kLevels = 32;
  static constexpr float Level(int j) { return j; }
  // As Q4_K; the 5th bit of value 32i + j is bit i of qh[j].
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int i, int h) {
    const __mmask16 high = _mm_test_epi8_mask(
        Load16(b + 16 + 16 * h), _mm_set1_epi8(static_cast<char>(1 << i)));
    return Nibble5(Nibble(b + 48 + 32 * (i / 2) + 16 * h, i % 2), high);
  }
};
template <>
struct Lookup<quant::Q2_K> {
  static constexpr int kLevels = 16;
  static constexpr float Level(int j) { return j % 4; }  // 2 bits of 4.
  // Values 32i..: bits 2s, 2s+1 of qs[32 (i / 4) ..], s = i % 4.
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int i, int h) {
    const __m512i w = Widen(Load16(b + 16 + 32 * (i / 4) + 16 * h));
    return i % 4 == 0 ? w : _mm512_maskz_srli_epi32(0xffff, w, 2 * (i % 4));
  }
};
template <>
struct Lookup<quant::Q3_K> {
  static constexpr int kLevels = 8;
  // Index low | high << 2; code = low - 4 (high 0) or low (high 1).
  static constexpr float Level(int j) { return j - 4; }
  SHARDLM_AVX512 static __m512i Indices(const uint8_t* b, int i, int h) {
    const __m512i w = Widen(Load16(b + 32 + 32 * (i / 4) + 16 * h));
    const __m512i low = _mm512_and_si512(
        _mm512_maskz_srli_epi32(0xffff, w, 2 * (i % 4)), _mm512_set1_epi32(3));
    const __mmask16 high = _mm_test_epi8_mask(
        Load16(b + 16 * h), _mm_set1_epi8(static_cast<char>(1 << i)));
    return _mm512_mask_or_epi32(low, high, low, _mm512_set1_epi32(4));
  }
};

// The levels 0..15 and 16..31 of F as vectors.
template <typename F>
SHARDLM_AVX512 inline void Levels(__m512* low, __m512* high) {
  alignas(64) float l[32] = {};
  for (int j = 0; j < Lookup<F>::kLevels; ++j) l[j] = Lookup<F>::Level(j);
  *low = _mm512_load_ps(l);
  *high = _mm512_load_ps(l + 16);
}

// 16 weights: the table entries `idx` picks.
template <int kLevels>
SHARDLM_AVX512 inline __m512 Pick(__m512i idx, __m512 low, __m512 high) {
  if constexpr (kLevels <= 16) {
    return _mm512_maskz_permutexvar_ps(0xffff, idx, low);
  } else {
    return _mm512_permutex2var_ps(low, idx, high);
  }
}

template <int kLevels, bool kHasMin>
SHARDLM_AVX512 inline void SubBlockTable(float scale, float min, __m512 lv_low,
                                         __m512 lv_high, __m512* low,
                                         __m512* high) {
  const __m512 sc = _mm512_set1_ps(scale);
  const __m512 mn = kHasMin ? _mm512_set1_ps(min) : _mm512_setzero_ps();
  *low = _mm512_fmadd_ps(sc, lv_low, mn);
  if constexpr (kLevels > 16) *high = _mm512_fmadd_ps(sc, lv_high, mn);
}

template <typename F, int kRows>
SHARDLM_AVX512 void LookupRows(const uint8_t* row, const float* x, int64_t in,
                               const float*, int64_t blocks, float* dots) {
  constexpr int kSubs = F::kElems / F::kSub, kLevels = Lookup<F>::kLevels;
  float scale[kSubs], min[kSubs];
  __m512 lv_low, lv_high;
  Levels<F>(&lv_low, &lv_high);
  __m512 acc0[kRows], acc1[kRows];
  for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  // Each sub-block's table, fma(scale, level, min), by SubBlockTable called
  // here, not through a lambda: a lambda does not take this function's
  // target, so builds without AVX-512 in -march cannot inline the
  // intrinsics into it, and clang refuses to pass it __m512 values (it
  // changes the ABI): every clang build on a CPU without AVX-512
  // (-march=native) failed.
  constexpr bool kMin = F::kHasMin;
  for (int64_t b = 0; b < blocks; ++b, row += F::kBytes) {
    ScalesAvx2<F>::Run(row, scale, min);
    const float* xb = x + b * F::kElems;
#pragma GCC unroll 8
    for (int i = 0; i < F::kElems / 32; ++i) {
      const __m512i lo = Lookup<F>::Indices(row, i, 0);
      const __m512i hi = Lookup<F>::Indices(row, i, 1);
      __m512 t_low, t_high = t_low = _mm512_setzero_ps(), w0, w1;
      if constexpr (F::kSub == 32) {
        SubBlockTable<kLevels, kMin>(scale[i], min[i], lv_low, lv_high, &t_low,
                                     &t_high);
        w0 = Pick<kLevels>(lo, t_low, t_high);
        w1 = Pick<kLevels>(hi, t_low, t_high);
      } else {  // Sub-blocks of 16: one table each.
        SubBlockTable<kLevels, kMin>(scale[2 * i], min[2 * i], lv_low, lv_high,
                                     &t_low, &t_high);
        w0 = Pick<kLevels>(lo, t_low, t_high);
        SubBlockTable<kLevels, kMin>(scale[2 * i + 1], min[2 * i + 1], lv_low,
                                     lv_high, &t_low, &t_high);
        w1 = Pick<kLevels>(hi, t_low, t_high);
      }
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const float* xr = xb + r * in + 32 * i;
        acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc0[r]);
        acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc1[r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    dots[r] = HSum16(_mm512_add_ps(acc0[r], acc1[r]));
  }
}

// --- Q8_0 in registers ---

// Q8_0: two vectors of 16 weights (bytes 0..15 and 16..31) converted once
// per block and multiplied into each of the kRows rows.
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

// --- f32 weights ---

// 16 lanes per row over the row's length (`blocks` is it; the tail in a
// masked load), in two accumulators per row (alternate runs of 16: one
// FMA chain alone would be bound by its latency), then the lanes' sum.
template <int kRows>
SHARDLM_AVX512 void F32Rows(const uint8_t* row, const float* x, int64_t in,
                            const float*, int64_t, float* dots) {
  const float* w = reinterpret_cast<const float*>(row);
  __m512 acc0[kRows], acc1[kRows];
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 32 <= in; j += 32) {
    const __m512 w0 = _mm512_loadu_ps(w + j);
    const __m512 w1 = _mm512_loadu_ps(w + j + 16);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * in + j), acc0[r]);
      acc1[r] =
          _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * in + j + 16), acc1[r]);
    }
  }
  for (; j < in; j += 16) {  // At most two runs, the last masked.
    const __mmask16 m =
        static_cast<__mmask16>(in - j >= 16 ? 0xffff : (1u << (in - j)) - 1);
    const __m512 wv = _mm512_maskz_loadu_ps(m, w + j);
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + r * in + j),
                                acc0[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    dots[r] = HSum16(_mm512_add_ps(acc0[r], acc1[r]));
  }
}

}  // namespace

#define SHARDLM_INT_DOT_TARGET                                \
  __attribute__((                                             \
      target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma," \
             "f16c")))
#define SHARDLM_INT_DOT_VNNI 1
#define SHARDLM_INT_DOT_NS int_dots_vnni
#include "kernels/linear/quant_int_dots.inc"
#undef SHARDLM_INT_DOT_TARGET
#undef SHARDLM_INT_DOT_VNNI
#undef SHARDLM_INT_DOT_NS

// The prefill tiles use the AVX2 dequantizer (Avx2(t).dequant): it runs
// at a small share of the BLAS GEMM's time.
Kernels Avx512(DType t) {
  if (t == DType::kF32) {
    Kernels k;
    SetRowDots<8>(k, []<int R>() -> RowDots { return F32Rows<R>; });
    return k;
  }
  Kernels k = Avx2(t);
  if (k.max_group == 0) return k;
  if (t == DType::kQ8_0) {
    SetRowDots<8>(k, []<int R>() -> RowDots { return RowDotsQ8<R>; });
  } else {
    quant::VisitFormat(t, [&]<typename F>() {
      if constexpr (Lookup<F>::kLevels > 0) {
        SetRowDots<8>(k, []<int R>() -> RowDots { return LookupRows<F, R>; });
        k.xsum_sub = 0;  // The mins are in the tables.
      } else {
        SetRowDots<8>(k, []<int R>() -> RowDots { return DotRows<F, R>; });
      }
    });
  }
  k.max_group = 8;
  // The integer form: VNNI's vpdpbusd where the CPU has it (Cascade Lake,
  // Ice Lake, Zen 4), else the AVX2 one Avx2(t) set.
  if (__builtin_cpu_supports("avx512vnni")) {
    quant::VisitFormat(t, [&]<typename F>() {
      SetIntRowDots<8>(k, []<int R>() -> IntRowDots {
        return int_dots_vnni::IntDotRows<F, R>;
      });
    });
  }
  return k;
}

}  // namespace shardlm::quant_kernels
