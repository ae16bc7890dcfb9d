// IEEE half and bfloat16 conversions (scalar; used at load time and in
// reference paths, not in hot loops).
#ifndef SHARDLM_CORE_HALF_H_
#define SHARDLM_CORE_HALF_H_

#include <bit>
#include <cstdint>

namespace shardlm {

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // Subnormal: renormalize.
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round-to-nearest-even float -> half.
inline uint16_t FloatToFp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7c00 |
                                 (abs > 0x7f800000 ? 0x200 : 0));
  }
  if (abs >= 0x477ff000)
    return static_cast<uint16_t>(sign | 0x7c00);  // Overflow.
  if (abs < 0x38800000) {                         // Subnormal or zero in half.
    const float magic = std::bit_cast<float>(0x3f000000u);  // 0.5
    float v = std::bit_cast<float>(abs) + magic;
    return static_cast<uint16_t>(sign |
                                 (std::bit_cast<uint32_t>(v) - 0x3f000000u));
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

inline float Bf16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000)
    return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace shardlm

#endif  // SHARDLM_CORE_HALF_H_
