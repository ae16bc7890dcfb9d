// Element types of tensors, including the block-quantized GGUF formats, and
// one table of their traits (ggml's type_traits[]): a new quantization
// format is one row here, one block decoder (core/quant_blocks.cc) and its
// CPU kernel rows (kernels/linear/quant_kernels_*.cc).
#ifndef SHARDLM_CORE_DTYPE_H_
#define SHARDLM_CORE_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace shardlm {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // 32 values: f16 scale d, 32 x int8. value = d * q.
  kQ4_0,  // 32 values: f16 d, 16 bytes of nibbles. value = d * (q - 8).
  kQ4_1,  // 32 values: f16 d, f16 m, 16 bytes. value = d * q + m.
  kI32,
  kI8,  // Raw bytes of the int8 KV cache (values and their f32 scales).
  // The other GGUF weight formats (layouts in core/quant_blocks.cc):
  kQ5_0,    // 32 values: d, 4 bytes of 5th bits, 16 bytes. d * (q - 16).
  kQ5_1,    // 32 values: d, m, 5th bits, 16 bytes. d * q + m.
  kQ2_K,    // 256 values, 16 sub-blocks of 16 with 4-bit scales and mins.
  kQ3_K,    // 256 values, 16 sub-blocks of 16 with 6-bit scales.
  kQ4_K,    // 256 values, 8 sub-blocks of 32 with 6-bit scales and mins.
  kQ5_K,    // As Q4_K with a 5th bit per value.
  kQ6_K,    // 256 values, 16 sub-blocks of 16 with int8 scales.
  kIQ4_NL,  // 32 values: d, 16 bytes indexing a fixed 16-entry codebook.
  kIQ4_XS,  // 256 values, 8 sub-blocks of 32 with 6-bit scales, codebook.
  // OCP FP8 e4m3 ("fn": no infinities; 0x7f/0xff NaN): sign, 4 exponent bits
  // (bias 7), 3 mantissa bits. Hugging Face's F8_E4M3, whose checkpoints
  // (DeepSeek V3, Kimi K2) scale each block of values by a
  // weight_scale_inv tensor beside it; decoded here without that scale.
  kF8E4M3,
  // OCP MXFP4 (GGUF type 39; gpt-oss's experts): 32 values, one e8m0 byte
  // e then 16 bytes of nibbles as Q4_0, each an index into e2m1's values
  // (doubled: quant::kMxfp4Values). value = 2^(e - 128) * that.
  kMXFP4,
};

// One row of the table: how a dtype is stored.
struct DTypeTraits {
  DType dtype;
  const char* name;     // "Q4_K": as ggml and llama.cpp spell it.
  int ggml_type;        // GGUF tensor type id; -1 for non-GGUF types.
  int64_t block_elems;  // Values per block (1 for plain types).
  int64_t block_bytes;  // Bytes per block.
  // Values [sub_block * i, sub_block * (i + 1)) share one scale (and min);
  // 0 for types without per-block scales.
  int64_t sub_block;
  // `blocks` consecutive blocks at `src` as f32 (block_elems each): the
  // reference decoder, in the same operations as the gguf package's numpy
  // one. Null for types that are not weights (I32, I8).
  void (*to_f32)(const uint8_t* src, int64_t blocks, float* dst);
};

const DTypeTraits& Traits(DType t);

// Quantized types store `BlockElems` values in `BlockBytes` bytes; plain
// types have blocks of one element.
inline int64_t BlockElems(DType t) { return Traits(t).block_elems; }
inline int64_t BlockBytes(DType t) { return Traits(t).block_bytes; }
// A C string so that it streams and StrCats everywhere.
inline const char* DTypeName(DType t) { return Traits(t).name; }
inline bool IsQuantized(DType t) { return BlockElems(t) > 1; }

// Bytes needed for `n` consecutive values. InvalidArgument when `n` is not a
// whole number of blocks or the size overflows.
absl::StatusOr<int64_t> BytesFor(DType t, int64_t n);

// The dtype of GGUF tensor type `ggml_type`. Unimplemented for the types
// shardlm does not read, naming the type (IQ2_XXS, MXFP4, ...) and listing
// the ones it does.
absl::StatusOr<DType> DTypeFromGgml(uint32_t ggml_type);
// "F32, F16, BF16, Q8_0, ...": every GGUF type DTypeFromGgml accepts.
std::string SupportedGgmlTypes();

}  // namespace shardlm

#endif  // SHARDLM_CORE_DTYPE_H_
