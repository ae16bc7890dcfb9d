#include "kernels/linear/quant_device_pack.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/status.h"

namespace shardlm {

namespace ql = quant_layout;

bool HasDeviceQuantLayout(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0;
}

absl::StatusOr<ql::QuantFormat> DeviceQuantFormat(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return ql::QuantFormat::kQ8_0;
    case DType::kQ4_0:
      return ql::QuantFormat::kQ4_0;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(DTypeName(t),
                       " has no device layout for quantized weights (Q8_0 "
                       "and Q4_0 do)"));
  }
}

absl::StatusOr<int64_t> PackedQuantBytes(DType t, int64_t out, int64_t in) {
  ASSIGN_OR_RETURN(const ql::QuantFormat f, DeviceQuantFormat(t));
  if (in <= 0 || in % ql::kBlockElems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", DTypeName(t), " matrix needs a row length (in = ", in,
        ") that is a positive multiple of ", ql::kBlockElems));
  }
  if (out <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", DTypeName(t),
                     " matrix needs at least one row (out = ", out, ")"));
  }
  return ql::PackedBytes(f, out, in);
}

absl::StatusOr<Tensor> PackQuantized(const Tensor& gguf) {
  if (gguf.rank() != 2 || gguf.memory() == MemoryType::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PackQuantized takes a 2-D host matrix, not ", gguf.DebugString()));
  }
  const DType t = gguf.dtype();
  const int64_t out = gguf.dim(0), in = gguf.dim(1);
  ASSIGN_OR_RETURN(const int64_t bytes, PackedQuantBytes(t, out, in));
  ASSIGN_OR_RETURN(const ql::QuantFormat f, DeviceQuantFormat(t));
  if (static_cast<int64_t>(gguf.bytes()) != bytes) {
    return absl::InternalError(
        absl::StrCat("PackQuantized: ", gguf.DebugString(), " holds ",
                     gguf.bytes(), " bytes, the layout ", bytes));
  }
  ASSIGN_OR_RETURN(Tensor packed, Tensor::HostUninitialized(t, gguf.shape()));
  const auto* src = static_cast<const uint8_t*>(gguf.raw());
  auto* dst = static_cast<uint8_t*>(packed.raw());
  const int64_t blocks = ql::BlocksPerRow(in);
  const int64_t code_bytes = ql::BlockCodeBytes(f);
  const int64_t block_bytes = BlockBytes(t);  // f16 d, then the codes.
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = src + (r * blocks + b) * block_bytes;
      std::memcpy(dst + ql::ScaleOffset(f, out, in, r, b), block,
                  ql::kScaleBytes);
      std::memcpy(dst + ql::QuantOffset(f, in, r, b), block + ql::kScaleBytes,
                  code_bytes);
    }
  }
  return packed;
}

absl::Status DequantizePacked(DType t, const uint8_t* packed, int64_t out,
                              int64_t in, int64_t row, float* dst) {
  RETURN_IF_ERROR(PackedQuantBytes(t, out, in).status());
  ASSIGN_OR_RETURN(const ql::QuantFormat f, DeviceQuantFormat(t));
  if (row < 0 || row >= out) {
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizePacked: row ", row, " of ", out));
  }
  // Unit by unit, as the kernels walk a row.
  const int64_t units = ql::UnitsPerRow(f, in);
  const uint8_t* codes = packed + ql::QuantOffset(f, in, row, 0);
  for (int64_t u = 0; u < units; ++u) {
    uint16_t h;
    std::memcpy(&h,
                packed + ql::ScaleOffset(f, out, in, row, ql::UnitBlock(f, u)),
                sizeof h);
    const float d = Fp16ToFloat(h);
    const uint8_t* unit = codes + u * ql::kUnitBytes;
    float* y = dst + ql::UnitFirstElem(f, u);
    for (int e = 0; e < ql::UnitElems(f); ++e) {
      y[e] = d * static_cast<float>(ql::UnitCode(f, unit, e));
    }
  }
  return absl::OkStatus();
}

int64_t DequantScratchBytes(int64_t largest_elems) {
  if (largest_elems <= 0) return 0;
  return 2 * std::min(largest_elems, kDequantScratchMaxElems);
}

int64_t DequantChunkRows(int64_t out, int64_t in, int64_t scratch_elems) {
  if (out <= 0 || in <= 0) return 0;
  return std::clamp<int64_t>(scratch_elems / in, 1, out);
}

namespace {

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

std::string Describe(const Tensor& t) {
  return t.empty() ? std::string("empty") : t.DebugString();
}

absl::Status Refuse(const char* op, const char* arg, const Tensor& t,
                    const std::string& want) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " is ", Describe(t),
                   t.memory() == MemoryType::kDevice ? "" : " in host memory",
                   ", expected ", want));
}

// w: a packed Q8_0 / Q4_0 [out, in] matrix in device memory, 16-byte
// aligned, of its layout's bytes.
absl::Status CheckPackedWeight(const char* op, const Tensor& w) {
  if (w.empty() || w.rank() != 2 || w.memory() != MemoryType::kDevice ||
      !HasDeviceQuantLayout(w.dtype())) {
    return Refuse(op, "w", w, "a device Q8_0 or Q4_0 matrix [out, in]");
  }
  const absl::StatusOr<int64_t> bytes =
      PackedQuantBytes(w.dtype(), w.dim(0), w.dim(1));
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": w: ", bytes.status().message()));
  }
  if (static_cast<int64_t>(w.bytes()) != *bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": w ", w.DebugString(), " holds ", w.bytes(),
                     " bytes, its packed layout ", *bytes));
  }
  if (!Aligned16(w.raw())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": w is not 16-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckQuantGemvArgs(const Tensor& x, const Tensor& w,
                                const Tensor& y) {
  constexpr const char* kOp = "LinearQuantizedCuda";
  RETURN_IF_ERROR(CheckPackedWeight(kOp, w));
  const int64_t out = w.dim(0), in = w.dim(1);
  if (x.rank() != 2 || x.dim(1) != in || x.dtype() != DType::kBF16) {
    return Refuse(kOp, "x", x, absl::StrCat("bf16 [n, ", in, "]"));
  }
  const int64_t n = x.dim(0);
  if (n > kQuantGemvMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x has ", n,
                     " rows; the quantized GEMV takes at "
                     "most ",
                     kQuantGemvMaxRows,
                     " (larger steps dequantize into a scratch for cuBLAS)"));
  }
  if (y.rank() != 2 || y.dim(0) != n || y.dim(1) != out ||
      (y.dtype() != DType::kF32 && y.dtype() != DType::kBF16)) {
    return Refuse(kOp, "y", y, absl::StrCat("f32|bf16 [", n, ", ", out, "]"));
  }
  if (n == 0) return absl::OkStatus();
  if (x.memory() != MemoryType::kDevice || x.empty()) {
    return Refuse(kOp, "x", x, "device memory");
  }
  if (y.memory() != MemoryType::kDevice || y.empty()) {
    return Refuse(kOp, "y", y, "device memory");
  }
  if (!Aligned16(x.raw())) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x is not 16-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status CheckDequantizePackedArgs(const Tensor& w, int64_t row_begin,
                                       int64_t row_end, const Tensor& dst) {
  constexpr const char* kOp = "DequantizePackedCuda";
  RETURN_IF_ERROR(CheckPackedWeight(kOp, w));
  const int64_t out = w.dim(0), in = w.dim(1);
  if (row_begin < 0 || row_begin > row_end || row_end > out) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": rows [", row_begin, ", ", row_end, ") of ", out));
  }
  const int64_t rows = row_end - row_begin;
  if (dst.rank() != 2 || dst.dim(1) != in || dst.dim(0) != rows ||
      dst.dtype() != DType::kBF16 ||
      (rows > 0 && (dst.empty() || dst.memory() != MemoryType::kDevice))) {
    return Refuse(kOp, "dst", dst,
                  absl::StrCat("device bf16 [", rows, ", ", in, "]"));
  }
  if (rows > 0 && !Aligned16(dst.raw())) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dst is not 16-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace shardlm
