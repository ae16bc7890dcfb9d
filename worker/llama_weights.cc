#include "worker/llama_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/log.h"
#include "core/status.h"
#include "model/dequantize.h"
#include "worker/gpt_oss_experts.h"

namespace shardlm {
namespace {

// A matrix slice as loaded, and where its columns begin in the slice
// asked for (see LlamaLayerWeights::wo_offset).
struct Slice {
  Tensor w;
  int64_t offset = 0;
};

// An FP8 matrix's slice (rows r0.., columns c0.. of `info`, decoded to
// f32 without its scales) times its blocks' scales: the tensor
// <name>_scale_inv, [ceil(rows / b), ceil(cols / b)] for the config's
// fp8_block b (DeepSeek V3's weight_scale_inv: the dequantized weight is
// the stored value times it).
absl::Status ScaleFp8(const WeightSource& source, const TensorInfo& info,
                      int64_t r0, int64_t c0, Tensor& f32) {
  const int64_t b = source.config().fp8_block;
  if (b < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name,
                     "' is F8_E4M3 but the model's config.json has no FP8 "
                     "quantization_config (weight_block_size)"));
  }
  if (info.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "' is F8_E4M3 but not a matrix (",
                     ShapeString(info.shape), "); only matrices are read"));
  }
  const int64_t rows = info.shape[0], cols = info.shape[1];
  const int64_t sr = (rows + b - 1) / b, sc = (cols + b - 1) / b;
  const absl::StatusOr<const TensorInfo*> scale_info =
      source.Require(info.name + "_scale_inv", {sr, sc});
  if (!scale_info.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 tensor '", info.name,
        "' needs its block scales: ", scale_info.status().message()));
  }
  ASSIGN_OR_RETURN(const Tensor scale, DequantizeTensor(source, **scale_info));
  const float* sp = scale.f32().data();
  const int64_t n = f32.dim(0), w = f32.dim(1);
  float* x = f32.f32().data();
  for (int64_t i = 0; i < n; ++i) {
    const float* srow = sp + (r0 + i) / b * sc;
    float* row = x + i * w;
    // Column runs within one block share its scale.
    for (int64_t j = 0; j < w;) {
      const int64_t end = std::min(w, ((c0 + j) / b + 1) * b - c0);
      const float s = srow[(c0 + j) / b];
      for (int64_t k = j; k < end; ++k) row[k] *= s;
      j = end;
    }
    for (int64_t j = 0; j < w; ++j) {
      if (!std::isfinite(row[j])) {  // A NaN code or a bad scale.
        return absl::InvalidArgumentError(absl::StrCat(
            "FP8 tensor '", info.name, "' holds a non-finite value at [",
            r0 + i, ", ", c0 + j, "] (its code or its block scale)"));
      }
    }
  }
  return absl::OkStatus();
}

// Rows [r0, r1) x columns [c0, c1) of tensor `name`, whose full shape must
// be `shape` (1-D tensors are read whole, as f32). Matrices in a block
// format stay in it, read in place by the CPU kernels; when [c0, c1) cuts
// blocks (a TP split between heads inside a 256-value super-block), the
// slice widens to the whole blocks around it and `offset` says where c0
// falls in it.
absl::StatusOr<Slice> LoadSlice(const WeightSource& source,
                                const std::string& name, const Shape& shape,
                                int64_t r0 = 0, int64_t r1 = -1, int64_t c0 = 0,
                                int64_t c1 = -1) {
  ASSIGN_OR_RETURN(const TensorInfo* info, source.Require(name, shape));
  if (shape.size() == 1) {
    if (info->dtype == DType::kF8E4M3) {  // Its scales are per 2-D block.
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' is F8_E4M3 but a vector"));
    }
    ASSIGN_OR_RETURN(Tensor t, DequantizeTensor(source, *info));
    return Slice{std::move(t), 0};
  }
  if (r1 < 0) r1 = shape[0];
  if (c1 < 0) c1 = shape[1];
  const DType t = info->dtype;
  if (!IsQuantized(t)) {
    ASSIGN_OR_RETURN(
        Tensor f32, DequantizeSlice(*info, source.Data(*info), r0, r1, c0, c1));
    if (t == DType::kF8E4M3)
      RETURN_IF_ERROR(ScaleFp8(source, *info, r0, c0, f32));
    return Slice{std::move(f32), 0};
  }
  const int64_t block = BlockElems(t);
  const int64_t b0 = c0 / block * block;
  const int64_t b1 = (c1 + block - 1) / block * block;
  ASSIGN_OR_RETURN(Tensor blocks,
                   CopySlice(*info, source.Data(*info), r0, r1, b0, b1));
  return Slice{std::move(blocks), c0 - b0};
}

absl::StatusOr<Tensor> Load(const WeightSource& source, const std::string& name,
                            const Shape& shape, int64_t r0 = 0,
                            int64_t r1 = -1) {
  ASSIGN_OR_RETURN(Slice s, LoadSlice(source, name, shape, r0, r1));
  return std::move(s.w);
}

// Elements [begin, end) of the 1-D tensor `name` of `size` elements, as f32.
absl::StatusOr<Tensor> LoadVectorSlice(const WeightSource& source,
                                       const std::string& name, int64_t size,
                                       int64_t begin, int64_t end) {
  ASSIGN_OR_RETURN(const Tensor whole, Load(source, name, {size}));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {end - begin}));
  std::copy_n(whole.f32().data() + begin, end - begin, out.f32().data());
  return out;
}

// An RMSNorm weight of `size` values as f32, plus the model's
// norm_weight_offset (Gemma's Hugging Face norms multiply by 1 + w).
absl::StatusOr<Tensor> LoadNorm(const WeightSource& source,
                                const std::string& name, int64_t size) {
  ASSIGN_OR_RETURN(Tensor w, LoadVectorSlice(source, name, size, 0, size));
  const float offset = source.config().norm_weight_offset;
  if (offset != 0) {
    for (float& v : w.f32()) v += offset;
  }
  return w;
}

// Every tensor of a layer, for counting bytes.
std::vector<const Tensor*> LayerTensors(const LlamaLayerWeights& l) {
  return {&l.attn_norm,
          &l.wq,
          &l.wk,
          &l.wv,
          &l.bq,
          &l.bk,
          &l.bv,
          &l.wo,
          &l.ffn_norm,
          &l.w_gate,
          &l.w_up,
          &l.w_down,
          &l.wqkv,
          &l.bqkv,
          &l.w_gate_up,
          &l.q_norm,
          &l.k_norm,
          &l.router,
          &l.exp_gate,
          &l.exp_up,
          &l.exp_down,
          &l.router_bias,
          &l.shared_gate,
          &l.shared_up,
          &l.shared_down,
          &l.wq_a,
          &l.q_a_norm,
          &l.wq_b,
          &l.wkv_a,
          &l.kv_a_norm,
          &l.wk_b,
          &l.wv_b,
          &l.post_attn_norm,
          &l.post_ffn_norm,
          &l.sinks,
          &l.bo,
          &l.router_logit_bias,
          &l.exp_gate_b,
          &l.exp_up_b,
          &l.exp_down_b,
          &l.ssm_qk,
          &l.ssm_v,
          &l.ssm_z,
          &l.ssm_beta,
          &l.ssm_alpha,
          &l.ssm_dt,
          &l.ssm_a,
          &l.ssm_conv,
          &l.ssm_norm,
          &l.ssm_out,
          &l.shared_gate_inp};
}

// A Gated DeltaNet layer's tensors (llama.cpp's qwen35 names; see
// LlamaLayerWeights): every q/k head's, and the value heads this rank holds
// (SsmValueHeads).
// Row ranges [begin, end) of the matrix `name` of `shape`, one after
// another, in the file's format (whole rows: a block format stays in it).
absl::StatusOr<Tensor> LoadRows(
    const WeightSource& source, const std::string& name, const Shape& shape,
    const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<Tensor> parts;
  int64_t rows = 0;
  for (const auto& [r0, r1] : ranges) {
    ASSIGN_OR_RETURN(Tensor t, Load(source, name, shape, r0, r1));
    rows += r1 - r0;
    parts.push_back(std::move(t));
  }
  if (parts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no rows of '", name, "'"));
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::HostUninitialized(parts[0].dtype(),
                                                         {rows, shape[1]}));
  auto* to = static_cast<uint8_t*>(out.raw());
  for (const Tensor& t : parts) {
    std::memcpy(to, t.raw(), t.bytes());
    to += t.bytes();
  }
  return out;
}

// [begin, end) runs of `rows(i)` over i in [i0, i1), consecutive ones
// merged: the rows of a few heads spread over a fused matrix.
std::vector<std::pair<int64_t, int64_t>> Runs(
    int64_t i0, int64_t i1,
    const std::function<std::pair<int64_t, int64_t>(int64_t)>& rows) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t i = i0; i < i1; ++i) {
    const auto [r0, r1] = rows(i);
    if (!runs.empty() && runs.back().second == r0) {
      runs.back().second = r1;
    } else {
      runs.push_back({r0, r1});
    }
  }
  return runs;
}

absl::Status LoadGatedDeltaNet(const WeightSource& source, int64_t layer,
                               const ShardSpec& s, LlamaLayerWeights& l) {
  const ModelConfig& c = source.config();
  const std::string p = absl::StrCat("blk.", layer, ".");
  // Plain variables: the lambdas below capture them (clang before 16
  // cannot capture structured bindings).
  const std::pair<int64_t, int64_t> heads = SsmValueHeads(c, s);
  const int64_t v0 = heads.first, v1 = heads.second;
  const int64_t h = c.hidden, dv = c.ssm_v_dim, nv = c.ssm_v_heads;
  const int64_t hk = c.ssm_k_heads, dk = c.ssm_k_dim, r = nv / hk;
  const int64_t qk = 2 * hk * dk, values = nv * dv;
  const int64_t channels = qk + values, w = c.ssm_conv_width;
  if (source.Find(p + "ssm_in.weight") != nullptr) {
    // Older qwen3next files: per key head g, its q, k, its value heads'
    // v, then their z, in one matrix of rows g * S + ...
    const int64_t S = 2 * dk + 2 * r * dv;
    const Shape shape = {hk * S, h};
    const std::string name = p + "ssm_in.weight";
    std::vector<std::pair<int64_t, int64_t>> qk_rows;
    for (int64_t part = 0; part < 2; ++part) {  // Every q, then every k.
      for (int64_t g = 0; g < hk; ++g) {
        qk_rows.push_back({g * S + part * dk, g * S + (part + 1) * dk});
      }
    }
    const auto head_rows = [&](int64_t offset) {
      return Runs(v0, v1, [&](int64_t i) {
        const int64_t at = i / r * S + 2 * dk + offset + i % r * dv;
        return std::pair{at, at + dv};
      });
    };
    ASSIGN_OR_RETURN(l.ssm_qk, LoadRows(source, name, shape, qk_rows));
    ASSIGN_OR_RETURN(l.ssm_v, LoadRows(source, name, shape, head_rows(0)));
    ASSIGN_OR_RETURN(l.ssm_z, LoadRows(source, name, shape, head_rows(r * dv)));
  } else {
    const Shape qkv_shape = {channels, h};
    ASSIGN_OR_RETURN(l.ssm_qk,
                     Load(source, p + "attn_qkv.weight", qkv_shape, 0, qk));
    ASSIGN_OR_RETURN(l.ssm_v, Load(source, p + "attn_qkv.weight", qkv_shape,
                                   qk + v0 * dv, qk + v1 * dv));
    ASSIGN_OR_RETURN(l.ssm_z, Load(source, p + "attn_gate.weight", {values, h},
                                   v0 * dv, v1 * dv));
  }
  if (source.Find(p + "ssm_ba.weight") != nullptr) {
    // qwen3next: per key head g, its value heads' betas, then alphas.
    const auto rows = [&](int64_t offset) {
      return Runs(v0, v1, [&](int64_t i) {
        const int64_t at = i / r * 2 * r + offset + i % r;
        return std::pair{at, at + 1};
      });
    };
    const std::string name = p + "ssm_ba.weight";
    ASSIGN_OR_RETURN(l.ssm_beta, LoadRows(source, name, {2 * nv, h}, rows(0)));
    ASSIGN_OR_RETURN(l.ssm_alpha, LoadRows(source, name, {2 * nv, h}, rows(r)));
  } else {
    ASSIGN_OR_RETURN(l.ssm_beta,
                     Load(source, p + "ssm_beta.weight", {nv, h}, v0, v1));
    ASSIGN_OR_RETURN(l.ssm_alpha,
                     Load(source, p + "ssm_alpha.weight", {nv, h}, v0, v1));
  }
  ASSIGN_OR_RETURN(l.ssm_dt,
                   LoadVectorSlice(source, p + "ssm_dt.bias", nv, v0, v1));
  if (source.Find(p + "ssm_a") != nullptr) {  // GGUF: -exp(A_log) stored.
    ASSIGN_OR_RETURN(l.ssm_a, LoadVectorSlice(source, p + "ssm_a", nv, v0, v1));
  } else {  // Hugging Face's A_log.
    ASSIGN_OR_RETURN(l.ssm_a,
                     LoadVectorSlice(source, p + "ssm_a_log", nv, v0, v1));
    for (float& a : l.ssm_a.f32()) a = -std::exp(a);
  }
  // The convolution's weights are few: f32 whatever the file stores.
  // [C, W] in GGUF, [C, 1, W] in Hugging Face's folders: the same bytes.
  const std::string conv_name = p + "ssm_conv1d.weight";
  const TensorInfo* found = source.Find(conv_name);
  const bool conv3 = found != nullptr && found->shape == Shape{channels, 1, w};
  ASSIGN_OR_RETURN(const TensorInfo* conv_info,
                   source.Require(conv_name, conv3 ? Shape{channels, 1, w}
                                                   : Shape{channels, w}));
  TensorInfo conv_2d = *conv_info;
  conv_2d.shape = {channels, w};
  ASSIGN_OR_RETURN(const Tensor conv, DequantizeTensor(source, conv_2d));
  ASSIGN_OR_RETURN(l.ssm_conv,
                   Tensor::Host(DType::kF32, {qk + (v1 - v0) * dv, w}));
  const float* from = conv.f32().data();
  float* to = l.ssm_conv.f32().data();
  std::copy_n(from, qk * w, to);
  std::copy_n(from + (qk + v0 * dv) * w, (v1 - v0) * dv * w, to + qk * w);
  // The gated norm is stored as its weight in both formats (no offset).
  ASSIGN_OR_RETURN(l.ssm_norm, Load(source, p + "ssm_norm.weight", {dv}));
  ASSIGN_OR_RETURN(Slice out, LoadSlice(source, p + "ssm_out.weight",
                                        {h, values}, 0, -1, v0 * dv, v1 * dv));
  l.ssm_out = std::move(out.w);
  l.ssm_out_offset = out.offset;
  return absl::OkStatus();
}

// Expert e's matrix `kind` ("ffn_gate", "ffn_up": [F, H]; "ffn_down":
// [H, F]) of layer `layer`, as a 2-D tensor of its bytes: a slab of the
// merged 3-D tensor blk.L.<kind>_exps.weight [E, rows, cols] (llama.cpp's
// files), else the tensor blk.L.<kind>.<e>.weight [rows, cols] (Hugging
// Face folders, older Mixtral GGUFs).
struct ExpertMatrix {
  TensorInfo info;
  absl::Span<const uint8_t> data;
  Tensor owned;  // What `data` views when it was made here (gpt-oss's HF).
};

absl::StatusOr<ExpertMatrix> FindExpert(const WeightSource& source,
                                        int64_t layer, const std::string& kind,
                                        int64_t e, int64_t experts,
                                        int64_t rows, int64_t cols) {
  const std::string merged =
      absl::StrCat("blk.", layer, ".", kind, "_exps.weight");
  if (const TensorInfo* m = source.Find(merged); m != nullptr) {
    if (m->shape != Shape{experts, rows, cols}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", merged, "' has shape ", ShapeString(m->shape),
          ", expected ", ShapeString({experts, rows, cols}), " (", experts,
          " experts of ", rows, " x ", cols, ")"));
    }
    ASSIGN_OR_RETURN(const int64_t bytes, BytesFor(m->dtype, rows * cols));
    ExpertMatrix out;
    out.info = TensorInfo{.name = absl::StrCat(merged, "[", e, "]"),
                          .dtype = m->dtype,
                          .shape = {rows, cols},
                          .bytes = static_cast<uint64_t>(bytes)};
    out.data = source.Data(*m).subspan(e * bytes, bytes);
    return out;
  }
  if (HasGptOssExperts(source, layer)) {
    const ModelConfig& c = source.config();
    ExpertMatrix out;
    ASSIGN_OR_RETURN(out.owned,
                     ReadGptOssExpert(source, layer, kind, e, experts,
                                      c.expert_ffn_hidden, c.hidden));
    if (out.owned.dim(0) != rows || out.owned.dim(1) != cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, ": gpt-oss expert ", kind, " is ",
                       ShapeString(out.owned.shape()), ", expected ",
                       ShapeString({rows, cols})));
    }
    out.info =
        TensorInfo{.name = absl::StrCat("blk.", layer, ".", kind, "[", e, "]"),
                   .dtype = out.owned.dtype(),
                   .shape = {rows, cols},
                   .bytes = static_cast<uint64_t>(out.owned.bytes())};
    out.data = absl::MakeConstSpan(static_cast<const uint8_t*>(out.owned.raw()),
                                   out.owned.bytes());
    return out;
  }
  const std::string single =
      absl::StrCat("blk.", layer, ".", kind, ".", e, ".weight");
  const TensorInfo* t = source.Find(single);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "model has no tensor '", merged, "' (nor '", single, "'): layer ",
        layer, " is a mixture of ", experts, " experts"));
  }
  if (t->shape != Shape{rows, cols}) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", single, "' has shape ", ShapeString(t->shape),
                     ", expected ", ShapeString({rows, cols})));
  }
  return ExpertMatrix{*t, source.Data(*t)};
}

// Every tensor a mixture layer needs, checked before anything is read:
// the router and each expert's three matrices.
absl::Status CheckExperts(const WeightSource& source, int64_t layer) {
  const ModelConfig& c = source.config();
  const int64_t f = c.expert_ffn_hidden;
  RETURN_IF_ERROR(
      source
          .Require(absl::StrCat("blk.", layer, ".ffn_gate_inp.weight"),
                   {c.n_experts, c.hidden})
          .status());
  if (HasGptOssExperts(source, layer)) {  // Checked without reading.
    return CheckGptOssExperts(source, layer, c.n_experts, f, c.hidden);
  }
  for (int64_t e = 0; e < c.n_experts; ++e) {
    RETURN_IF_ERROR(
        FindExpert(source, layer, "ffn_gate", e, c.n_experts, f, c.hidden)
            .status());
    RETURN_IF_ERROR(
        FindExpert(source, layer, "ffn_up", e, c.n_experts, f, c.hidden)
            .status());
    RETURN_IF_ERROR(
        FindExpert(source, layer, "ffn_down", e, c.n_experts, c.hidden, f)
            .status());
  }
  return absl::OkStatus();
}

// Rows [r0, r1) x columns [c0, c1) of each held expert's `kind` matrix,
// one after the other (in their format; whole blocks around [c0, c1) as
// LoadSlice does).
absl::StatusOr<Slice> LoadExperts(const WeightSource& source, int64_t layer,
                                  const std::string& kind, const ShardSpec& s,
                                  int64_t rows, int64_t cols, int64_t r0,
                                  int64_t r1, int64_t c0, int64_t c1) {
  const ModelConfig& c = source.config();
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (int64_t e = s.expert_begin; e < s.expert_end; ++e) {
    ASSIGN_OR_RETURN(ExpertMatrix m, FindExpert(source, layer, kind, e,
                                                c.n_experts, rows, cols));
    Tensor part;
    if (IsQuantized(m.info.dtype)) {
      const int64_t block = BlockElems(m.info.dtype);
      const int64_t b0 = c0 / block * block;
      const int64_t b1 = (c1 + block - 1) / block * block;
      ASSIGN_OR_RETURN(part, CopySlice(m.info, m.data, r0, r1, b0, b1));
      offset = c0 - b0;
    } else {
      ASSIGN_OR_RETURN(part, DequantizeSlice(m.info, m.data, r0, r1, c0, c1));
      if (m.info.dtype == DType::kF8E4M3) {
        RETURN_IF_ERROR(ScaleFp8(source, m.info, r0, c0, part));
      }
    }
    parts.push_back(std::move(part));
  }
  if (parts.empty()) return Slice{};
  const int64_t width = parts[0].dim(1), part_rows = parts[0].dim(0);
  ASSIGN_OR_RETURN(
      Tensor all, Tensor::HostUninitialized(
                      parts[0].dtype(),
                      {part_rows * static_cast<int64_t>(parts.size()), width}));
  auto* dst = static_cast<uint8_t*>(all.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.bytes());
    dst += p.bytes();
  }
  return Slice{std::move(all), offset};
}

// Rows [r0, r1) of an f32 matrix, copied.
absl::StatusOr<Tensor> CopyRows(const float* src, int64_t r0, int64_t r1,
                                int64_t cols) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {r1 - r0, cols}));
  std::copy_n(src + r0 * cols, (r1 - r0) * cols, out.f32().data());
  return out;
}

// Multi-head latent attention's tensors of layer `layer` for this shard's
// heads (LlamaLayerWeights::wq_a.. wv_b, wo). The per-head up-projections
// come as llama.cpp writes them today, attn_k_b [heads, R, qk_nope] and
// attn_v_b [heads, vd, R], or as older files (and Hugging Face's kv_b_proj)
// do, one attn_kv_b [heads * (qk_nope + vd), R] whose head blocks are
// qk_nope rows of K, then vd of V: its K rows are transposed here. Both
// are kept in f32 (a few MB per layer: heads x R x (qk_nope + vd)).
absl::Status LoadLatentAttention(const WeightSource& source, int64_t layer,
                                 const ShardSpec& s, LlamaLayerWeights& l) {
  const ModelConfig& c = source.config();
  const std::string p = absl::StrCat("blk.", layer, ".");
  const int64_t H = c.n_heads, d = c.head_dim, r = c.RotaryDims(),
                R = c.kv_lora_rank, nope = d - r, vd = c.v_head_dim;
  const int64_t h0 = s.head_begin, h1 = s.head_end;
  if (c.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(
        l.wq_a, Load(source, p + "attn_q_a.weight", {c.q_lora_rank, c.hidden}));
    ASSIGN_OR_RETURN(l.q_a_norm, LoadNorm(source, p + "attn_q_a_norm.weight",
                                          c.q_lora_rank));
    ASSIGN_OR_RETURN(l.wq_b, Load(source, p + "attn_q_b.weight",
                                  {H * d, c.q_lora_rank}, h0 * d, h1 * d));
  } else {
    ASSIGN_OR_RETURN(l.wq, Load(source, p + "attn_q.weight", {H * d, c.hidden},
                                h0 * d, h1 * d));
  }
  ASSIGN_OR_RETURN(l.wkv_a,
                   Load(source, p + "attn_kv_a_mqa.weight", {R + r, c.hidden}));
  ASSIGN_OR_RETURN(l.kv_a_norm,
                   LoadNorm(source, p + "attn_kv_a_norm.weight", R));
  if (const TensorInfo* kv_b = source.Find(p + "attn_kv_b.weight");
      kv_b != nullptr && source.Find(p + "attn_k_b.weight") == nullptr) {
    RETURN_IF_ERROR(source.Require(kv_b->name, {H * (nope + vd), R}).status());
    ASSIGN_OR_RETURN(Tensor all, DequantizeTensor(source, *kv_b));
    if (kv_b->dtype == DType::kF8E4M3) {
      RETURN_IF_ERROR(ScaleFp8(source, *kv_b, 0, 0, all));
    }
    ASSIGN_OR_RETURN(l.wk_b, Tensor::Host(DType::kF32, {(h1 - h0) * R, nope}));
    ASSIGN_OR_RETURN(l.wv_b, Tensor::Host(DType::kF32, {(h1 - h0) * vd, R}));
    const float* src = all.f32().data();
    for (int64_t h = h0; h < h1; ++h) {
      const float* head = src + h * (nope + vd) * R;
      float* kb = l.wk_b.f32().data() + (h - h0) * R * nope;
      for (int64_t i = 0; i < nope; ++i) {
        for (int64_t j = 0; j < R; ++j) kb[j * nope + i] = head[i * R + j];
      }
      std::copy_n(head + nope * R, vd * R,
                  l.wv_b.f32().data() + (h - h0) * vd * R);
    }
  } else {
    ASSIGN_OR_RETURN(const TensorInfo* kb,
                     source.Require(p + "attn_k_b.weight", {H, R, nope}));
    ASSIGN_OR_RETURN(const TensorInfo* vb,
                     source.Require(p + "attn_v_b.weight", {H, vd, R}));
    // Each as the 2-D matrix of its heads' rows.
    TensorInfo kb2 = *kb, vb2 = *vb;
    kb2.shape = {H * R, nope};
    vb2.shape = {H * vd, R};
    ASSIGN_OR_RETURN(const Tensor k_all, DequantizeTensor(source, kb2));
    ASSIGN_OR_RETURN(const Tensor v_all, DequantizeTensor(source, vb2));
    ASSIGN_OR_RETURN(l.wk_b,
                     CopyRows(k_all.f32().data(), h0 * R, h1 * R, nope));
    ASSIGN_OR_RETURN(l.wv_b, CopyRows(v_all.f32().data(), h0 * vd, h1 * vd, R));
  }
  ASSIGN_OR_RETURN(
      Slice wo, LoadSlice(source, p + "attn_output.weight", {c.hidden, H * vd},
                          0, -1, h0 * vd, h1 * vd));
  l.wo = std::move(wo.w);
  l.wo_offset = wo.offset;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> ExactColumns(const Tensor& w, int64_t offset,
                                    int64_t width) {
  if (w.rank() != 2 || w.memory() != MemoryType::kHost || offset < 0 ||
      width < 0 || offset + width > w.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "columns [", offset, ", ", offset + width, ") of ", w.DebugString()));
  }
  const int64_t rows = w.dim(0), cols = w.dim(1);
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(w.dtype(), cols));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {rows, width}));
  std::vector<float> row(cols);
  const auto* src = static_cast<const uint8_t*>(w.raw());
  for (int64_t r = 0; r < rows; ++r) {
    RETURN_IF_ERROR(
        DequantizeRow(w.dtype(), src + r * row_bytes, cols, row.data()));
    std::copy_n(row.data() + offset, width, out.f32().data() + r * width);
  }
  return out;
}

ShardSpec WholeModelSpec(const ModelConfig& c) {
  return ShardSpec{
      .layer_begin = 0,
      .layer_end = c.n_layers,
      .kv_head_begin = 0,
      .kv_head_end = c.n_kv_heads,
      .head_begin = 0,
      .head_end = c.n_heads,
      .ffn_begin = 0,
      .ffn_end = c.SplitFfn(),
      .expert_begin = 0,
      .expert_end = c.n_experts,
      .dense_ffn_begin = 0,
      .dense_ffn_end = c.is_moe() && c.n_dense_layers > 0 ? c.ffn_hidden : 0,
      .shared_ffn_begin = 0,
      .shared_ffn_end = c.SharedFfn(),
      .vocab_begin = 0,
      .vocab_end = c.vocab_size,
      .vocab_padded = c.vocab_size};
}

int64_t LlamaWeights::bytes() const {
  int64_t total = output_norm.bytes() + lm_head.bytes();
  if (token_embd.raw() != lm_head.raw()) total += token_embd.bytes();
  for (const LlamaLayerWeights& l : layers) {
    for (const Tensor* t : LayerTensors(l)) total += t->bytes();
  }
  return total;
}

int64_t LlamaWeights::bytes_per_step() const {
  const bool tied = token_embd.raw() == lm_head.raw();
  return bytes() - (tied ? 0 : token_embd.bytes());
}

absl::Status RefuseUnbuiltLayers(const ModelConfig& c) {
  if (c.is_hybrid()) {
    return absl::UnimplementedError(absl::StrCat(
        c.architecture,
        ": Gated DeltaNet (linear attention) layers (Qwen3.5, Qwen3-Next) "
        "are built on the CPU only so far; use --device cpu"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source) {
  return LoadLlamaWeights(source, WholeModelSpec(source.config()));
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source,
                                              const ShardSpec& s) {
  return LoadLlamaWeights(source, s, nullptr);
}

LoadProgress LogLoadProgress(std::string who, absl::Duration every) {
  struct State {
    absl::Time start = absl::Now(), last_said = absl::InfinitePast();
    bool said = false;
  };
  auto state = std::make_shared<State>();
  return [who = std::move(who), every, state](int64_t bytes, int done,
                                              int total) {
    const absl::Time now = absl::Now();
    const double mib = static_cast<double>(bytes) / (1 << 20);
    if (done == total) {
      if (state->said) {
        Log("%s: loaded %.0f MiB of weights (%d layers) "
            "in %.1f s",
            who.c_str(), mib, total, absl::ToDoubleSeconds(now - state->start));
      }
      return;
    }
    if (now - state->start < every || now - state->last_said < every) return;
    state->said = true;
    state->last_said = now;
    Log("%s: loading weights: %d of %d layers, %.0f MiB "
        "(%.0f%%), %.0f s so far",
        who.c_str(), done, total, mib, total > 0 ? 100.0 * done / total : 0.0,
        absl::ToDoubleSeconds(now - state->start));
  };
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source,
                                              const ShardSpec& s,
                                              const LoadProgress& progress) {
  int64_t loaded = 0;
  const int layers_total = static_cast<int>(s.layer_end - s.layer_begin);
  const auto report = [&](int done) {
    if (progress) progress(loaded, done, layers_total);
  };
  LlamaWeights w;
  w.config = source.config();
  w.spec = s;
  const ModelConfig& c = w.config;
  const int64_t d = c.head_dim;
  const int64_t q_dim = c.n_heads * d, kv_dim = c.n_kv_heads * d;
  const Shape embd_shape = {c.vocab_size, c.hidden};
  if (s.first_stage()) {
    ASSIGN_OR_RETURN(w.token_embd, Load(source, "token_embd.weight", embd_shape,
                                        s.vocab_begin, s.vocab_end));
  }
  if (s.last_stage()) {
    ASSIGN_OR_RETURN(w.output_norm,
                     LoadNorm(source, "output_norm.weight", c.hidden));
    ASSIGN_OR_RETURN(
        Tensor head,
        Load(source, c.tied_embeddings ? "token_embd.weight" : "output.weight",
             embd_shape, s.vocab_begin, s.vocab_end));
    if (s.vocab_padded == s.vocab_end - s.vocab_begin) {
      w.lm_head = std::move(head);
    } else {
      // Zero rows up to the padded size give logits that are cut off after
      // the all-gather.
      ASSIGN_OR_RETURN(w.lm_head,
                       Tensor::Host(head.dtype(), {s.vocab_padded, c.hidden}));
      std::memcpy(w.lm_head.raw(), head.raw(), head.bytes());
    }
    if (s.first_stage() && c.tied_embeddings &&
        w.lm_head.shape() == w.token_embd.shape()) {
      w.lm_head = w.token_embd;  // Share one copy.
    }
  }
  // A mixture's tensors are all checked before any layer is read: a file
  // that lacks an expert or gives it the wrong shape is refused whole.
  for (int64_t i = s.layer_begin; i < s.layer_end; ++i) {
    if (c.LayerIsMoe(i)) RETURN_IF_ERROR(CheckExperts(source, i));
  }
  loaded = w.bytes();  // The embeddings, head and final norm so far.
  report(0);
  const int64_t q0 = s.head_begin * d, q1 = s.head_end * d;
  const int64_t k0 = s.kv_head_begin * d, k1 = s.kv_head_end * d;
  // Qwen3.5's gated attention: each head's query rows, then its gate's.
  const int64_t qg = c.attention_gate ? 2 : 1;
  for (int64_t i = s.layer_begin; i < s.layer_end; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    LlamaLayerWeights l;
    ASSIGN_OR_RETURN(l.attn_norm,
                     LoadNorm(source, p + "attn_norm.weight", c.hidden));
    if (c.LayerIsLinear(i)) {
      RETURN_IF_ERROR(LoadGatedDeltaNet(source, i, s, l));
    } else if (c.is_mla()) {
      RETURN_IF_ERROR(LoadLatentAttention(source, i, s, l));
    } else {
      ASSIGN_OR_RETURN(l.wq, Load(source, p + "attn_q.weight",
                                  {qg * q_dim, c.hidden}, qg * q0, qg * q1));
      ASSIGN_OR_RETURN(
          l.wk, Load(source, p + "attn_k.weight", {kv_dim, c.hidden}, k0, k1));
      ASSIGN_OR_RETURN(
          l.wv, Load(source, p + "attn_v.weight", {kv_dim, c.hidden}, k0, k1));
      if (c.attention_bias) {
        ASSIGN_OR_RETURN(
            l.bq, LoadVectorSlice(source, p + "attn_q.bias", q_dim, q0, q1));
        ASSIGN_OR_RETURN(
            l.bk, LoadVectorSlice(source, p + "attn_k.bias", kv_dim, k0, k1));
        ASSIGN_OR_RETURN(
            l.bv, LoadVectorSlice(source, p + "attn_v.bias", kv_dim, k0, k1));
      }
      ASSIGN_OR_RETURN(Slice wo, LoadSlice(source, p + "attn_output.weight",
                                           {c.hidden, q_dim}, 0, -1, q0, q1));
      l.wo = std::move(wo.w);
      l.wo_offset = wo.offset;
      if (c.attention_sinks) {
        ASSIGN_OR_RETURN(
            l.sinks, LoadVectorSlice(source, p + "attn_sinks.weight", c.n_heads,
                                     s.head_begin, s.head_end));
      }
      if (c.output_bias) {
        ASSIGN_OR_RETURN(l.bo,
                         Load(source, p + "attn_output.bias", {c.hidden}));
      }
    }
    if (c.qk_norm && !c.LayerIsLinear(i)) {
      ASSIGN_OR_RETURN(l.q_norm,
                       LoadNorm(source, p + "attn_q_norm.weight", c.head_dim));
      ASSIGN_OR_RETURN(l.k_norm,
                       LoadNorm(source, p + "attn_k_norm.weight", c.head_dim));
    }
    // llama.cpp names GLM-4.5's and gpt-oss's FFN norm (transformers'
    // post_attention_layernorm) post_attention_norm.
    const std::string ffn_norm =
        (c.architecture == "glm4moe" || c.architecture == "gpt-oss" ||
         c.architecture == "gpt_oss" || c.architecture == "qwen35" ||
         c.architecture == "qwen35moe" || c.architecture == "qwen3next") &&
                source.Find(p + "ffn_norm.weight") == nullptr
            ? p + "post_attention_norm.weight"
            : p + "ffn_norm.weight";
    ASSIGN_OR_RETURN(l.ffn_norm, LoadNorm(source, ffn_norm, c.hidden));
    if (c.post_norms) {
      ASSIGN_OR_RETURN(
          l.post_attn_norm,
          LoadNorm(source, p + "post_attention_norm.weight", c.hidden));
      ASSIGN_OR_RETURN(l.post_ffn_norm,
                       LoadNorm(source, p + "post_ffw_norm.weight", c.hidden));
    }
    if (c.LayerIsMoe(i)) {
      const int64_t f = c.expert_ffn_hidden;
      ASSIGN_OR_RETURN(l.router, Load(source, p + "ffn_gate_inp.weight",
                                      {c.n_experts, c.hidden}));
      ASSIGN_OR_RETURN(Slice gate,
                       LoadExperts(source, i, "ffn_gate", s, f, c.hidden,
                                   s.ffn_begin, s.ffn_end, 0, c.hidden));
      ASSIGN_OR_RETURN(Slice up,
                       LoadExperts(source, i, "ffn_up", s, f, c.hidden,
                                   s.ffn_begin, s.ffn_end, 0, c.hidden));
      ASSIGN_OR_RETURN(Slice down,
                       LoadExperts(source, i, "ffn_down", s, c.hidden, f, 0,
                                   c.hidden, s.ffn_begin, s.ffn_end));
      l.exp_gate = std::move(gate.w);
      l.exp_up = std::move(up.w);
      l.exp_down = std::move(down.w);
      l.exp_down_offset = down.offset;
      if (c.expert_score_bias) {
        ASSIGN_OR_RETURN(l.router_bias,
                         Load(source, p + "exp_probs_b.bias", {c.n_experts}));
      }
      if (c.expert_biases) {
        const int64_t e0 = s.expert_begin, e1 = s.expert_end;
        ASSIGN_OR_RETURN(l.router_logit_bias,
                         Load(source, p + "ffn_gate_inp.bias", {c.n_experts}));
        if (source.Find(p + "ffn_gate_up_exps.bias") != nullptr) {
          // gpt-oss's Hugging Face form: gate and up interleaved.
          for (const bool up : {false, true}) {
            ASSIGN_OR_RETURN(
                *(up ? &l.exp_up_b : &l.exp_gate_b),
                ReadGptOssGateUpBias(source, i, up, c.n_experts, f, e0, e1,
                                     s.ffn_begin, s.ffn_end));
          }
        }
        for (auto [kind, out] : {std::pair{"ffn_gate_exps.bias", &l.exp_gate_b},
                                 std::pair{"ffn_up_exps.bias", &l.exp_up_b}}) {
          if (!out->empty()) break;
          ASSIGN_OR_RETURN(Slice b,
                           LoadSlice(source, p + kind, {c.n_experts, f}, e0, e1,
                                     s.ffn_begin, s.ffn_end));
          *out = std::move(b.w);
        }
        if (s.ffn_begin == 0) {
          ASSIGN_OR_RETURN(l.exp_down_b, Load(source, p + "ffn_down_exps.bias",
                                              {c.n_experts, c.hidden}, e0, e1));
        }
      }
      if (c.n_shared_experts > 0) {
        const int64_t sf = c.SharedFfn();
        ASSIGN_OR_RETURN(
            l.shared_gate,
            Load(source, p + "ffn_gate_shexp.weight", {sf, c.hidden},
                 s.shared_ffn_begin, s.shared_ffn_end));
        ASSIGN_OR_RETURN(l.shared_up,
                         Load(source, p + "ffn_up_shexp.weight", {sf, c.hidden},
                              s.shared_ffn_begin, s.shared_ffn_end));
        ASSIGN_OR_RETURN(
            Slice sdown,
            LoadSlice(source, p + "ffn_down_shexp.weight", {c.hidden, sf}, 0,
                      -1, s.shared_ffn_begin, s.shared_ffn_end));
        l.shared_down = std::move(sdown.w);
        l.shared_down_offset = sdown.offset;
        if (c.shared_expert_gate) {
          // [hidden] in GGUF, [1, hidden] in Hugging Face's folders.
          const std::string gate = p + "ffn_gate_inp_shexp.weight";
          const TensorInfo* info = source.Find(gate);
          if (info != nullptr && info->shape == Shape{1, c.hidden}) {
            ASSIGN_OR_RETURN(l.shared_gate_inp,
                             Load(source, gate, {1, c.hidden}));
            ASSIGN_OR_RETURN(l.shared_gate_inp,
                             l.shared_gate_inp.Reshaped({c.hidden}));
          } else {
            ASSIGN_OR_RETURN(l.shared_gate_inp, Load(source, gate, {c.hidden}));
          }
        }
      }
    } else {
      const auto [f0, f1] = DenseFfnColumns(c, s);
      ASSIGN_OR_RETURN(l.w_gate, Load(source, p + "ffn_gate.weight",
                                      {c.ffn_hidden, c.hidden}, f0, f1));
      ASSIGN_OR_RETURN(l.w_up, Load(source, p + "ffn_up.weight",
                                    {c.ffn_hidden, c.hidden}, f0, f1));
      ASSIGN_OR_RETURN(Slice down,
                       LoadSlice(source, p + "ffn_down.weight",
                                 {c.hidden, c.ffn_hidden}, 0, -1, f0, f1));
      l.w_down = std::move(down.w);
      l.w_down_offset = down.offset;
    }
    for (const Tensor* t : LayerTensors(l)) loaded += t->bytes();
    w.layers.push_back(std::move(l));
    report(static_cast<int>(w.layers.size()));
  }
  if (layers_total == 0) report(0);
  if (progress && c.is_moe()) {
    // Which experts this rank holds, for an operator reading the logs.
    Log("shard pp %d tp %d: experts %lld-%lld of %lld "
        "(%s), FFN columns %lld-%lld of each; %.1f MiB of weights",
        s.pp_rank, s.tp_rank, static_cast<long long>(s.expert_begin),
        static_cast<long long>(s.expert_end - 1),
        static_cast<long long>(c.n_experts),
        s.n_experts() == c.n_experts && s.tp_size > 1 ? "tp" : "ep",
        static_cast<long long>(s.ffn_begin),
        static_cast<long long>(s.ffn_end - 1), w.bytes() / 1048576.0);
  }
  return w;
}

}  // namespace shardlm
