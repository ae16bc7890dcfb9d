#include "worker/cpu_forward_ops.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/add/add.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"

namespace shardlm {

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
                                      float scale, int64_t window,
                                      Tensor& out) {
  batch_.window = window;  // Layers differ (Qwen2's max_window_layers).
  return PagedAttention(q, cache.k, cache.v, batch_, scale, out);
}

absl::Status CpuForwardOps::AttentionPartial(const Tensor& q,
                                             const KvLayer& cache, float scale,
                                             int64_t window, Tensor& out,
                                             Tensor& lse) {
  batch_.window = window;
  return PagedAttentionPartial(q, cache.k, cache.v, batch_, scale, out, lse);
}

absl::Status CpuForwardOps::MergeAttention(const Tensor& outs,
                                           const Tensor& lses, Tensor& out) {
  return shardlm::MergeAttention(outs, lses, out);
}

absl::Status CpuForwardOps::SwiGlu(const Tensor& gate, const Tensor& up,
                                   Tensor& out) {
  return shardlm::SwiGlu(gate, up, out);
}

absl::Status CpuForwardOps::Add(Tensor& x, const Tensor& y) {
  return AddInPlace(x, y);
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
