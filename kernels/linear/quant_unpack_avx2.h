// AVX2 Codes() of every block format: the same int8 codes as the portable
// ones in core/quant_blocks.h (kernels_test compares them on random
// blocks), 32 at a time. Scales stay scalar (a few per 32 or 256 values),
// from d and m converted with F16C. Internal to kernels/linear/; included
// by the AVX2 and AVX-512 kernel files (AVX-512 CPUs have AVX2).
#ifndef SHARDLM_KERNELS_LINEAR_QUANT_UNPACK_AVX2_H_
#define SHARDLM_KERNELS_LINEAR_QUANT_UNPACK_AVX2_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/quant_blocks.h"

#define SHARDLM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace shardlm::quant_kernels {

SHARDLM_AVX2 inline float HalfF16c(const uint8_t* p) {
  return _cvtsh_ss(quant::LoadU16(p));
}

SHARDLM_AVX2 inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
SHARDLM_AVX2 inline void Store32(int8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// Bits (v >> shift) & mask of every byte (shift < 8; mask < 256 >> shift).
SHARDLM_AVX2 inline __m256i ByteBits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift),
                          _mm256_set1_epi8(static_cast<char>(mask)));
}

// Byte j = 0xff when bit j of x is set, else 0 (j < 32).
SHARDLM_AVX2 inline __m256i BitsToBytes(uint32_t x) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(x)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                        0x0101010101010101, 0));
  // Every bit but bit (j % 8) set in byte j; only a set bit j makes 0xff.
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others),
                           _mm256_set1_epi64x(-1));
}

// 0xff in the bytes of v that have bit `bit` set.
SHARDLM_AVX2 inline __m256i BitSet(__m256i v, int bit) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

// CodesAvx2<F>::Get(block, i, &lo, &hi): codes 32i .. 32i + 15 and
// 32i + 16 .. 32i + 31 of the block (i < kElems / 32; the kernels unroll
// over i, so the loads shared by several i are made once). Run stores all.
template <typename F>
struct CodesAvx2;

template <typename Derived, int kElems>
struct CodesBase {
  SHARDLM_AVX2 static void Run(const uint8_t* b, int8_t* codes) {
    for (int i = 0; i < kElems / 32; ++i) {
      __m128i lo, hi;
      Derived::Get(b, i, &lo, &hi);
      Store32(codes + 32 * i, _mm256_set_m128i(hi, lo));
    }
  }
};

// The two halves of 32 codes in a ymm register.
SHARDLM_AVX2 inline void Split(__m256i v, __m128i* lo, __m128i* hi) {
  *lo = _mm256_castsi256_si128(v);
  *hi = _mm256_extracti128_si256(v, 1);
}

// 16 bytes of nibbles: the low nibbles (values 0..15), the high ones.
SHARDLM_AVX2 inline void NibbleHalves(const uint8_t* p, __m128i* lo,
                                      __m128i* hi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0xf);
  *lo = _mm_and_si128(v, mask);
  *hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
}

// 0x10 in byte j of the halves where bit j of qh (the 5th bits) is set.
SHARDLM_AVX2 inline void FifthBits(uint32_t qh, __m128i* lo, __m128i* hi) {
  __m128i blo, bhi;
  Split(_mm256_and_si256(BitsToBytes(qh), _mm256_set1_epi8(0x10)), &blo, &bhi);
  *lo = _mm_or_si128(*lo, blo);
  *hi = _mm_or_si128(*hi, bhi);
}

SHARDLM_AVX2 inline void Minus(int v, __m128i* lo, __m128i* hi) {
  *lo = _mm_sub_epi8(*lo, _mm_set1_epi8(static_cast<char>(v)));
  *hi = _mm_sub_epi8(*hi, _mm_set1_epi8(static_cast<char>(v)));
}

template <>
struct CodesAvx2<quant::Q8_0> : CodesBase<CodesAvx2<quant::Q8_0>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    *lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    *hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
  }
};
template <>
struct CodesAvx2<quant::Q4_0> : CodesBase<CodesAvx2<quant::Q4_0>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    NibbleHalves(b + 2, lo, hi);
    Minus(8, lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q4_1> : CodesBase<CodesAvx2<quant::Q4_1>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    NibbleHalves(b + 4, lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q5_0> : CodesBase<CodesAvx2<quant::Q5_0>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    NibbleHalves(b + 6, lo, hi);
    FifthBits(quant::LoadU32(b + 2), lo, hi);
    Minus(16, lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q5_1> : CodesBase<CodesAvx2<quant::Q5_1>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    NibbleHalves(b + 8, lo, hi);
    FifthBits(quant::LoadU32(b + 4), lo, hi);
  }
};
template <>
struct CodesAvx2<quant::IQ4_NL> : CodesBase<CodesAvx2<quant::IQ4_NL>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    const __m128i table =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values));
    NibbleHalves(b + 2, lo, hi);
    *lo = _mm_shuffle_epi8(table, *lo);
    *hi = _mm_shuffle_epi8(table, *hi);
  }
};
template <>
struct CodesAvx2<quant::MXFP4> : CodesBase<CodesAvx2<quant::MXFP4>, 32> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int, __m128i* lo,
                               __m128i* hi) {
    const __m128i table =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kMxfp4Values));
    NibbleHalves(b + 1, lo, hi);
    *lo = _mm_shuffle_epi8(table, *lo);
    *hi = _mm_shuffle_epi8(table, *hi);
  }
};
template <>
struct CodesAvx2<quant::Q2_K> : CodesBase<CodesAvx2<quant::Q2_K>, 256> {
  // Codes 32i..: bits 2s, 2s+1 of qs[32h ..], i = 4h + s.
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    Split(ByteBits(Load32(b + 16 + 32 * (i / 4)), 2 * (i % 4), 3), lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q3_K> : CodesBase<CodesAvx2<quant::Q3_K>, 256> {
  // As Q2_K, minus 4 where bit i of hmask[j] is clear.
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    const __m256i clear =
        _mm256_andnot_si256(BitSet(Load32(b), i), _mm256_set1_epi8(4));
    Split(_mm256_sub_epi8(
              ByteBits(Load32(b + 32 + 32 * (i / 4)), 2 * (i % 4), 3), clear),
          lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q4_K> : CodesBase<CodesAvx2<quant::Q4_K>, 256> {
  // Codes 32i..: nibble i % 2 of qs[32 (i / 2) ..].
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    Split(ByteBits(Load32(b + 16 + 32 * (i / 2)), 4 * (i % 2), 0xf), lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q5_K> : CodesBase<CodesAvx2<quant::Q5_K>, 256> {
  // As Q4_K, with 0x10 where bit i of qh[j] is set.
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    const __m256i high =
        _mm256_and_si256(BitSet(Load32(b + 16), i), _mm256_set1_epi8(0x10));
    Split(_mm256_or_si256(
              ByteBits(Load32(b + 48 + 32 * (i / 2)), 4 * (i % 2), 0xf), high),
          lo, hi);
  }
};
template <>
struct CodesAvx2<quant::Q6_K> : CodesBase<CodesAvx2<quant::Q6_K>, 256> {
  // Half h = i / 4, s = i % 4: nibble s / 2 of ql[64h + 32 (s % 2) ..],
  // high bits 2s, 2s+1 of qh[32h ..]; minus 32.
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    const int h = i / 4, s = i % 4;
    const __m256i low =
        ByteBits(Load32(b + 64 * h + 32 * (s % 2)), 4 * (s / 2), 0xf);
    const __m256i high =
        _mm256_slli_epi16(ByteBits(Load32(b + 128 + 32 * h), 2 * s, 3), 4);
    Split(_mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)), lo,
          hi);
  }
};
template <>
struct CodesAvx2<quant::IQ4_XS> : CodesBase<CodesAvx2<quant::IQ4_XS>, 256> {
  SHARDLM_AVX2 static void Get(const uint8_t* b, int i, __m128i* lo,
                               __m128i* hi) {
    const __m128i table =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values));
    NibbleHalves(b + 8 + 16 * i, lo, hi);
    *lo = _mm_shuffle_epi8(table, *lo);
    *hi = _mm_shuffle_epi8(table, *hi);
  }
};

// Scales of the K-quants, 8 at a time: the sub-block scales (and mins) as
// integers, times d (and -dmin), the products the portable Scales form.

// dst[i] = f * v[i] for the 8 unsigned / signed bytes of v.
SHARDLM_AVX2 inline void Times8(float f, __m128i v, bool is_signed,
                                float* dst) {
  const __m256i w =
      is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
  _mm256_storeu_ps(dst,
                   _mm256_mul_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(w)));
}

template <typename F>
struct ScalesAvx2 {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float* min) {
    float m = 0;
    if constexpr (F::kM >= 0) m = HalfF16c(b + F::kM);
    float d = 0;
    if constexpr (F::kD >= 0) d = HalfF16c(b + F::kD);
    F::Scales(b, d, m, scale, min);
  }
};

// Q4_K, Q5_K: the 12 packed bytes to 8 scales and 8 mins (ggml's kmask
// shuffle of the three 32-bit words; equal to quant::ScaleMinK4).
SHARDLM_AVX2 inline void ScalesK4(const uint8_t* b, float* scale, float* min) {
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  u[3] = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);
  const uint32_t mins_low = u[1] & k6;
  u[1] = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);
  u[2] = mins_low;
  u[0] &= k6;
  // Bytes 0..7: the scales; 8..15: the mins.
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  Times8(HalfF16c(b), v, false, scale);
  Times8(-HalfF16c(b + 2), _mm_srli_si128(v, 8), false, min);
}
template <>
struct ScalesAvx2<quant::Q4_K> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float* min) {
    ScalesK4(b, scale, min);
  }
};
template <>
struct ScalesAvx2<quant::Q5_K> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float* min) {
    ScalesK4(b, scale, min);
  }
};
template <>
struct ScalesAvx2<quant::Q2_K> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float* min) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i mask = _mm_set1_epi8(0xf);
    const __m128i sc = _mm_and_si128(v, mask);
    const __m128i m = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    const float d = HalfF16c(b + 80), dmin = -HalfF16c(b + 82);
    Times8(d, sc, false, scale);
    Times8(d, _mm_srli_si128(sc, 8), false, scale + 8);
    Times8(dmin, m, false, min);
    Times8(dmin, _mm_srli_si128(m, 8), false, min + 8);
  }
};
template <>
struct ScalesAvx2<quant::Q3_K> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float*) {
    // ggml's kmask shuffle: 16 six-bit scales from 12 bytes (equal to
    // quant::ScaleQ3K), then minus 32.
    uint32_t a[3], u[4];
    std::memcpy(a, b + 96, 12);
    constexpr uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
    u[0] = (a[0] & k4) | (((a[2] >> 0) & k2) << 4);
    u[1] = (a[1] & k4) | (((a[2] >> 2) & k2) << 4);
    u[2] = ((a[0] >> 4) & k4) | (((a[2] >> 4) & k2) << 4);
    u[3] = ((a[1] >> 4) & k4) | (((a[2] >> 6) & k2) << 4);
    const __m128i v =
        _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)),
                     _mm_set1_epi8(32));
    const float d = HalfF16c(b + 108);
    Times8(d, v, true, scale);
    Times8(d, _mm_srli_si128(v, 8), true, scale + 8);
  }
};
template <>
struct ScalesAvx2<quant::Q6_K> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float*) {
    const __m128i v =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const float d = HalfF16c(b + 208);
    Times8(d, v, true, scale);
    Times8(d, _mm_srli_si128(v, 8), true, scale + 8);
  }
};
template <>
struct ScalesAvx2<quant::IQ4_XS> {
  SHARDLM_AVX2 static void Run(const uint8_t* b, float* scale, float*) {
    // ls_k = nibble k % 2 of scales_l[k / 2] | bits 2k, 2k+1 of scales_h
    // << 4, for k = 0..7 in 32-bit lanes.
    const __m256i k = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i low = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_cvtepu8_epi32(_mm_shuffle_epi8(
                _mm_cvtsi32_si128(static_cast<int>(quant::LoadU32(b + 4))),
                _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1,
                              -1, -1))),
            _mm256_slli_epi32(_mm256_and_si256(k, _mm256_set1_epi32(1)), 2)),
        _mm256_set1_epi32(0xf));
    const __m256i high = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(quant::LoadU16(b + 2)),
                          _mm256_add_epi32(k, k)),
        _mm256_set1_epi32(3));
    const __m256i ls =
        _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)),
                         _mm256_set1_epi32(32));
    _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(HalfF16c(b)),
                                          _mm256_cvtepi32_ps(ls)));
  }
};

// One block's codes, scales and mins (F16C for d and m).
template <typename F>
SHARDLM_AVX2 inline void UnpackAvx2(const uint8_t* b, int8_t* codes,
                                    float* scale, float* min) {
  ScalesAvx2<F>::Run(b, scale, min);
  CodesAvx2<F>::Run(b, codes);
}

}  // namespace shardlm::quant_kernels

#endif  // SHARDLM_KERNELS_LINEAR_QUANT_UNPACK_AVX2_H_
