// The device layout of Q8_0 and Q4_0 weights (issue #43 part 4): the index
// arithmetic that the CUDA kernels (kernels/linear/linear_quant_cuda.cu)
// and the host reference (quant_device_pack.h) share. Plain inline
// functions, __host__ __device__ under nvcc and ordinary C++ elsewhere; no
// Abseil, no CUDA headers.
//
// A GGUF [out, in] matrix is `out` rows of in / 32 blocks, each block an
// f16 scale d followed by its codes (Q8_0: 32 int8, 34 bytes; Q4_0: 16
// bytes of nibbles, 18 bytes). On the device the same bytes are split in
// two regions of one allocation:
//
//   [0, out * QuantRowBytes)            the codes, row after row, each
//                                       row's blocks back to back (GGUF's
//                                       code bytes, unchanged: Q4_0 keeps
//                                       value j in the low nibble of byte j
//                                       and j + 16 in its high nibble);
//   [out * QuantRowBytes, PackedBytes)  the f16 scales, [out, in / 32].
//
// Why: 34- and 18-byte blocks put codes at 2-byte alignment, so a GPU
// cannot read them with 16-byte loads. Split, a row of codes is in bytes
// (Q8_0) or in / 2 bytes (Q4_0), a multiple of 32 or 16 since in is a
// multiple of 32: every row starts 16-byte aligned, a warp reads its row
// with consecutive 16-byte loads (one 512-byte transaction per warp
// instruction), and the scales follow aligned at a 16-byte boundary too.
// Nothing is padded, so the packed form has exactly the GGUF bytes (34 /
// 32 = 1.0625 and 18 / 32 = 0.5625 bytes per weight) and a device tensor
// of dtype Q8_0 or Q4_0 and shape [out, in] reports its true size.
//
// The kernel's unit of work is 16 bytes of codes ("a unit"): half a Q8_0
// block (16 values) or a whole Q4_0 block (32 values).
#ifndef SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_LAYOUT_H_
#define SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_LAYOUT_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SHARDLM_HD __host__ __device__ __forceinline__
#else
#define SHARDLM_HD inline
#endif

namespace shardlm::quant_layout {

// The formats with a device layout (their GGUF type names).
enum class QuantFormat : int { kQ8_0 = 0, kQ4_0 = 1 };

inline constexpr int64_t kBlockElems = 32;  // Values per block (both).
inline constexpr int64_t kUnitBytes = 16;   // One 16-byte load of codes.
inline constexpr int64_t kScaleBytes = 2;   // f16.
inline constexpr int64_t kRowAlign = 16;    // Every row of codes starts here.

// Code bytes of one block: 32 (Q8_0) or 16 (Q4_0).
SHARDLM_HD int64_t BlockCodeBytes(QuantFormat f) {
  return f == QuantFormat::kQ8_0 ? 32 : 16;
}
// Values one 16-byte unit of codes holds: 16 (Q8_0) or 32 (Q4_0).
SHARDLM_HD int64_t UnitElems(QuantFormat f) {
  return f == QuantFormat::kQ8_0 ? 16 : 32;
}
// Blocks of a row of `in` values (in a multiple of kBlockElems).
SHARDLM_HD int64_t BlocksPerRow(int64_t in) { return in / kBlockElems; }
// Bytes of codes of one row; a multiple of kRowAlign.
SHARDLM_HD int64_t QuantRowBytes(QuantFormat f, int64_t in) {
  return BlocksPerRow(in) * BlockCodeBytes(f);
}
// 16-byte units of codes in one row.
SHARDLM_HD int64_t UnitsPerRow(QuantFormat f, int64_t in) {
  return QuantRowBytes(f, in) / kUnitBytes;
}
// Where the scales start: after every row's codes.
SHARDLM_HD int64_t ScalesOffset(QuantFormat f, int64_t out, int64_t in) {
  return out * QuantRowBytes(f, in);
}
// Bytes of the whole packed matrix (equal to GGUF's for [out, in]).
SHARDLM_HD int64_t PackedBytes(QuantFormat f, int64_t out, int64_t in) {
  return ScalesOffset(f, out, in) + out * BlocksPerRow(in) * kScaleBytes;
}
// Byte offset of the codes of block `b` of row `r`.
SHARDLM_HD int64_t QuantOffset(QuantFormat f, int64_t in, int64_t r,
                               int64_t b) {
  return r * QuantRowBytes(f, in) + b * BlockCodeBytes(f);
}
// Byte offset of the f16 scale of block `b` of row `r`.
SHARDLM_HD int64_t ScaleOffset(QuantFormat f, int64_t out, int64_t in,
                               int64_t r, int64_t b) {
  return ScalesOffset(f, out, in) + (r * BlocksPerRow(in) + b) * kScaleBytes;
}
// The block of a row that unit `u` of that row belongs to.
SHARDLM_HD int64_t UnitBlock(QuantFormat f, int64_t u) {
  return f == QuantFormat::kQ8_0 ? u / 2 : u;
}
// The first value (column) of unit `u` of a row.
SHARDLM_HD int64_t UnitFirstElem(QuantFormat f, int64_t u) {
  return u * UnitElems(f);
}

// The value at index e (0..UnitElems - 1) of a unit whose 16 code bytes
// are `codes`, before its block's scale: Q8_0 the int8 code e (e in 0..15,
// the unit being half a block); Q4_0 value e of the block: the low nibble
// of byte e for e < 16, the high nibble of byte e - 16 otherwise, minus 8.
SHARDLM_HD int UnitCode(QuantFormat f, const uint8_t* codes, int e) {
  if (f == QuantFormat::kQ8_0) return static_cast<int8_t>(codes[e]);
  return e < 16 ? (codes[e] & 0xf) - 8 : (codes[e - 16] >> 4) - 8;
}

// The codes of one unit as floats, exactly UnitCode(f, codes, e) for e in
// [0, UnitElems(f)), without integer-to-float conversions (a quarter-rate
// instruction on the GPU, 16 a clock per SM: at one conversion a weight,
// Q4_0's 32 a unit would cap the GEMV near 45% of the HBM floor). A byte b
// placed in the low byte of the f32 0x4B000000 (2^23) is exactly
// 2^23 + b; subtracting 2^23 + 128 (Q8_0, whose int8 code c is stored as
// b = c ^ 0x80 after flipping the sign bits) or 2^23 + 8 (Q4_0's nibbles)
// gives the code exactly. A unit's 16 bytes are 4 little-endian 32-bit
// words; Q4_0's low nibbles of word i are values 4i..4i+3, its high
// nibbles values 16+4i..16+4i+3.
SHARDLM_HD float MagicByte(uint32_t w, int k, float bias) {
#if defined(__CUDA_ARCH__)
  // Result bytes: w's byte k, 0, 0, 0x4B (y = 0x4B000000 is bytes 4..7).
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | k)) - bias;
#else
  const uint32_t bits = 0x4B000000u | ((w >> (8 * k)) & 0xffu);
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v - bias;
#endif
}
// Word i (0..3) of a unit into its values of `out`.
SHARDLM_HD void DecodeWord(QuantFormat f, uint32_t w, int i, float* out) {
  if (f == QuantFormat::kQ8_0) {
    const uint32_t u = w ^ 0x80808080u;
    out[4 * i] = MagicByte(u, 0, 8388736.0f);
    out[4 * i + 1] = MagicByte(u, 1, 8388736.0f);
    out[4 * i + 2] = MagicByte(u, 2, 8388736.0f);
    out[4 * i + 3] = MagicByte(u, 3, 8388736.0f);
    return;
  }
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
  out[4 * i] = MagicByte(lo, 0, 8388616.0f);
  out[4 * i + 1] = MagicByte(lo, 1, 8388616.0f);
  out[4 * i + 2] = MagicByte(lo, 2, 8388616.0f);
  out[4 * i + 3] = MagicByte(lo, 3, 8388616.0f);
  out[16 + 4 * i] = MagicByte(hi, 0, 8388616.0f);
  out[16 + 4 * i + 1] = MagicByte(hi, 1, 8388616.0f);
  out[16 + 4 * i + 2] = MagicByte(hi, 2, 8388616.0f);
  out[16 + 4 * i + 3] = MagicByte(hi, 3, 8388616.0f);
}
// A unit whose 16 bytes are the little-endian words w0..w3.
SHARDLM_HD void DecodeUnit(QuantFormat f, uint32_t w0, uint32_t w1, uint32_t w2,
                           uint32_t w3, float* out) {
  DecodeWord(f, w0, 0, out);
  DecodeWord(f, w1, 1, out);
  DecodeWord(f, w2, 2, out);
  DecodeWord(f, w3, 3, out);
}

}  // namespace shardlm::quant_layout

#endif  // SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_LAYOUT_H_
