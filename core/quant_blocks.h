// The GGUF block formats, as llama.cpp (ggml-quants.c) and the gguf
// package lay them out, each reduced to one form the decoders and the CPU
// kernels share:
//
//   value[i] = scale[i / kSub] * code[i] + min[i / kSub]
//
// with code[i] a small signed integer (int8), and scale and min f32 per
// sub-block of kSub values (min is 0 for formats without one: kHasMin).
// A format struct says where its f16 fields are (kD: the scale d; kM: the
// min m or dmin, -1 when none) and splits decoding in two: Scales(block, d,
// m, scale, min) writes the kElems / kSub scales and mins from d and m
// (converted by the caller: F16C in the vector kernels), and Codes(block,
// codes) the kElems codes. Both use the operations of the gguf package's
// numpy decoder (a product d * sc computed as it does, then times the
// code), so that Decode is that decoder's f32 result. The kernels multiply
// codes into f32 activations and apply the scale once per sub-block.
//
// Portable scalar code: the reference, used at load time and by the
// portable kernel; the vector kernels have their own Unpack per format
// (kernels/linear/), tested against these.
#ifndef SHARDLM_CORE_QUANT_BLOCKS_H_
#define SHARDLM_CORE_QUANT_BLOCKS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"

namespace shardlm::quant {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float Half(const uint8_t* p) { return Fp16ToFloat(LoadU16(p)); }

// MXFP4's e2m1 values, doubled (ggml's kvalues_mxfp4; the half goes into
// the scale: Mxfp4Scale).
inline constexpr int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// Half of the e8m0 scale 2^(e - 127), as ggml's e8m0_to_fp32_half builds
// its bits: 2^(e - 128), subnormal for e < 2.
inline float Mxfp4Scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t{e - 1u} << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IQ4_NL's and IQ4_XS's codebook (kvalues_iq4nl).
inline constexpr int8_t kIq4Values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12
// packed bytes (ggml's get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: the 6-bit scale of sub-block j (0..15), minus 32.
inline int ScaleQ3K(int j, const uint8_t* s) {
  const int low = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | high << 4) - 32;
}

// Q8_0: f16 d, int8 q[32].
struct Q8_0 {
  static constexpr DType kType = DType::kQ8_0;
  static constexpr int kElems = 32, kBytes = 34, kSub = 32, kD = 0, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t*, float d, float, float* scale, float* min) {
    scale[0] = d;
    min[0] = 0;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    std::memcpy(codes, b + 2, 32);
  }
};

// Q4_0: f16 d, qs[16]; value j is the low nibble of qs[j], j + 16 the high
// one. code = nibble - 8.
struct Q4_0 {
  static constexpr DType kType = DType::kQ4_0;
  static constexpr int kElems = 32, kBytes = 18, kSub = 32, kD = 0, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t*, float d, float, float* scale, float* min) {
    scale[0] = d;
    min[0] = 0;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    for (int j = 0; j < 16; ++j) {
      codes[j] = static_cast<int8_t>((b[2 + j] & 0xf) - 8);
      codes[j + 16] = static_cast<int8_t>((b[2 + j] >> 4) - 8);
    }
  }
};

// Q4_1: f16 d, f16 m, qs[16] as Q4_0. value = d * nibble + m.
struct Q4_1 {
  static constexpr DType kType = DType::kQ4_1;
  static constexpr int kElems = 32, kBytes = 20, kSub = 32, kD = 0, kM = 2;
  static constexpr bool kHasMin = true;
  static void Scales(const uint8_t*, float d, float m, float* scale,
                     float* min) {
    scale[0] = d;
    min[0] = m;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    for (int j = 0; j < 16; ++j) {
      codes[j] = static_cast<int8_t>(b[4 + j] & 0xf);
      codes[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
    }
  }
};

// Q5_0: f16 d, u32 qh (bit j: the 5th bit of value j), qs[16] as Q4_0.
// code = (nibble | bit << 4) - 16.
struct Q5_0 {
  static constexpr DType kType = DType::kQ5_0;
  static constexpr int kElems = 32, kBytes = 22, kSub = 32, kD = 0, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t*, float d, float, float* scale, float* min) {
    scale[0] = d;
    min[0] = 0;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint32_t qh = LoadU32(b + 2);
    for (int j = 0; j < 16; ++j) {
      codes[j] =
          static_cast<int8_t>(((b[6 + j] & 0xf) | ((qh >> j) & 1) << 4) - 16);
      codes[j + 16] = static_cast<int8_t>(
          ((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
  }
};

// Q5_1: f16 d, f16 m, u32 qh, qs[16]. value = d * (nibble | bit << 4) + m.
struct Q5_1 {
  static constexpr DType kType = DType::kQ5_1;
  static constexpr int kElems = 32, kBytes = 24, kSub = 32, kD = 0, kM = 2;
  static constexpr bool kHasMin = true;
  static void Scales(const uint8_t*, float d, float m, float* scale,
                     float* min) {
    scale[0] = d;
    min[0] = m;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint32_t qh = LoadU32(b + 4);
    for (int j = 0; j < 16; ++j) {
      codes[j] = static_cast<int8_t>((b[8 + j] & 0xf) | ((qh >> j) & 1) << 4);
      codes[j + 16] =
          static_cast<int8_t>((b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
  }
};

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], f16 d,
// f16 dmin. Value h * 128 + s * 32 + j (h < 2, s < 4, j < 32) is bits
// 2s..2s+1 of qs[h * 32 + j]. value = d * sc * q - dmin * m, per 16 values.
struct Q2_K {
  static constexpr DType kType = DType::kQ2_K;
  static constexpr int kElems = 256, kBytes = 84, kSub = 16, kD = 80, kM = 82;
  static constexpr bool kHasMin = true;
  static void Scales(const uint8_t* b, float d, float dmin, float* scale,
                     float* min) {
    for (int i = 0; i < 16; ++i) {
      scale[i] = d * static_cast<float>(b[i] & 0xf);
      min[i] = -(dmin * static_cast<float>(b[i] >> 4));
    }
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint8_t* qs = b + 16;
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        for (int j = 0; j < 32; ++j) {
          codes[h * 128 + s * 32 + j] =
              static_cast<int8_t>((qs[h * 32 + j] >> (2 * s)) & 3);
        }
      }
    }
  }
};

// Q3_K: hmask[32], qs[64] (low 2 bits as Q2_K), scales[12] (6-bit, packed),
// f16 d. Value i = (h * 4 + s) * 32 + j has its high bit in bit h * 4 + s
// of hmask[j]; code = low - (high ? 0 : 4). value = d * (sc - 32) * code,
// per 16 values.
struct Q3_K {
  static constexpr DType kType = DType::kQ3_K;
  static constexpr int kElems = 256, kBytes = 110, kSub = 16, kD = 108, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t* b, float d, float, float* scale,
                     float* min) {
    for (int i = 0; i < 16; ++i) {
      scale[i] = d * static_cast<float>(ScaleQ3K(i, b + 96));
      min[i] = 0;
    }
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint8_t* hmask = b;
    const uint8_t* qs = b + 32;
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        for (int j = 0; j < 32; ++j) {
          const int low = (qs[h * 32 + j] >> (2 * s)) & 3;
          const int high = (hmask[j] >> (h * 4 + s)) & 1;
          codes[h * 128 + s * 32 + j] =
              static_cast<int8_t>(low - (high ? 0 : 4));
        }
      }
    }
  }
};

// Q4_K: f16 d, f16 dmin, scales[12] (ScaleMinK4), qs[128]. Value
// c * 64 + s * 32 + j (c < 4, s < 2) is nibble s of qs[c * 32 + j].
// value = d * sc * q - dmin * m, per sub-block of 32.
struct Q4_K {
  static constexpr DType kType = DType::kQ4_K;
  static constexpr int kElems = 256, kBytes = 144, kSub = 32, kD = 0, kM = 2;
  static constexpr bool kHasMin = true;
  static void Scales(const uint8_t* b, float d, float dmin, float* scale,
                     float* min) {
    for (int i = 0; i < 8; ++i) {
      int sc, m;
      ScaleMinK4(i, b + 4, &sc, &m);
      scale[i] = d * static_cast<float>(sc);
      min[i] = -(dmin * static_cast<float>(m));
    }
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint8_t* qs = b + 16;
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 32; ++j) {
        codes[c * 64 + j] = static_cast<int8_t>(qs[c * 32 + j] & 0xf);
        codes[c * 64 + 32 + j] = static_cast<int8_t>(qs[c * 32 + j] >> 4);
      }
    }
  }
};

// Q5_K: as Q4_K, with qh[32] after the scales: bit i / 32 of qh[i % 32] is
// value i's 5th bit.
struct Q5_K {
  static constexpr DType kType = DType::kQ5_K;
  static constexpr int kElems = 256, kBytes = 176, kSub = 32, kD = 0, kM = 2;
  static constexpr bool kHasMin = true;
  static void Scales(const uint8_t* b, float d, float dmin, float* scale,
                     float* min) {
    Q4_K::Scales(b, d, dmin, scale, min);
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int c = 0; c < 4; ++c) {
      for (int s = 0; s < 2; ++s) {
        const int bit = 2 * c + s;
        for (int j = 0; j < 32; ++j) {
          const int low = (qs[c * 32 + j] >> (4 * s)) & 0xf;
          codes[bit * 32 + j] =
              static_cast<int8_t>(low | ((qh[j] >> bit) & 1) << 4);
        }
      }
    }
  }
};

// Q6_K: ql[128], qh[64], int8 scales[16], f16 d. Value h * 128 + s * 64 + j
// (j < 64) has its low 4 bits in nibble s of ql[h * 64 + j]; value
// h * 128 + s * 32 + j (j < 32) its high 2 bits in bits 2s..2s+1 of
// qh[h * 32 + j]. code = q - 32; value = d * sc * code, per 16 values.
struct Q6_K {
  static constexpr DType kType = DType::kQ6_K;
  static constexpr int kElems = 256, kBytes = 210, kSub = 16, kD = 208, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t* b, float d, float, float* scale,
                     float* min) {
    for (int i = 0; i < 16; ++i) {
      scale[i] = d * static_cast<float>(static_cast<int8_t>(b[192 + i]));
      min[i] = 0;
    }
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 128; ++i) {
        const int low = (ql[h * 64 + i % 64] >> (4 * (i / 64))) & 0xf;
        const int high = (qh[h * 32 + i % 32] >> (2 * (i / 32))) & 3;
        codes[h * 128 + i] = static_cast<int8_t>((low | high << 4) - 32);
      }
    }
  }
};

// IQ4_NL: f16 d, qs[16] as Q4_0, each nibble an index into kIq4Values.
struct IQ4_NL {
  static constexpr DType kType = DType::kIQ4_NL;
  static constexpr int kElems = 32, kBytes = 18, kSub = 32, kD = 0, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t*, float d, float, float* scale, float* min) {
    scale[0] = d;
    min[0] = 0;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    for (int j = 0; j < 16; ++j) {
      codes[j] = kIq4Values[b[2 + j] & 0xf];
      codes[j + 16] = kIq4Values[b[2 + j] >> 4];
    }
  }
};

// IQ4_XS: f16 d, u16 scales_h, scales_l[4], qs[128]. Sub-block k (32
// values) has scale d * (ls - 32), ls = nibble k % 2 of scales_l[k / 2] |
// bits 2k..2k+1 of scales_h << 4; its values are the low then the high
// nibbles of qs[16 k .. 16 k + 16), indices into kIq4Values.
struct IQ4_XS {
  static constexpr DType kType = DType::kIQ4_XS;
  static constexpr int kElems = 256, kBytes = 136, kSub = 32, kD = 0, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t* b, float d, float, float* scale,
                     float* min) {
    const int scales_h = LoadU16(b + 2);
    for (int k = 0; k < 8; ++k) {
      const int ls = ((b[4 + k / 2] >> (4 * (k % 2))) & 0xf) |
                     ((scales_h >> (2 * k)) & 3) << 4;
      scale[k] = d * static_cast<float>(ls - 32);
      min[k] = 0;
    }
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    for (int k = 0; k < 8; ++k) {
      const uint8_t* qs = b + 8 + 16 * k;
      for (int j = 0; j < 16; ++j) {
        codes[32 * k + j] = kIq4Values[qs[j] & 0xf];
        codes[32 * k + 16 + j] = kIq4Values[qs[j] >> 4];
      }
    }
  }
};

// MXFP4: u8 e (the e8m0 scale), qs[16] as Q4_0, each nibble an index into
// kMxfp4Values; scale Mxfp4Scale(e). No f16 field (kD -1: Scales reads e).
struct MXFP4 {
  static constexpr DType kType = DType::kMXFP4;
  static constexpr int kElems = 32, kBytes = 17, kSub = 32, kD = -1, kM = -1;
  static constexpr bool kHasMin = false;
  static void Scales(const uint8_t* b, float, float, float* scale, float* min) {
    scale[0] = Mxfp4Scale(b[0]);
    min[0] = 0;
  }
  static void Codes(const uint8_t* b, int8_t* codes) {
    for (int j = 0; j < 16; ++j) {
      codes[j] = kMxfp4Values[b[1 + j] & 0xf];
      codes[j + 16] = kMxfp4Values[b[1 + j] >> 4];
    }
  }
};

// One block of Format: its codes, scales and mins (portable f16
// conversion; formats without an f16 d, kD < 0, read their own scale).
template <typename Format>
void Unpack(const uint8_t* b, int8_t* codes, float* scale, float* min) {
  Format::Scales(b, Format::kD >= 0 ? Half(b + Format::kD) : 0.0f,
                 Format::kM >= 0 ? Half(b + Format::kM) : 0.0f, scale, min);
  Format::Codes(b, codes);
}

// Calls f.template operator()<Format>() with the format struct of `t`;
// returns false (calling nothing) for plain types.
template <typename F>
bool VisitFormat(DType t, F&& f) {
  switch (t) {
    case DType::kQ8_0:
      f.template operator()<Q8_0>();
      return true;
    case DType::kQ4_0:
      f.template operator()<Q4_0>();
      return true;
    case DType::kQ4_1:
      f.template operator()<Q4_1>();
      return true;
    case DType::kQ5_0:
      f.template operator()<Q5_0>();
      return true;
    case DType::kQ5_1:
      f.template operator()<Q5_1>();
      return true;
    case DType::kQ2_K:
      f.template operator()<Q2_K>();
      return true;
    case DType::kQ3_K:
      f.template operator()<Q3_K>();
      return true;
    case DType::kQ4_K:
      f.template operator()<Q4_K>();
      return true;
    case DType::kQ5_K:
      f.template operator()<Q5_K>();
      return true;
    case DType::kQ6_K:
      f.template operator()<Q6_K>();
      return true;
    case DType::kIQ4_NL:
      f.template operator()<IQ4_NL>();
      return true;
    case DType::kIQ4_XS:
      f.template operator()<IQ4_XS>();
      return true;
    case DType::kMXFP4:
      f.template operator()<MXFP4>();
      return true;
    default:
      return false;
  }
}

// Random blocks of quantized type `t` (tests and benchmarks): random bytes,
// so every code and sub-block scale occurs, with finite f16 fields: d in
// [0.2, 1) * scale (/ 16 for the 256-value formats, whose sub-block scales
// of up to 63 multiply it), m in [-4, 4) * scale for Q4_1 / Q5_1 (the min
// itself) or like d for the K-quants' dmin; MXFP4's e so that its scale is
// in [k / 8, k). Does nothing for plain types.
template <typename Rng>
void FillRandomBlocks(DType t, uint8_t* p, int64_t blocks, float scale,
                      Rng& rng) {
  VisitFormat(t, [&]<typename F>() {
    const float k = F::kElems == 256 ? scale / 16 : scale;
    const auto uniform = [&](float lo, float hi) {
      return lo + (hi - lo) * static_cast<float>(rng() % (1u << 24)) /
                      static_cast<float>(1u << 24);
    };
    for (int64_t b = 0; b < blocks; ++b, p += F::kBytes) {
      for (int i = 0; i < F::kBytes; ++i) p[i] = static_cast<uint8_t>(rng());
      if constexpr (F::kD >= 0) {
        const uint16_t d = FloatToFp16(uniform(0.2f * k, k));
        std::memcpy(p + F::kD, &d, 2);
      } else {  // MXFP4's e: 2^(e - 128) in [k / 8, k), codes up to 12.
        const int e = static_cast<int>(std::floor(std::log2(k))) + 128;
        p[0] = static_cast<uint8_t>(
            std::clamp(e - static_cast<int>(rng() % 3), 0, 255));
      }
      if constexpr (F::kM >= 0) {
        const uint16_t m =
            FloatToFp16(F::kElems == 256 ? uniform(0.2f * k, k)
                                         : uniform(-4 * scale, 4 * scale));
        std::memcpy(p + F::kM, &m, 2);
      }
    }
  });
}

// `blocks` blocks of Format at `src` as f32: scale * code + min.
template <typename Format>
void Decode(const uint8_t* src, int64_t blocks, float* dst) {
  int8_t codes[Format::kElems];
  float scale[Format::kElems / Format::kSub],
      min[Format::kElems / Format::kSub];
  for (int64_t b = 0; b < blocks; ++b, src += Format::kBytes) {
    Unpack<Format>(src, codes, scale, min);
    for (int i = 0; i < Format::kElems; ++i, ++dst) {
      const int s = i / Format::kSub;
      // One rounding with a min (as the vector kernels' FMA).
      *dst = Format::kHasMin
                 ? std::fma(scale[s], static_cast<float>(codes[i]), min[s])
                 : scale[s] * static_cast<float>(codes[i]);
    }
  }
}

}  // namespace shardlm::quant

#endif  // SHARDLM_CORE_QUANT_BLOCKS_H_
