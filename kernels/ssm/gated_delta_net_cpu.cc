// The CPU Gated DeltaNet steps (gated_delta_net.h). The delta rule runs its
// recurrent form, one OpenMP item per value head (heads are independent),
// vectorized over the value dimension: ~4 k_dim v_dim flops per token and
// head, a few percent of the layer's projections, so no chunked form.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/check_args.h"
#include "kernels/ssm/gated_delta_net.h"
#include "kernels/threading.h"

namespace shardlm {
namespace {

// Whether the memory of `a` and `b` shares a byte.
bool Overlap(const Tensor& a, const Tensor& b) {
  const auto pa = reinterpret_cast<uintptr_t>(a.raw());
  const auto pb = reinterpret_cast<uintptr_t>(b.raw());
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

// InvalidArgument when output `arg` shares memory with one of `others`
// (unless `same_ok` and it is exactly that tensor's memory).
absl::Status CheckApart(
    const char* op, const char* arg, const Tensor& t,
    std::initializer_list<std::pair<const char*, const Tensor*>> others,
    bool same_ok = false) {
  for (const auto& [name, other] : others) {
    if (same_ok && t.raw() == other->raw() && t.bytes() == other->bytes()) {
      continue;
    }
    if (Overlap(t, *other)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", arg, " overlaps ", name));
    }
  }
  return absl::OkStatus();
}

float Silu(float y) { return y / (1.0f + std::exp(-y)); }

// dst = x / sqrt(sum x^2 + 1e-6) * scale, over n values.
void L2Normalize(const float* x, int64_t n, float scale, float* dst) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t e = 0; e < n; ++e) ss += x[e] * x[e];
  const float f = scale / std::sqrt(ss + 1e-6f);
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) dst[e] = x[e] * f;
}

}  // namespace

absl::Status CausalConv1dSilu(const Tensor& x, const Tensor& weight,
                              Tensor& state, Tensor& out) {
  constexpr char kOp[] = "CausalConv1dSilu";
  if (x.rank() != 2 || weight.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x is ", x.DebugString(), " and weight ",
                     weight.DebugString(), "; expected [T, C] and [C, W]"));
  }
  const int64_t n = x.dim(0), ch = x.dim(1), w = weight.dim(1);
  if (n < 1 || ch < 1 || w < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": x is ", x.DebugString(), " and weight ", weight.DebugString(),
        "; expected T >= 1 tokens, C >= 1 channels and W >= 2 taps"));
  }
  RETURN_IF_ERROR(CheckHostF32(kOp, "x", x, {n, ch}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "weight", weight, {ch, w}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "state", state, {w - 1, ch}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "out", out, {n, ch}));
  RETURN_IF_ERROR(CheckApart(kOp, "out", out, {{"x", &x}, {"state", &state}}));
  RETURN_IF_ERROR(CheckApart(kOp, "state", state, {{"x", &x}}));

  // The weight as [W, C], so that each tap's loop over channels reads
  // contiguous values.
  const float* wd = weight.data<float>();
  std::vector<float> taps(w * ch);
  for (int64_t c = 0; c < ch; ++c) {
    for (int64_t j = 0; j < w; ++j) taps[j * ch + c] = wd[c * w + j];
  }
  const float* xd = x.data<float>();
  float* sd = state.data<float>();
  float* od = out.data<float>();
  // Row r of xp = [state; x], without building it.
  const auto row = [&](int64_t r) -> const float* {
    return r < w - 1 ? sd + r * ch : xd + (r - (w - 1)) * ch;
  };
  ParallelForEach(n, n * ch * w > 65536, [&](int64_t t) {
    float* o = od + t * ch;
    std::fill(o, o + ch, 0.0f);
    for (int64_t j = 0; j < w; ++j) {
      const float* xr = row(t + j);
      const float* tj = taps.data() + j * ch;
#pragma omp simd
      for (int64_t c = 0; c < ch; ++c) o[c] += tj[c] * xr[c];
    }
    for (int64_t c = 0; c < ch; ++c) o[c] = Silu(o[c]);
  });
  // The state becomes rows [T, T + W - 1) of xp. Filled in increasing
  // order, each row is read (row T + r >= r + 1) before it is overwritten.
  for (int64_t r = 0; r < w - 1; ++r) {
    std::copy_n(row(n + r), ch, sd + r * ch);
  }
  return absl::OkStatus();
}

absl::Status GatedDeltaRule(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta,
                            const GatedDeltaNetShape& shape, Tensor& state,
                            Tensor& out) {
  constexpr char kOp[] = "GatedDeltaRule";
  const int64_t kh = shape.k_heads, vh = shape.v_heads, dk = shape.k_dim,
                dv = shape.v_dim;
  const int64_t total = shape.total_v_heads(), v0 = shape.v_head_begin;
  if (kh < 1 || vh < 1 || dk < 1 || dv < 1 || total % kh != 0 || v0 < 0 ||
      v0 + vh > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": shape has ", kh, " k heads and v heads [", v0, ", ", v0 + vh,
        ") of ", total, ", of ", dk, " and ", dv,
        "; expected positive sizes, the total a multiple of k_heads"));
  }
  if (q.rank() != 3 || q.dim(0) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": q is ", q.DebugString(),
                     ", expected [T >= 1, k_heads, k_dim]"));
  }
  const int64_t n = q.dim(0);
  RETURN_IF_ERROR(CheckHostF32(kOp, "q", q, {n, kh, dk}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "k", k, {n, kh, dk}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "v", v, {n, vh, dv}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "g", g, {n, vh}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "beta", beta, {n, vh}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "state", state, {vh, dk, dv}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "out", out, {n, vh, dv}));
  RETURN_IF_ERROR(CheckApart(kOp, "out", out,
                             {{"q", &q},
                              {"k", &k},
                              {"v", &v},
                              {"g", &g},
                              {"beta", &beta},
                              {"state", &state}}));
  RETURN_IF_ERROR(CheckApart(
      kOp, "state", state,
      {{"q", &q}, {"k", &k}, {"v", &v}, {"g", &g}, {"beta", &beta}}));

  const int64_t group = total / kh;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float* qd = q.data<float>();
  const float* kd = k.data<float>();
  const float* vd = v.data<float>();
  const float* gd = g.data<float>();
  const float* bd = beta.data<float>();
  float* sd = state.data<float>();
  float* od = out.data<float>();
  // Value heads [begin, end), each with its own state.
  const auto value_heads = [&](int64_t begin, int64_t end) {
    std::vector<float> qn(dk), kn(dk), delta(dv);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = shape.v_tiled ? (v0 + i) % kh : (v0 + i) / group;
      float* s = sd + i * dk * dv;
      for (int64_t t = 0; t < n; ++t) {
        // The key head's normed query and key, again for each value head
        // that reads them: O(k_dim) against the O(k_dim v_dim) below.
        L2Normalize(qd + (t * kh + j) * dk, dk, q_scale, qn.data());
        L2Normalize(kd + (t * kh + j) * dk, dk, 1.0f, kn.data());
        const float decay = std::exp(gd[t * vh + i]);
        const float b = bd[t * vh + i];
        // One pass over S: the decay, and S^T kn of the decayed S.
        std::fill(delta.begin(), delta.end(), 0.0f);
        float* dl = delta.data();
        for (int64_t r = 0; r < dk; ++r) {
          float* sr = s + r * dv;
          const float kr = kn[r];
#pragma omp simd
          for (int64_t c = 0; c < dv; ++c) {
            sr[c] *= decay;
            dl[c] += sr[c] * kr;
          }
        }
        const float* vt = vd + (t * vh + i) * dv;
#pragma omp simd
        for (int64_t c = 0; c < dv; ++c) dl[c] = b * (vt[c] - dl[c]);
        // A second: the rank-one update, and S^T qn of the updated S.
        float* ot = od + (t * vh + i) * dv;
        std::fill(ot, ot + dv, 0.0f);
        for (int64_t r = 0; r < dk; ++r) {
          float* sr = s + r * dv;
          const float kr = kn[r], qr = qn[r];
#pragma omp simd
          for (int64_t c = 0; c < dv; ++c) {
            sr[c] += kr * dl[c];
            ot[c] += qr * sr[c];
          }
        }
      }
    }
  };
  if (vh > 1 && n * vh * dk * dv >= 32768) {
    ParallelFor(vh, value_heads);
  } else {
    value_heads(0, vh);
  }
  return absl::OkStatus();
}

absl::Status GatedRmsNorm(const Tensor& o, const Tensor& z,
                          const Tensor& weight, float eps, Tensor& out) {
  constexpr char kOp[] = "GatedRmsNorm";
  if (o.rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": o is ", o.DebugString(), ", expected [T, heads, d]"));
  }
  const Shape shape = o.shape();
  const int64_t d = shape[2];
  RETURN_IF_ERROR(CheckHostF32(kOp, "o", o, shape));
  RETURN_IF_ERROR(CheckHostF32(kOp, "z", z, shape));
  RETURN_IF_ERROR(CheckHostF32(kOp, "weight", weight, {d}));
  RETURN_IF_ERROR(CheckHostF32(kOp, "out", out, shape));
  // out may be o or z exactly: a row's sum of squares is taken before any
  // of it is written, and each value of out after o and z are read there.
  RETURN_IF_ERROR(
      CheckApart(kOp, "out", out, {{"o", &o}, {"z", &z}}, /*same_ok=*/true));
  RETURN_IF_ERROR(CheckApart(kOp, "out", out, {{"weight", &weight}}));

  const int64_t rows = shape[0] * shape[1];
  const float* w = weight.data<float>();
  ParallelForEach(rows, rows * d > 65536, [&](int64_t r) {
    const float* x = o.data<float>() + r * d;
    const float* zr = z.data<float>() + r * d;
    float* y = out.data<float>() + r * d;
    double ss = 0;  // Double, as RmsNorm's.
#pragma omp simd reduction(+ : ss)
    for (int64_t e = 0; e < d; ++e) ss += double{x[e]} * x[e];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int64_t e = 0; e < d; ++e) y[e] = x[e] * inv * w[e] * Silu(zr[e]);
  });
  return absl::OkStatus();
}

}  // namespace shardlm
