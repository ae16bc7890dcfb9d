#include "core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/quant_blocks.h"

namespace shardlm {
namespace {

void F32ToF32(const uint8_t* src, int64_t n, float* dst) {
  std::memcpy(dst, src, n * sizeof(float));
}
void F16ToF32(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = Fp16ToFloat(quant::LoadU16(src + 2 * i));
}
void BF16ToF32(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = Bf16ToFloat(quant::LoadU16(src + 2 * i));
}

// e4m3fn code -> value: sign, exponent (bias 7), mantissa; exponent 0 is
// subnormal (m/8 x 2^-6); 0x7f / 0xff are NaN (no infinities).
float DecodeE4M3(uint8_t b) {
  const int exponent = (b >> 3) & 0xf, mantissa = b & 0x7;
  float v;
  if (exponent == 0xf && mantissa == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return (b & 0x80) != 0 ? -v : v;
}

void F8E4M3ToF32(const uint8_t* src, int64_t n, float* dst) {
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t;
    for (int b = 0; b < 256; ++b) t[b] = DecodeE4M3(static_cast<uint8_t>(b));
    return t;
  }();
  for (int64_t i = 0; i < n; ++i) dst[i] = kTable[src[i]];
}

template <typename Format>
constexpr DTypeTraits Row(const char* name, int ggml_type) {
  return {Format::kType,        name,           ggml_type,
          Format::kElems,       Format::kBytes, Format::kSub,
          quant::Decode<Format>};
}

// Indexed by DType (checked below).
constexpr DTypeTraits kTraits[] = {
    {DType::kF32, "F32", 0, 1, 4, 0, F32ToF32},
    {DType::kF16, "F16", 1, 1, 2, 0, F16ToF32},
    {DType::kBF16, "BF16", 30, 1, 2, 0, BF16ToF32},
    Row<quant::Q8_0>("Q8_0", 8),
    Row<quant::Q4_0>("Q4_0", 2),
    Row<quant::Q4_1>("Q4_1", 3),
    {DType::kI32, "I32", -1, 1, 4, 0, nullptr},
    {DType::kI8, "I8", -1, 1, 1, 0, nullptr},
    Row<quant::Q5_0>("Q5_0", 6),
    Row<quant::Q5_1>("Q5_1", 7),
    Row<quant::Q2_K>("Q2_K", 10),
    Row<quant::Q3_K>("Q3_K", 11),
    Row<quant::Q4_K>("Q4_K", 12),
    Row<quant::Q5_K>("Q5_K", 13),
    Row<quant::Q6_K>("Q6_K", 14),
    Row<quant::IQ4_NL>("IQ4_NL", 20),
    Row<quant::IQ4_XS>("IQ4_XS", 23),
    {DType::kF8E4M3, "F8_E4M3", -1, 1, 1, 0, F8E4M3ToF32},
    Row<quant::MXFP4>("MXFP4", 39),
};

constexpr bool TableIsIndexedByDType() {
  for (size_t i = 0; i < std::size(kTraits); ++i) {
    if (static_cast<size_t>(kTraits[i].dtype) != i) return false;
  }
  return std::size(kTraits) == static_cast<size_t>(DType::kMXFP4) + 1;
}
static_assert(TableIsIndexedByDType());

// GGUF types shardlm does not read, by name, for the error that refuses
// them (ggml.h's enum ggml_type; ids 4, 5, 31-33 and 36-38 were removed).
const char* UnsupportedGgmlName(uint32_t t) {
  switch (t) {
    case 9:
      return "Q8_1";
    case 15:
      return "Q8_K";
    case 16:
      return "IQ2_XXS";
    case 17:
      return "IQ2_XS";
    case 18:
      return "IQ3_XXS";
    case 19:
      return "IQ1_S";
    case 21:
      return "IQ3_S";
    case 22:
      return "IQ2_S";
    case 24:
      return "I8";
    case 25:
      return "I16";
    case 26:
      return "I32";
    case 27:
      return "I64";
    case 28:
      return "F64";
    case 29:
      return "IQ1_M";
    case 34:
      return "TQ1_0";
    case 35:
      return "TQ2_0";
    case 40:
      return "NVFP4";
    case 41:
      return "Q1_0";
    default:
      return nullptr;
  }
}

}  // namespace

const DTypeTraits& Traits(DType t) {
  const size_t i = static_cast<size_t>(t);
  return kTraits[i < std::size(kTraits) ? i : 0];
}

absl::StatusOr<int64_t> BytesFor(DType t, int64_t n) {
  const int64_t block = BlockElems(t);
  if (n < 0 || n % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values is not a whole number of ", DTypeName(t),
                     " blocks of ", block));
  }
  const int64_t blocks = n / block;
  if (blocks > std::numeric_limits<int64_t>::max() / BlockBytes(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values of ", DTypeName(t), " overflow a size"));
  }
  return blocks * BlockBytes(t);
}

std::string SupportedGgmlTypes() {
  std::vector<std::string> names;
  for (const DTypeTraits& t : kTraits) {
    if (t.ggml_type >= 0) names.push_back(t.name);
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<DType> DTypeFromGgml(uint32_t ggml_type) {
  for (const DTypeTraits& t : kTraits) {
    if (t.ggml_type >= 0 && static_cast<uint32_t>(t.ggml_type) == ggml_type) {
      return t.dtype;
    }
  }
  const char* name = UnsupportedGgmlName(ggml_type);
  return absl::UnimplementedError(
      absl::StrCat("ggml tensor type ", ggml_type,
                   name != nullptr ? absl::StrCat(" (", name, ")")
                                   : std::string(" (unknown)"),
                   " is not supported; shardlm reads ", SupportedGgmlTypes()));
}

}  // namespace shardlm
