#include "worker/cpu_forward_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/add/add.h"
#include "kernels/attention/latent_attention.h"
#include "kernels/check_args.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"

namespace shardlm {
namespace {

// A host f32 vector's values, or none when it is empty.
absl::Span<const float> Sinks(const Tensor& sinks) {
  if (sinks.empty()) return {};
  return absl::Span<const float>(sinks.data<float>(), sinks.numel());
}

}  // namespace

absl::Status CpuForwardOps::Embed(const Tensor& table, int64_t vocab_begin,
                                  Tensor& x) {
  return Embedding(table, step_.tokens, vocab_begin, x);
}

absl::Status CpuForwardOps::RmsNorm(const Tensor& x, const Tensor& weight,
                                    float eps, Tensor& out) {
  return shardlm::RmsNorm(x, weight, eps, out);
}

absl::Status CpuForwardOps::Linear(const Tensor& x, const Tensor& w, Tensor& y,
                                   bool accumulate) {
  return shardlm::Linear(x, w, y, accumulate);
}

absl::Status CpuForwardOps::Rope(Tensor& x, const RopeTable& rope) {
  return shardlm::Rope(x, step_.positions, rope);
}

absl::Status CpuForwardOps::WriteKv(const Tensor& k, const Tensor& v,
                                    const KvLayer& cache) {
  return shardlm::WriteKv(k, v, batch_, cache.k, cache.v);
}

absl::Status CpuForwardOps::Attention(const Tensor& q, const KvLayer& cache,
                                      const LayerAttention& layer,
                                      Tensor& out) {
  batch_.window = layer.window;  // Layers differ (Qwen2's max_window_layers).
  batch_.softcap = layer.softcap;
  batch_.sinks = Sinks(layer.sinks);
  return PagedAttention(q, cache.k, cache.v, batch_, layer.scale, out);
}

absl::Status CpuForwardOps::AttentionPartial(const Tensor& q,
                                             const KvLayer& cache,
                                             const LayerAttention& layer,
                                             Tensor& out, Tensor& lse) {
  batch_.window = layer.window;
  batch_.softcap = layer.softcap;
  batch_.sinks = Sinks(layer.sinks);  // Left to MergeAttention.
  return PagedAttentionPartial(q, cache.k, cache.v, batch_, layer.scale, out,
                               lse);
}

absl::Status CpuForwardOps::MergeAttention(const Tensor& outs,
                                           const Tensor& lses,
                                           const Tensor& sinks, Tensor& out) {
  return shardlm::MergeAttention(outs, lses, out, Sinks(sinks));
}

absl::Status CpuForwardOps::SwiGluOai(const Tensor& gate, const Tensor& up,
                                      Tensor& out) {
  RETURN_IF_ERROR(CheckHostF32("SwiGluOai", "gate", gate, gate.shape()));
  RETURN_IF_ERROR(CheckHostF32("SwiGluOai", "up", up, gate.shape()));
  RETURN_IF_ERROR(CheckHostF32("SwiGluOai", "out", out, gate.shape()));
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const float x = std::min(g[i], kLimit);
    const float y = std::clamp(u[i], -kLimit, kLimit);
    o[i] = x / (1.0f + std::exp(-kAlpha * x)) * (y + 1.0f);
  }
  return absl::OkStatus();
}

namespace {

// x [n, heads, dx] and y [n, heads, dy] host f32, and columns [x_offset,
// x_offset + i) and [y_offset, y_offset + o) inside their heads.
absl::Status CheckHeadColumns(const char* op, const Tensor& x, int64_t x_offset,
                              int64_t i, const Tensor& y, int64_t y_offset,
                              int64_t o) {
  if (x.rank() != 3 || y.rank() != 3 || x.dtype() != DType::kF32 ||
      y.dtype() != DType::kF32 || x.dim(0) != y.dim(0) ||
      x.dim(1) != y.dim(1) || x_offset < 0 || x_offset + i > x.dim(2) ||
      y_offset < 0 || y_offset + o > y.dim(2)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": columns [", x_offset, ", ", x_offset + i, ") of x ",
                     x.DebugString(), " into [", y_offset, ", ", y_offset + o,
                     ") of y ", y.DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuForwardOps::HeadLinear(const Tensor& x, int64_t x_offset,
                                       const Tensor& w, Tensor& y,
                                       int64_t y_offset) {
  const int64_t heads = x.rank() == 3 ? x.dim(1) : 0;
  if (w.rank() != 2 || heads == 0 || w.dim(0) % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HeadLinear: w ", w.DebugString(), " for x ", x.DebugString()));
  }
  const int64_t n = x.dim(0), i = w.dim(1), o = w.dim(0) / heads;
  RETURN_IF_ERROR(
      CheckHeadColumns("HeadLinear", x, x_offset, i, y, y_offset, o));
  // Each head's columns gathered, multiplied by its rows of w, scattered.
  ASSIGN_OR_RETURN(Tensor in, Tensor::Host(DType::kF32, {n, i}));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, {n, o}));
  const int64_t dx = x.dim(2), dy = y.dim(2);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(x.f32().data() + (t * heads + h) * dx + x_offset, i,
                  in.f32().data() + t * i);
    }
    ASSIGN_OR_RETURN(const Tensor wh, w.Rows(h * o, (h + 1) * o));
    RETURN_IF_ERROR(shardlm::Linear(in, wh, out, false));
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(out.f32().data() + t * o, o,
                  y.f32().data() + (t * heads + h) * dy + y_offset);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuForwardOps::CopyHeadColumns(const Tensor& x, int64_t x_offset,
                                            int64_t width, Tensor& y,
                                            int64_t y_offset) {
  RETURN_IF_ERROR(CheckHeadColumns("CopyHeadColumns", x, x_offset, width, y,
                                   y_offset, width));
  const int64_t rows = x.dim(0) * x.dim(1), dx = x.dim(2), dy = y.dim(2);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.f32().data() + r * dx + x_offset, width,
                y.f32().data() + r * dy + y_offset);
  }
  return absl::OkStatus();
}

absl::Status CpuForwardOps::WriteLatent(const Tensor& first,
                                        const Tensor& second,
                                        const KvLayer& cache) {
  return shardlm::WriteLatent(first, second, batch_, cache.k);
}

absl::Status CpuForwardOps::LatentAttention(const Tensor& q,
                                            const KvLayer& cache, float scale,
                                            int64_t window,
                                            int64_t value_offset, Tensor& out) {
  batch_.window = window;
  return shardlm::LatentAttention(q, cache.k, batch_, scale, value_offset, out);
}

absl::Status CpuForwardOps::SwiGlu(const Tensor& gate, const Tensor& up,
                                   Tensor& out) {
  return shardlm::SwiGlu(gate, up, out);
}

absl::Status CpuForwardOps::GeGlu(const Tensor& gate, const Tensor& up,
                                  Tensor& out) {
  return shardlm::GeGlu(gate, up, out);
}

absl::Status CpuForwardOps::Add(Tensor& x, const Tensor& y) {
  return AddInPlace(x, y);
}

absl::Status CpuForwardOps::Scale(Tensor& x, float factor) {
  RETURN_IF_ERROR(CheckHostF32("Scale", "x", x, x.shape()));
  for (float& v : x.f32()) v *= factor;
  return absl::OkStatus();
}

absl::Status CpuForwardOps::SoftCap(Tensor& x, float cap) {
  RETURN_IF_ERROR(CheckHostF32("SoftCap", "x", x, x.shape()));
  if (!(cap > 0) || !std::isfinite(cap)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftCap: cap ", cap, " must be positive and finite"));
  }
  for (float& v : x.f32()) v = cap * std::tanh(v / cap);
  return absl::OkStatus();
}

absl::Status CpuForwardOps::AddBias(Tensor& x, const Tensor& bias) {
  return shardlm::AddBias(x, bias);
}

absl::Status CpuForwardOps::GatherLogitRows(const Tensor& x, Tensor& out) {
  const int64_t m = static_cast<int64_t>(step_.logit_rows.size());
  if (x.dtype() != DType::kF32 || out.dtype() != DType::kF32 || x.rank() != 2 ||
      x.dim(1) != hidden_ || out.rank() != 2 || out.dim(0) != m ||
      out.dim(1) != hidden_) {
    return absl::InvalidArgumentError(
        absl::StrCat("GatherLogitRows: x ", x.DebugString(), " and out ",
                     out.DebugString(), " for ", m, " rows of ", hidden_));
  }
  for (int64_t r = 0; r < m; ++r) {
    const int32_t row = step_.logit_rows[r];
    if (row == -1) {  // Another CP rank's (sequence parallel).
      std::fill_n(out.f32().data() + r * hidden_, hidden_, 0.0f);
      continue;
    }
    if (row < 0 || row >= x.dim(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherLogitRows: row ", row, " of ", x.dim(0)));
    }
    std::copy_n(x.f32().data() + row * hidden_, hidden_,
                out.f32().data() + r * hidden_);
  }
  return absl::OkStatus();
}

absl::Status CpuForwardOps::CompactRows(Tensor& x, int64_t slot,
                                        absl::Span<const int64_t> counts) {
  const int64_t parts = static_cast<int64_t>(counts.size());
  if (x.dtype() != DType::kF32 || x.rank() != 2 || x.dim(0) != parts * slot) {
    return absl::InvalidArgumentError(
        absl::StrCat("CompactRows: x ", x.DebugString(), " for ", parts,
                     " parts of ", slot, " rows"));
  }
  const int64_t c = x.dim(1);
  float* data = x.f32().data();
  int64_t row = 0;
  for (int64_t i = 0; i < parts; ++i) {
    if (counts[i] < 0 || counts[i] > slot) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CompactRows: part of ", counts[i], " rows in a slot of ", slot));
    }
    // Moves towards row 0 (row <= i * slot), so parts already placed are
    // never overwritten; the ranges may overlap.
    std::memmove(data + row * c, data + i * slot * c,
                 counts[i] * c * sizeof(float));
    row += counts[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CpuForwardOps::PadColumns(const Tensor& x,
                                                 int64_t offset,
                                                 int64_t width) {
  const int64_t n = x.dim(0), cols = x.dim(1);
  if (offset < 0 || offset + cols > width) {
    return absl::InvalidArgumentError(absl::StrCat("PadColumns: ", cols,
                                                   " columns at ", offset,
                                                   " do not fit in ", width));
  }
  if (padded_.numel() < n * width) {
    ASSIGN_OR_RETURN(padded_, Tensor::Host(DType::kF32, {n * width}));
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::View(DType::kF32, {n, width},
                                            padded_.raw(), MemoryType::kHost));
  float* dst = out.f32().data();
  std::fill_n(dst, n * width, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(x.f32().data() + r * cols, cols, dst + r * width + offset);
  }
  return out;
}

absl::Status CpuForwardOps::GatherRows(const Tensor& x,
                                       absl::Span<const int32_t> rows,
                                       Tensor& out) {
  const int64_t c = x.dim(1);
  if (out.dim(0) != static_cast<int64_t>(rows.size()) || out.dim(1) != c) {
    return absl::InvalidArgumentError("GatherRows: output shape");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= x.dim(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherRows: row ", rows[i], " of ", x.dim(0)));
    }
    std::copy_n(x.f32().data() + rows[i] * c, c, out.f32().data() + i * c);
  }
  return absl::OkStatus();
}

absl::Status CpuForwardOps::ScatterAddRows(const Tensor& y,
                                           absl::Span<const int32_t> rows,
                                           absl::Span<const float> weights,
                                           Tensor& out) {
  const int64_t c = out.dim(1);
  if (y.dim(0) != static_cast<int64_t>(rows.size()) || y.dim(1) != c ||
      weights.size() != rows.size()) {
    return absl::InvalidArgumentError("ScatterAddRows: shapes");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= out.dim(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ScatterAddRows: row ", rows[i], " of ", out.dim(0)));
    }
    const float* src = y.f32().data() + i * c;
    float* dst = out.f32().data() + rows[i] * c;
    for (int64_t j = 0; j < c; ++j) dst[j] += weights[i] * src[j];
  }
  return absl::OkStatus();
}

absl::Status CpuForwardOps::Zero(Tensor& x) {
  std::fill(x.f32().begin(), x.f32().end(), 0.0f);
  return absl::OkStatus();
}

}  // namespace shardlm
