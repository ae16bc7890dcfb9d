// CUDA twins of gated_delta_net_cpu.cc. The delta rule runs its recurrent
// form, as on the CPU: one block per (value head, 128 value columns, run),
// each thread one column of the head's state S [k_dim, v_dim] in
// registers, token after token. A prefill chunk of T tokens is T dependent
// steps of ~4 k_dim flops per thread: correct at any length, fast for
// decode; the chunked (WY) form that turns a long prefill into matrix
// products is not built (docs/design-notes.md, "Hybrid models").
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

__device__ __forceinline__ float Sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// One thread per channel of one run: the taps - 1 rows of the state in
// registers, shifted token by token.
__global__ void ConvKernel(const float* qk, const float* v, int64_t nqk,
                           int64_t nv, const float* weight, int taps,
                           float* state, DeltaRuns runs, float* out) {
  const int64_t ch = nqk + nv;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int r = blockIdx.y;
  if (c >= ch) return;
  float w[kMaxConvTaps], win[kMaxConvTaps];
  float* st = state + static_cast<int64_t>(runs.slot[r]) * (taps - 1) * ch + c;
#pragma unroll
  for (int j = 0; j < kMaxConvTaps; ++j) {
    w[j] = j < taps ? weight[c * taps + j] : 0.0f;
    win[j] = j < taps - 1 && !runs.fresh[r] ? st[j * ch] : 0.0f;
  }
  for (int t = runs.begin[r]; t < runs.end[r]; ++t) {
    const float x = c < nqk ? qk[t * nqk + c] : v[t * nv + (c - nqk)];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvTaps - 1; ++j) {
      if (j < taps - 1) acc += w[j] * win[j];
    }
    acc += w[taps - 1] * x;
    out[t * ch + c] = acc * Sigmoid(acc);
#pragma unroll
    for (int j = 0; j < kMaxConvTaps - 2; ++j) {
      if (j < taps - 2) win[j] = win[j + 1];
    }
    win[taps - 2] = x;
  }
#pragma unroll
  for (int j = 0; j < kMaxConvTaps - 1; ++j) {
    if (j < taps - 1) st[j * ch] = win[j];
  }
}

// One block per (value head h, a tile of blockDim.x value columns, run);
// KD >= k_dim is the register tile of each thread's state column.
template <int KD>
__global__ void DeltaRuleKernel(const float* conv, const float* beta_in,
                                const float* alpha_in, const float* dt,
                                const float* a, DeltaShape sh, float* state,
                                DeltaRuns runs, float* out) {
  __shared__ float qs[KD], ks[KD], scratch[32];
  const int h = blockIdx.x, r = blockIdx.z;
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  const bool valid = col < sh.v_dim;
  // Value head i reads key head j (GatedDeltaNetShape).
  const int i = sh.v_head_begin + h;
  const int kh =
      sh.v_tiled ? i % sh.k_heads : i / (sh.v_heads_total / sh.k_heads);
  const int64_t ch = 2 * static_cast<int64_t>(sh.k_heads) * sh.k_dim +
                     static_cast<int64_t>(sh.v_heads) * sh.v_dim;
  float* S = state + ((static_cast<int64_t>(runs.slot[r]) * sh.v_heads + h) *
                      sh.k_dim) *
                         sh.v_dim;
  float s[KD];
#pragma unroll
  for (int k = 0; k < KD; ++k) {
    s[k] =
        k < sh.k_dim && valid && !runs.fresh[r] ? S[k * sh.v_dim + col] : 0.0f;
  }
  const float q_scale_dim = rsqrtf(static_cast<float>(sh.k_dim));
  for (int t = runs.begin[r]; t < runs.end[r]; ++t) {
    const float* row = conv + t * ch;
    const float* q = row + kh * sh.k_dim;
    const float* kk = row + (sh.k_heads + kh) * sh.k_dim;
    float sq = 0.0f, sk = 0.0f;
    for (int k = threadIdx.x; k < sh.k_dim; k += blockDim.x) {
      qs[k] = q[k];
      ks[k] = kk[k];
      sq += q[k] * q[k];
      sk += kk[k] * kk[k];
    }
    // BlockSum synchronizes: qs and ks are written before they are read.
    sq = BlockSum(sq, scratch);
    sk = BlockSum(sk, scratch);
    const float q_scale = rsqrtf(sq + 1e-6f) * q_scale_dim;
    const float k_scale = rsqrtf(sk + 1e-6f);
    const int64_t gi = static_cast<int64_t>(t) * sh.v_heads + h;
    const float beta = Sigmoid(beta_in[gi]);
    const float x = alpha_in[gi] + dt[h];
    const float softplus = fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    const float decay = expf(a[h] * softplus);
    if (valid) {
      const float v = row[2 * sh.k_heads * sh.k_dim + h * sh.v_dim + col];
      float kv = 0.0f;
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        if (k < sh.k_dim) {
          s[k] *= decay;
          kv += s[k] * ks[k] * k_scale;
        }
      }
      const float delta = beta * (v - kv);
      float o = 0.0f;
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        if (k < sh.k_dim) {
          s[k] += ks[k] * k_scale * delta;
          o += s[k] * qs[k] * q_scale;
        }
      }
      out[gi * sh.v_dim + col] = o;
    }
    __syncthreads();  // qs and ks are read before the next token's.
  }
  if (valid) {
#pragma unroll
    for (int k = 0; k < KD; ++k) {
      if (k < sh.k_dim) S[k * sh.v_dim + col] = s[k];
    }
  }
}

__global__ void GatedRmsNormKernel(const float* o, const float* z,
                                   const float* w, float eps, int64_t d,
                                   float* out) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    ss += o[base + j] * o[base + j];
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  // Each thread writes only the elements it reads.
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float zj = z[base + j];
    out[base + j] = o[base + j] * inv * w[j] * (zj * Sigmoid(zj));
  }
}

__global__ void SigmoidGateKernel(float* x, const float* gate, int64_t n,
                                  int64_t c, bool per_row) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * c) return;
  x[i] /= 1.0f + expf(-gate[per_row ? i / c : i]);
}

}  // namespace

cudaError_t CausalConv1dSilu(const float* qk, const float* v, int64_t nqk,
                             int64_t nv, const float* weight, int taps,
                             float* state, const DeltaRuns& runs, float* out,
                             cudaStream_t stream) {
  if (runs.count == 0) return cudaSuccess;
  const int threads = 128;
  const dim3 grid(Blocks(nqk + nv, threads), runs.count);
  ConvKernel<<<grid, threads, 0, stream>>>(qk, v, nqk, nv, weight, taps, state,
                                           runs, out);
  return cudaGetLastError();
}

cudaError_t GatedDeltaRule(const float* conv, const float* beta_in,
                           const float* alpha_in, const float* dt,
                           const float* a, const DeltaShape& shape,
                           float* state, const DeltaRuns& runs, float* out,
                           cudaStream_t stream) {
  if (runs.count == 0) return cudaSuccess;
  // Whole warps (BlockSum), at most 128 columns a block.
  const int threads = shape.v_dim >= 128 ? 128 : (shape.v_dim + 31) / 32 * 32;
  const dim3 grid(shape.v_heads, Blocks(shape.v_dim, threads), runs.count);
#define SHARDLM_DELTA_RULE(KD)                       \
  DeltaRuleKernel<KD><<<grid, threads, 0, stream>>>( \
      conv, beta_in, alpha_in, dt, a, shape, state, runs, out)
  if (shape.k_dim <= 32) {
    SHARDLM_DELTA_RULE(32);
  } else if (shape.k_dim <= 64) {
    SHARDLM_DELTA_RULE(64);
  } else if (shape.k_dim <= 128) {
    SHARDLM_DELTA_RULE(128);
  } else if (shape.k_dim <= kMaxDeltaKeyDim) {
    SHARDLM_DELTA_RULE(256);
  } else {
    return cudaErrorInvalidValue;
  }
#undef SHARDLM_DELTA_RULE
  return cudaGetLastError();
}

cudaError_t GatedRmsNorm(const float* o, const float* z, const float* w,
                         float eps, int64_t rows, int64_t d, float* out,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = d >= 256 ? 256 : (static_cast<int>(d) + 31) / 32 * 32;
  GatedRmsNormKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      o, z, w, eps, d, out);
  return cudaGetLastError();
}

cudaError_t SigmoidGate(float* x, const float* gate, int64_t n, int64_t c,
                        bool per_row, cudaStream_t stream) {
  if (n * c == 0) return cudaSuccess;
  const int threads = 256;
  SigmoidGateKernel<<<Blocks(n * c, threads), threads, 0, stream>>>(x, gate, n,
                                                                    c, per_row);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
