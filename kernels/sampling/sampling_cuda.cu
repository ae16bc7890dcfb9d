// Greedy sampling on the device: one block per logits row. (Stochastic
// sampling runs on the host with SampleToken; see kernels/cuda_ops.h.)
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

// (value, index) order: larger value first, then lower index.
__device__ __forceinline__ bool Better(float v, int32_t i, float bv,
                                       int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxKernel(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = row[j];
    if (Better(v, static_cast<int32_t>(j), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(j);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (Better(sv[w], si[w], bv, bi)) {
        bv = sv[w];
        bi = si[w];
      }
    }
    // All -inf or NaN: index 0, as the CPU's Argmax.
    out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

cudaError_t Argmax(const float* logits, int64_t rows, int64_t vocab,
                   int32_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(logits, vocab,
                                                                 out);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda

// Stochastic sampling with SampleToken's exact semantics (sampling_cpu.cc),
// one block per row, without sorting: every question about the sorted
// order ("the k-th largest", "where does the cumulative mass cross x") is
// answered by bisection over the 32-bit order-preserving key of the
// logits, each probe one pass over the row with a block reduction. The
// order is SampleToken's: larger logit first, lower id first among equal
// logits. Probabilities and sums are in double, as on the CPU.
namespace shardlm::cuda {
namespace {

constexpr int kSampleThreads = 1024;

// Larger float -> larger key (NaN is not expected in logits).
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ double BlockSumD(double v, double* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A prefix of the sorted order: every id whose key is above `key`, and
// those equal to it with id <= `id`.
struct Prefix {
  uint32_t key;
  int64_t id;
  __device__ bool Has(uint32_t k, int64_t i) const {
    return k > key || (k == key && i <= id);
  }
};

struct Row {
  const float* logits;
  int64_t vocab;
  float max;
  double inv_t;
  double* scratch;
  __device__ double P(float x) const {
    return exp((static_cast<double>(x) - max) * inv_t);
  }
  // Mass (or, with count, number) of prefix members with key >= w
  // (strictly > w when `strict`).
  __device__ double Mass(const Prefix& pre, uint32_t w, bool strict,
                         bool count) const {
    double s = 0;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float x = logits[j];
      const uint32_t k = Key(x);
      if (pre.Has(k, j) && (strict ? k > w : k >= w)) s += count ? 1.0 : P(x);
    }
    return BlockSumD(s, scratch);
  }
  // Number of prefix members with key == w and id <= x.
  __device__ double TiesUpTo(const Prefix& pre, uint32_t w, int64_t x) const {
    double s = 0;
    for (int64_t j = threadIdx.x; j <= x && j < vocab; j += blockDim.x) {
      const uint32_t k = Key(logits[j]);
      if (k == w && pre.Has(k, j)) s += 1.0;
    }
    return BlockSumD(s, scratch);
  }
  // The c-th smallest id (c >= 1) among prefix members with key == w.
  __device__ int64_t NthTie(const Prefix& pre, uint32_t w, double c) const {
    int64_t lo = 0, hi = vocab - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (TiesUpTo(pre, w, mid) >= c) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
  // The largest key w with Mass(pre, >= w) >= x (> x when `strict`), or
  // false when even w = 0 does not reach it.
  __device__ bool Cross(const Prefix& pre, double x, bool strict, bool count,
                        uint32_t* w_out) const {
    const auto ok = [&](uint32_t w) {
      const double m = Mass(pre, w, false, count);
      return strict ? m > x : m >= x;
    };
    if (!ok(0)) return false;
    uint32_t w = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = w | (1u << bit);
      if (ok(cand)) w = cand;
    }
    *w_out = w;
    return true;
  }
};

__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(const float* logits, int64_t vocab, const SampleRow* params,
                 int32_t* out) {
  __shared__ double scratch[32];
  __shared__ float smax[32];
  __shared__ int32_t sidx[32];
  const SampleRow p = params[blockIdx.x];
  const float* row = logits + blockIdx.x * vocab;
  // Max (and argmax, lowest index among equal maxima).
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = row[j];
    if (Better(v, static_cast<int32_t>(j), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(j);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (threadIdx.x % 32 == 0) {
    smax[threadIdx.x / 32] = bv;
    sidx[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
    if (Better(smax[w], sidx[w], bv, bi)) {
      bv = smax[w];
      bi = sidx[w];
    }
  }
  if (p.temperature == 0.0f || p.top_k == 1) {
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    return;
  }
  const Row r{row, vocab, bv, 1.0 / static_cast<double>(p.temperature),
              scratch};
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  int64_t result = vocab - 1;
  if (!top_k && !top_p) {
    // Id order: the first id whose running mass exceeds u * total.
    const Prefix all{0, vocab};
    const double target = p.u * r.Mass(all, 0, false, false);
    int64_t lo = 0, hi = vocab - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      double s = 0;
      for (int64_t j = threadIdx.x; j <= mid; j += blockDim.x) s += r.P(row[j]);
      if (BlockSumD(s, scratch) > target) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    result = lo;
  } else {
    Prefix keep{0, vocab};  // Everything.
    if (top_k) {
      // The k-th in order: the largest key with at least k at or above
      // it, then enough of its ties by id.
      uint32_t v = 0;
      r.Cross(keep, static_cast<double>(p.top_k), false, true, &v);
      const double above = r.Mass(keep, v, true, true);
      keep = {v, r.NthTie(keep, v, p.top_k - above)};
    }
    if (top_p) {
      // The shortest prefix whose mass reaches top_p of the kept mass.
      const double x = p.top_p * r.Mass(keep, 0, false, false);
      uint32_t w = 0;
      if (r.Cross(keep, x, false, false, &w)) {
        const double above = r.Mass(keep, w, true, false);
        const double pw =
            r.P(__uint_as_float((w & 0x80000000u) ? (w & 0x7fffffffu) : ~w));
        const double ties =
            r.Mass(keep, w, false, true) - r.Mass(keep, w, true, true);
        const double c = fmin(fmax(ceil((x - above) / pw), 1.0), ties);
        keep = {w, r.NthTie(keep, w, c)};
      }
    }
    // Sorted order over the kept prefix: the first whose running mass
    // exceeds u * kept mass; the last kept one when rounding leaves the
    // target at the very top.
    const double target = p.u * r.Mass(keep, 0, false, false);
    uint32_t w = 0;
    if (r.Cross(keep, target, true, false, &w)) {
      const double above = r.Mass(keep, w, true, false);
      const double pw =
          r.P(__uint_as_float((w & 0x80000000u) ? (w & 0x7fffffffu) : ~w));
      const double ties =
          r.Mass(keep, w, false, true) - r.Mass(keep, w, true, true);
      const double c = fmin(floor((target - above) / pw) + 1.0, ties);
      result = r.NthTie(keep, w, fmax(c, 1.0));
    } else {
      const double ties = r.Mass(keep, keep.key, false, true) -
                          r.Mass(keep, keep.key, true, true);
      result = r.NthTie(keep, keep.key, ties);
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(result);
}

}  // namespace

cudaError_t Sample(const float* logits, int64_t rows, int64_t vocab,
                   const SampleRow* params, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  SampleKernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
      logits, vocab, params, out);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
