#include "worker/gpt_oss_experts.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/dequantize.h"

namespace shardlm {
namespace {

constexpr int64_t kBlock = 32;       // MXFP4 values per block.
constexpr int64_t kBlockBytes = 17;  // GGUF's: e, then 16 bytes of nibbles.

std::string Name(int64_t layer, std::string_view tensor) {
  return absl::StrCat("blk.", layer, ".", Sv(tensor));
}

// The HF tensor holding `kind` (the gate and up share one) and where
// expert rows of `kind` sit in it: row r of the matrix is row
// r * stride + first of the stored one.
struct Layout {
  std::string_view base;  // "ffn_gate_up_exps" or "ffn_down_exps".
  int64_t stride = 1;
  int64_t first = 0;
};

absl::StatusOr<Layout> LayoutOf(std::string_view kind) {
  if (kind == "ffn_gate") return Layout{"ffn_gate_up_exps", 2, 0};
  if (kind == "ffn_up") return Layout{"ffn_gate_up_exps", 2, 1};
  if (kind == "ffn_down") return Layout{"ffn_down_exps", 1, 0};
  return absl::InvalidArgumentError(
      absl::StrCat("no gpt-oss expert matrix '", Sv(kind), "'"));
}

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// The MXFP4 form's blocks and scales of one stored matrix kind, checked:
// blocks [experts, out, in / 32, 16] and scales [experts, out, in / 32].
absl::Status CheckMxfp4(const WeightSource& source, int64_t layer,
                        std::string_view base, int64_t experts, int64_t out,
                        int64_t in) {
  if (in % kBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, ": MXFP4 experts need a multiple of 32 ",
                     "inputs, not ", in));
  }
  const std::string blocks = Name(layer, absl::StrCat(Sv(base), ".blocks"));
  const std::string scales = Name(layer, absl::StrCat(Sv(base), ".scales"));
  RETURN_IF_ERROR(
      source.Require(blocks, {experts, out, in / kBlock, 16}).status());
  RETURN_IF_ERROR(source.Require(scales, {experts, out, in / kBlock}).status());
  return absl::OkStatus();
}

// The dequantized form: [experts, in, out] in a float type.
absl::StatusOr<const TensorInfo*> CheckDense(const WeightSource& source,
                                             int64_t layer,
                                             std::string_view base,
                                             int64_t experts, int64_t out,
                                             int64_t in) {
  const std::string name = Name(layer, absl::StrCat(Sv(base), ".weight_t"));
  ASSIGN_OR_RETURN(const TensorInfo* t,
                   source.Require(name, {experts, in, out}));
  if (!IsFloat(t->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' is ", DTypeName(t->dtype),
                     "; F32, F16 or BF16 expected"));
  }
  return t;
}

bool HasMxfp4(const WeightSource& source, int64_t layer) {
  return source.Find(Name(layer, "ffn_gate_up_exps.blocks")) != nullptr;
}

}  // namespace

bool HasGptOssExperts(const WeightSource& source, int64_t layer) {
  return HasMxfp4(source, layer) ||
         source.Find(Name(layer, "ffn_gate_up_exps.weight_t")) != nullptr;
}

absl::Status CheckGptOssExperts(const WeightSource& source, int64_t layer,
                                int64_t experts, int64_t f, int64_t hidden) {
  if (HasMxfp4(source, layer)) {
    RETURN_IF_ERROR(
        CheckMxfp4(source, layer, "ffn_gate_up_exps", experts, 2 * f, hidden));
    return CheckMxfp4(source, layer, "ffn_down_exps", experts, hidden, f);
  }
  RETURN_IF_ERROR(
      CheckDense(source, layer, "ffn_gate_up_exps", experts, 2 * f, hidden)
          .status());
  return CheckDense(source, layer, "ffn_down_exps", experts, hidden, f)
      .status();
}

absl::StatusOr<Tensor> ReadGptOssExpert(const WeightSource& source,
                                        int64_t layer, std::string_view kind,
                                        int64_t e, int64_t experts, int64_t f,
                                        int64_t hidden) {
  ASSIGN_OR_RETURN(const Layout l, LayoutOf(kind));
  const bool gate_up = l.stride == 2;
  const int64_t rows = gate_up ? f : hidden;  // Of the matrix read.
  const int64_t cols = gate_up ? hidden : f;
  const int64_t stored_rows = rows * l.stride;
  if (e < 0 || e >= experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert ", e, " of ", experts));
  }
  if (HasMxfp4(source, layer)) {
    RETURN_IF_ERROR(
        CheckMxfp4(source, layer, l.base, experts, stored_rows, cols));
    const TensorInfo* blocks =
        source.Find(Name(layer, absl::StrCat(Sv(l.base), ".blocks")));
    const TensorInfo* scales =
        source.Find(Name(layer, absl::StrCat(Sv(l.base), ".scales")));
    const int64_t nb = cols / kBlock;  // Blocks per row.
    const uint8_t* bsrc = source.Data(*blocks).data();
    const uint8_t* ssrc = source.Data(*scales).data();
    ASSIGN_OR_RETURN(Tensor out,
                     Tensor::HostUninitialized(DType::kMXFP4, {rows, cols}));
    auto* dst = static_cast<uint8_t*>(out.raw());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = (e * stored_rows + r * l.stride + l.first) * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* hf = bsrc + (row + b) * 16;
        uint8_t* q = dst + (r * nb + b) * kBlockBytes;
        q[0] = ssrc[row + b];
        // HF: byte j = values 2j (low nibble), 2j + 1 (high). GGUF: byte j
        // = values j (low), j + 16 (high).
        uint8_t v[kBlock];
        for (int j = 0; j < 16; ++j) {
          v[2 * j] = hf[j] & 0xf;
          v[2 * j + 1] = hf[j] >> 4;
        }
        for (int j = 0; j < 16; ++j) {
          q[1 + j] = static_cast<uint8_t>(v[j] | (v[j + 16] << 4));
        }
      }
    }
    return out;
  }
  ASSIGN_OR_RETURN(const TensorInfo* t, CheckDense(source, layer, l.base,
                                                   experts, stored_rows, cols));
  // Expert e's [in, out] matrix, transposed into [out, in], rows picked.
  ASSIGN_OR_RETURN(const int64_t bytes, BytesFor(t->dtype, cols * stored_rows));
  const TensorInfo one{.name = absl::StrCat(t->name, "[", e, "]"),
                       .dtype = t->dtype,
                       .shape = {cols, stored_rows},
                       .bytes = static_cast<uint64_t>(bytes)};
  ASSIGN_OR_RETURN(
      const Tensor in_out,
      DequantizeSlice(one, source.Data(*t).subspan(e * bytes, bytes), 0, cols,
                      0, stored_rows));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {rows, cols}));
  const float* src = in_out.f32().data();
  float* dst = out.f32().data();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[r * cols + c] = src[c * stored_rows + r * l.stride + l.first];
    }
  }
  return out;
}

absl::StatusOr<Tensor> ReadGptOssGateUpBias(const WeightSource& source,
                                            int64_t layer, bool up,
                                            int64_t experts, int64_t f,
                                            int64_t e0, int64_t e1, int64_t c0,
                                            int64_t c1) {
  ASSIGN_OR_RETURN(
      const TensorInfo* t,
      source.Require(Name(layer, "ffn_gate_up_exps.bias"), {experts, 2 * f}));
  ASSIGN_OR_RETURN(const Tensor all, DequantizeTensor(source, *t));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {e1 - e0, c1 - c0}));
  const float* src = all.f32().data();
  float* dst = out.f32().data();
  for (int64_t e = e0; e < e1; ++e) {
    for (int64_t c = c0; c < c1; ++c) {
      dst[(e - e0) * (c1 - c0) + (c - c0)] = src[e * 2 * f + 2 * c + up];
    }
  }
  return out;
}

}  // namespace shardlm
