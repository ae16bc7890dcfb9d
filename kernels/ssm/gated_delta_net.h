// Gated DeltaNet (Qwen3.5's and Qwen3-Next's linear-attention layers), on
// the CPU: the three steps of such a layer between its projections.
//
//   [q | k | v] = CausalConv1dSilu(wqkv h)   (carrying the conv state)
//   o = GatedDeltaRule(q, k, v, g, beta)      (carrying the recurrent state)
//   o = GatedRmsNorm(o, z)                    (z = wz h), then wo o
//
// Each call takes one sequence's T >= 1 consecutive tokens, and its states
// carry over between calls: a sequence split into several calls (chunked
// prefill, then decode one token at a time) gives what one call over all
// its tokens gives. A new sequence starts from zero states.
#ifndef SHARDLM_KERNELS_SSM_GATED_DELTA_NET_H_
#define SHARDLM_KERNELS_SSM_GATED_DELTA_NET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// A depthwise causal convolution over time of W >= 2 taps, then SiLU:
//   out[t, c] = silu(sum_j weight[c, j] * xp[t + j, c]),  j in [0, W)
// where xp = [state; x] ([W - 1 + T, C]), so tap W - 1 multiplies the
// current token; state becomes the last W - 1 rows of xp.
//   x: [T, C], weight: [C, W], state: [W - 1, C] (in/out), out: [T, C],
//   all f32; out and state may not overlap x or each other.
absl::Status CausalConv1dSilu(const Tensor& x, const Tensor& weight,
                              Tensor& state, Tensor& out);

// The heads of a gated delta rule. Value head i reads key (and query) head
// i % k_heads when v_tiled (llama.cpp's converter reorders the value heads
// so), else i / (v_heads / k_heads) (transformers' repeat_interleave).
// A TP rank holds value heads [v_head_begin, v_head_begin + v_heads) of
// v_heads_total (0: v_heads, all of them) and every key head; i above is
// then the global index v_head_begin + h of its head h.
struct GatedDeltaNetShape {
  int64_t k_heads = 0;
  int64_t v_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  bool v_tiled = false;
  int64_t v_head_begin = 0;
  int64_t v_heads_total = 0;  // A multiple of k_heads.
  int64_t total_v_heads() const {
    return v_heads_total > 0 ? v_heads_total : v_heads;
  }
};

// The gated delta rule's recurrence, token by token, for every value head
// i (reading key head j as GatedDeltaNetShape says), with S = state[i]:
//   qn = l2norm(q[t, j]) / sqrt(k_dim),  kn = l2norm(k[t, j])
//   S *= exp(g[t, i])
//   S += kn (beta[t, i] (v[t, i] - S^T kn))^T
//   out[t, i] = S^T qn
// where l2norm(x) = x / sqrt(sum x^2 + 1e-6). All f32:
//   q, k: [T, k_heads, k_dim], v: [T, v_heads, v_dim],
//   g: [T, v_heads] (the log of the decay, <= 0),
//   beta: [T, v_heads] (in (0, 1)),
//   state: [v_heads, k_dim, v_dim] (in/out), out: [T, v_heads, v_dim].
// out and state may not overlap an input or each other.
absl::Status GatedDeltaRule(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta,
                            const GatedDeltaNetShape& shape, Tensor& state,
                            Tensor& out);

// An RMS norm of every head's output, gated by SiLU of z:
//   out[t, h, :] = o[t, h, :] / sqrt(mean(o[t, h, :]^2) + eps) * weight
//                  * silu(z[t, h, :])
//   o, z, out: [T, heads, d] f32 (out may be o or z itself), weight: [d].
absl::Status GatedRmsNorm(const Tensor& o, const Tensor& z,
                          const Tensor& weight, float eps, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SSM_GATED_DELTA_NET_H_
