// Validation and dispatch of the CUDA Gated DeltaNet ops (cuda_ops.h):
// every argument is checked before the first launch, so a refused call
// changes no state.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cuda_status.h"
#include "core/status.h"
#include "kernels/check_args.h"
#include "kernels/cuda_launch.h"
#include "kernels/cuda_ops.h"

namespace shardlm {
namespace {

constexpr char kOp[] = "GatedDeltaNetCuda";

cudaStream_t S(const CudaExec& exec) {
  return static_cast<cudaStream_t>(exec.stream);
}

absl::Status CheckRuns(absl::Span<const CudaDeltaRun> runs, int64_t n,
                       int64_t slots) {
  int64_t next = 0;
  std::vector<char> used(static_cast<size_t>(slots), 0);
  for (const CudaDeltaRun& r : runs) {
    if (r.begin != next || r.end <= r.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": run [", r.begin, ", ", r.end, ") does not follow token ",
          next, "; the runs must cover the step's tokens in order"));
    }
    if (r.slot < 0 || r.slot >= slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": state slot ", r.slot, " is outside the ", slots, " held"));
    }
    if (used[r.slot]++) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": state slot ", r.slot, " has two runs"));
    }
    next = r.end;
  }
  if (next != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": the runs cover ", next, " of the step's ", n, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GatedDeltaNetCuda(
    const Tensor& qk, const Tensor& v, const Tensor& z, const Tensor& beta_in,
    const Tensor& alpha_in, const Tensor& conv_weight, const Tensor& dt,
    const Tensor& a, const Tensor& norm, float eps,
    const GatedDeltaNetShape& sh, absl::Span<const CudaDeltaRun> runs,
    Tensor& conv_state, Tensor& recurrent_state, Tensor& conv_out, Tensor& o,
    Tensor& out, const CudaExec& exec) {
  if (qk.rank() != 2 || conv_weight.rank() != 2 || conv_state.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp,
                     ": qk, conv_weight and conv_state must be [n, c], "
                     "[c, taps] and [slots, taps - 1, c]"));
  }
  if (sh.k_heads <= 0 || sh.v_heads <= 0 || sh.k_dim <= 0 || sh.v_dim <= 0 ||
      sh.total_v_heads() % sh.k_heads != 0 ||
      sh.v_head_begin + sh.v_heads > sh.total_v_heads()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": value heads [", sh.v_head_begin, ", ",
                     sh.v_head_begin + sh.v_heads, ") of ", sh.total_v_heads(),
                     " over ", sh.k_heads, " key heads"));
  }
  if (sh.k_dim > cuda::kMaxDeltaKeyDim) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": key head dimension ",
                                                   sh.k_dim, " above ",
                                                   cuda::kMaxDeltaKeyDim));
  }
  const int64_t n = qk.dim(0), nqk = 2 * sh.k_heads * sh.k_dim;
  const int64_t nv = sh.v_heads * sh.v_dim, ch = nqk + nv;
  const int64_t taps = conv_weight.dim(1), slots = conv_state.dim(0);
  if (taps < 2 || taps > cuda::kMaxConvTaps) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ", taps, " convolution taps; 2 to ",
                     cuda::kMaxConvTaps, " are built"));
  }
  const auto f32 = {DType::kF32};
  RETURN_IF_ERROR(CheckDevice(kOp, "qk", qk, {n, nqk}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "v", v, {n, nv}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "z", z, {n, nv}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "beta_in", beta_in, {n, sh.v_heads}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "alpha_in", alpha_in, {n, sh.v_heads}, f32));
  RETURN_IF_ERROR(
      CheckDevice(kOp, "conv_weight", conv_weight, {ch, taps}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "dt", dt, {sh.v_heads}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "a", a, {sh.v_heads}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "norm", norm, {sh.v_dim}, f32));
  RETURN_IF_ERROR(
      CheckDevice(kOp, "conv_state", conv_state, {slots, taps - 1, ch}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "recurrent_state", recurrent_state,
                              {slots, sh.v_heads, sh.k_dim, sh.v_dim}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "conv_out", conv_out, {n, ch}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "o", o, {n, nv}, f32));
  RETURN_IF_ERROR(CheckDevice(kOp, "out", out, {n, nv}, f32));
  RETURN_IF_ERROR(CheckRuns(runs, n, slots));
  if (n > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", n, " tokens"));
  }
  const cuda::DeltaShape shape{
      .k_heads = static_cast<int>(sh.k_heads),
      .v_heads = static_cast<int>(sh.v_heads),
      .k_dim = static_cast<int>(sh.k_dim),
      .v_dim = static_cast<int>(sh.v_dim),
      .v_tiled = sh.v_tiled,
      .v_head_begin = static_cast<int>(sh.v_head_begin),
      .v_heads_total = static_cast<int>(sh.total_v_heads())};
  // The runs by value in each launch's parameters (a graph captures them),
  // kDeltaRunsPerLaunch at a time.
  for (size_t first = 0; first < runs.size();
       first += cuda::kDeltaRunsPerLaunch) {
    cuda::DeltaRuns batch;
    for (size_t i = first;
         i < runs.size() && batch.count < cuda::kDeltaRunsPerLaunch; ++i) {
      const int k = batch.count++;
      batch.begin[k] = static_cast<int>(runs[i].begin);
      batch.end[k] = static_cast<int>(runs[i].end);
      batch.slot[k] = runs[i].slot;
      batch.fresh[k] = runs[i].fresh ? 1 : 0;
    }
    RETURN_IF_ERROR(CudaStatus(
        cuda::CausalConv1dSilu(qk.data<float>(), v.data<float>(), nqk, nv,
                               conv_weight.data<float>(),
                               static_cast<int>(taps), conv_state.data<float>(),
                               batch, conv_out.data<float>(), S(exec)),
        kOp));
    RETURN_IF_ERROR(CudaStatus(
        cuda::GatedDeltaRule(
            conv_out.data<float>(), beta_in.data<float>(),
            alpha_in.data<float>(), dt.data<float>(), a.data<float>(), shape,
            recurrent_state.data<float>(), batch, o.data<float>(), S(exec)),
        kOp));
  }
  return CudaStatus(cuda::GatedRmsNorm(o.data<float>(), z.data<float>(),
                                       norm.data<float>(), eps, n * sh.v_heads,
                                       sh.v_dim, out.data<float>(), S(exec)),
                    kOp);
}

absl::Status SigmoidGateCuda(Tensor& x, const Tensor& gate,
                             const CudaExec& exec) {
  constexpr char kGate[] = "SigmoidGateCuda";
  if (x.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kGate, ": x is ", x.DebugString(), "; expected [n, c]"));
  }
  const int64_t n = x.dim(0), c = x.dim(1);
  const bool per_row = gate.rank() == 2 && gate.dim(1) == 1 && c != 1;
  RETURN_IF_ERROR(CheckDevice(kGate, "x", x, {n, c}, {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice(kGate, "gate", gate, {n, per_row ? 1 : c}, {DType::kF32}));
  return CudaStatus(cuda::SigmoidGate(x.data<float>(), gate.data<float>(), n, c,
                                      per_row, S(exec)),
                    kGate);
}

}  // namespace shardlm
