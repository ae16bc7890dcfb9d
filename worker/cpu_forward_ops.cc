#include "worker/cpu_forward_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/add/add.h"
#include "kernels/attention/latent_attention.h"
#include "kernels/check_args.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/ssm/gated_delta_net.h"
#include "kernels/swiglu/swiglu.h"

namespace shardlm {
namespace {

// A host f32 vector's values, or none when it is empty.
absl::Span<const float> Sinks(const Tensor& sinks) {
  if (sinks.empty()) return {};
  return absl::Span<const float>(sinks.data<float>(), sinks.numel());
}

// `t` as a host f32 tensor of `shape`, reallocated only when it differs.
absl::Status Scratch(Tensor& t, const Shape& shape) {
  if (!t.empty() && t.shape() == shape) return absl::OkStatus();
  ASSIGN_OR_RETURN(t, Tensor::HostUninitialized(DType::kF32, shape));
  return absl::OkStatus();
}

// Row `slot` of a [slots, ...] state tensor as `shape`.
absl::StatusOr<Tensor> Slot(const Tensor& state, int64_t slot,
                            const Shape& shape) {
  if (slot < 0 || slot >= state.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state slot ", slot, " is outside the ", state.dim(0), " held"));
  }
  ASSIGN_OR_RETURN(const Tensor row, state.Rows(slot, slot + 1));
  return row.Reshaped(shape);
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

absl::Status CpuForwardOps::GatedDeltaNet(
    const Tensor& qk, const Tensor& v, const Tensor& z, const Tensor& beta_in,
    const Tensor& alpha_in, const DeltaNetLayer& layer, Tensor& out) {
  constexpr char kOp[] = "GatedDeltaNet";
  const GatedDeltaNetShape& sh = layer.shape;
  const int64_t n = static_cast<int64_t>(step_.tokens.size());
  const int64_t nqk = 2 * sh.k_heads * sh.k_dim, nv = sh.v_heads * sh.v_dim;
  const int64_t ch = nqk + nv, w = layer.conv.dim(1);
  RETURN_IF_ERROR(CheckHostF32(kOp, "qk", qk, {n, nqk}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "v", v, {n, nv}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "z", z, {n, nv}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "beta_in", beta_in, {n, sh.v_heads}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "alpha_in", alpha_in, {n, sh.v_heads}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "conv", layer.conv, {ch, w}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "dt", layer.dt, {sh.v_heads}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "a", layer.a, {sh.v_heads}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "out", out, {n, nv}));
  const int64_t slots =
      layer.conv_state.rank() == 3 ? layer.conv_state.dim(0) : 0;
  RETURN_IF_ERROR(
      CheckHostF32(kOp, "conv_state", layer.conv_state, {slots, w - 1, ch}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "recurrent_state", layer.recurrent_state,
                               {slots, sh.v_heads, sh.k_dim, sh.v_dim}));
  if (step_.state_slots.size() != step_.block_tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": the step has ", step_.state_slots.size(), " state slots for ",
        step_.block_tables.size(), " sequences"));
  }
  RETURN_IF_ERROR(Scratch(mixed_, {n, ch}));
  RETURN_IF_ERROR(Scratch(conv_, {n, ch}));
  RETURN_IF_ERROR(Scratch(q_, {n, sh.k_heads, sh.k_dim}));
  RETURN_IF_ERROR(Scratch(k_, {n, sh.k_heads, sh.k_dim}));
  RETURN_IF_ERROR(Scratch(v_, {n, sh.v_heads, sh.v_dim}));
  RETURN_IF_ERROR(Scratch(o_, {n, sh.v_heads, sh.v_dim}));
  RETURN_IF_ERROR(Scratch(g_, {n, sh.v_heads}));
  RETURN_IF_ERROR(Scratch(beta_, {n, sh.v_heads}));
  // Token-wise: the convolution's input [qk | v] and the gates.
  const float* dt = layer.dt.f32().data();
  const float* a = layer.a.f32().data();
  for (int64_t t = 0; t < n; ++t) {
    float* m = mixed_.f32().data() + t * ch;
    std::copy_n(qk.f32().data() + t * nqk, nqk, m);
    std::copy_n(v.f32().data() + t * nv, nv, m + nqk);
    for (int64_t h = 0; h < sh.v_heads; ++h) {
      const int64_t i = t * sh.v_heads + h;
      const float b = beta_in.f32()[i], x = alpha_in.f32()[i] + dt[h];
      beta_.f32()[i] = 1.0f / (1.0f + std::exp(-b));
      // softplus(x) = log(1 + e^x), computed without overflow.
      const float softplus =
          std::max(x, 0.0f) + std::log1p(std::exp(-std::abs(x)));
      g_.f32()[i] = a[h] * softplus;
    }
  }
  // Each sequence's run of contiguous tokens, all checked before any state
  // is touched (a refused step changes nothing).
  struct Run {
    int64_t begin, end;
    int32_t slot;
  };
  std::vector<Run> runs;
  std::vector<char> ran(step_.state_slots.size(), 0);
  for (int64_t t0 = 0; t0 < n;) {
    const int32_t seq = step_.token_seq[t0];
    int64_t t1 = t0 + 1;
    while (t1 < n && step_.token_seq[t1] == seq) {
      if (step_.positions[t1] != step_.positions[t1 - 1] + 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            kOp, ": sequence ", seq, "'s tokens ", t1 - 1, " and ", t1,
            " are at positions ", step_.positions[t1 - 1], " and ",
            step_.positions[t1], "; a recurrence needs them in order"));
      }
      ++t1;
    }
    if (seq < 0 || static_cast<size_t>(seq) >= ran.size() ||
        std::exchange(ran[seq], char{1})) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": sequence ", seq,
                       "'s tokens are not one contiguous run of the step"));
    }
    const int32_t slot = step_.state_slots[seq];
    if (slot < 0 || slot >= slots) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": sequence ", seq, "'s state slot ", slot,
                       " is outside the ", slots, " held"));
    }
    runs.push_back({t0, t1, slot});
    t0 = t1;
  }
  // Sequence by sequence through its slot.
  for (const auto [t0, t1, slot] : runs) {
    ASSIGN_OR_RETURN(Tensor cs, Slot(layer.conv_state, slot, {w - 1, ch}));
    ASSIGN_OR_RETURN(Tensor rs, Slot(layer.recurrent_state, slot,
                                     {sh.v_heads, sh.k_dim, sh.v_dim}));
    if (step_.positions[t0] == 0) {  // A new (or recomputed) sequence.
      std::fill(cs.f32().begin(), cs.f32().end(), 0.0f);
      std::fill(rs.f32().begin(), rs.f32().end(), 0.0f);
    }
    ASSIGN_OR_RETURN(const Tensor x, mixed_.Rows(t0, t1));
    ASSIGN_OR_RETURN(Tensor c, conv_.Rows(t0, t1));
    RETURN_IF_ERROR(CausalConv1dSilu(x, layer.conv, cs, c));
    // The convolved channels as q, k and v heads.
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = conv_.f32().data() + t * ch;
      const int64_t half = sh.k_heads * sh.k_dim;
      std::copy_n(row, half, q_.f32().data() + t * half);
      std::copy_n(row + half, half, k_.f32().data() + t * half);
      std::copy_n(row + nqk, nv, v_.f32().data() + t * nv);
    }
    ASSIGN_OR_RETURN(const Tensor q, q_.Rows(t0, t1));
    ASSIGN_OR_RETURN(const Tensor k, k_.Rows(t0, t1));
    ASSIGN_OR_RETURN(const Tensor vv, v_.Rows(t0, t1));
    ASSIGN_OR_RETURN(const Tensor g, g_.Rows(t0, t1));
    ASSIGN_OR_RETURN(const Tensor beta, beta_.Rows(t0, t1));
    ASSIGN_OR_RETURN(Tensor o, o_.Rows(t0, t1));
    RETURN_IF_ERROR(GatedDeltaRule(q, k, vv, g, beta, sh, rs, o));
  }
  ASSIGN_OR_RETURN(const Tensor z3, z.Reshaped({n, sh.v_heads, sh.v_dim}));
  ASSIGN_OR_RETURN(Tensor out3, out.Reshaped({n, sh.v_heads, sh.v_dim}));
  return GatedRmsNorm(o_, z3, layer.norm, layer.eps, out3);
}

absl::Status CpuForwardOps::SigmoidGate(Tensor& x, const Tensor& gate) {
  if (x.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SigmoidGate: x is ", x.DebugString(), "; expected [n, c]"));
  }
  RETURN_IF_ERROR(CheckHostF32("SigmoidGate", "x", x, {x.dim(0), x.dim(1)}));
  const bool per_row = gate.rank() == 2 && gate.dim(1) == 1;
  RETURN_IF_ERROR(CheckHostF32("SigmoidGate", "gate", gate,
                               {x.dim(0), per_row ? 1 : x.dim(1)}));
  float* y = x.f32().data();
  const float* g = gate.f32().data();
  const int64_t n = x.dim(0), c = x.dim(1);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < c; ++j) {
      y[r * c + j] /= 1.0f + std::exp(-g[per_row ? r : r * c + j]);
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
