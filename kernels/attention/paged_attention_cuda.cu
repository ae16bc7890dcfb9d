// CUDA twins of paged_attention_cpu.cc: KV writes, split-K decode
// attention (flash-decoding) and tiled causal prefill attention, over a
// bf16 paged cache [blocks, block_size, kv_heads, d] whose blocks past the
// device pool live in a host tier of pinned memory, read and written in
// place over the bus (KvCaches). Softmax statistics and accumulation are
// f32 (online softmax).
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

using Bf = __nv_bfloat16;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 32;  // Keys per chunk: one per lane.

// Physical cache row of position `pos` of sequence `seq`.
__device__ __forceinline__ int64_t Slot(const AttnMeta& m, int seq, int pos) {
  const int b = m.block_tables[static_cast<int64_t>(seq) * m.max_blocks +
                               pos / m.block_size];
  return static_cast<int64_t>(b) * m.block_size + pos % m.block_size;
}

// Row `slot` ([kv_heads, d], `row` elements) of the K or V cache: the
// device pool's, or the host tier's past its device_slots.
__device__ __forceinline__ const Bf* Row(const void* dev, const void* host,
                                         int64_t slot, int64_t row,
                                         int64_t device_slots) {
  return slot < device_slots
             ? static_cast<const Bf*>(dev) + slot * row
             : static_cast<const Bf*>(host) + (slot - device_slots) * row;
}
__device__ __forceinline__ const Bf* KRow(const KvCaches& c, int64_t slot,
                                          int64_t row) {
  return Row(c.k, c.k_host, slot, row, c.device_slots);
}
__device__ __forceinline__ const Bf* VRow(const KvCaches& c, int64_t slot,
                                          int64_t row) {
  return Row(c.v, c.v_host, slot, row, c.device_slots);
}

__global__ void WriteKvKernel(const float* k, const float* v, AttnMeta m,
                              int row, KvCaches c) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= static_cast<int64_t>(m.n) * row) return;
  const int64_t i = idx / row, e = idx % row;
  const int64_t slot = m.slots[i];
  const_cast<Bf*>(KRow(c, slot, row))[e] = __float2bfloat16_rn(k[idx]);
  const_cast<Bf*>(VRow(c, slot, row))[e] = __float2bfloat16_rn(v[idx]);
}

// One block per (token, head, split): four warps take 32-key chunks in
// turn, each keeping its own running max, sum and output; the warps are
// merged in shared memory, and the splits (when more than one) by
// CombineKernel through `ws`: per (token, head, split) [max, sum, acc[d]]
// (CudaDecodeWorkspaceFloats in paged_attention.h counts it).
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const float* q, KvCaches c, AttnMeta m, int heads,
                 int kv_heads, int d, float scale, Out* out, float* ws) {
  extern __shared__ float smem[];
  float* qs = smem;                // [d]
  float* wacc = qs + d;            // [kWarps, d]
  float* wml = wacc + kWarps * d;  // [kWarps, 2]
  const int i = blockIdx.x / heads, h = blockIdx.x % heads;
  const int kvh = h / (heads / kv_heads);
  const int splits = gridDim.y, s = blockIdx.y;
  const int ctx = m.positions[i] + 1;
  // The window's first position (0 without one); the splits share the rest.
  const int lo = m.window > 0 ? max(0, ctx - m.window) : 0;
  const int seq = m.token_seq[i];
  const int per = (ctx - lo + splits - 1) / splits;
  const int begin = lo + s * per, end = min(ctx, begin + per);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int dpl = d / 32;
  const int64_t row = static_cast<int64_t>(kv_heads) * d;
  const int64_t qoff = (static_cast<int64_t>(i) * heads + h) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) qs[e] = q[qoff + e] * scale;
  __syncthreads();

  float mx = -INFINITY, l = 0.0f;
  float acc[kMaxDimsPerLane] = {};
  for (int base = begin + warp * kKeys; base < end; base += kWarps * kKeys) {
    const int j = base + lane;
    float sc = -INFINITY;
    int64_t slot = 0;
    if (j < end) {
      slot = Slot(m, seq, j);
      const Bf* kr = KRow(c, slot, row) + static_cast<int64_t>(kvh) * d;
      float dot = 0.0f;
      for (int e = 0; e < d; e += 2) {
        const float2 kv = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162*>(kr + e));
        dot += qs[e] * kv.x + qs[e + 1] * kv.y;
      }
      sc = dot;
    }
    const float nm = fmaxf(mx, WarpMax(sc));  // Finite: lane 0 has a key.
    const float p = j < end ? expf(sc - nm) : 0.0f;
    const float alpha = expf(mx - nm);  // 0 on the first chunk.
    l = l * alpha + WarpSum(p);
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc[c] *= alpha;
    const int cnt = min(kKeys, end - base);
    for (int t = 0; t < cnt; ++t) {
      const float pt = __shfl_sync(0xffffffffu, p, t);
      const long long st =
          __shfl_sync(0xffffffffu, static_cast<long long>(slot), t);
      const Bf* vr = VRow(c, st, row) + static_cast<int64_t>(kvh) * d;
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) {
        if (c < dpl) acc[c] += pt * __bfloat162float(vr[c * 32 + lane]);
      }
    }
    mx = nm;
  }
#pragma unroll
  for (int c = 0; c < kMaxDimsPerLane; ++c) {
    if (c < dpl) wacc[warp * d + c * 32 + lane] = acc[c];
  }
  if (lane == 0) {
    wml[warp * 2] = mx;
    wml[warp * 2 + 1] = l;
  }
  __syncthreads();
  float bm = -INFINITY, bl = 0.0f;
  for (int w = 0; w < kWarps; ++w) bm = fmaxf(bm, wml[w * 2]);
  for (int w = 0; w < kWarps; ++w) {
    if (wml[w * 2] > -INFINITY) bl += wml[w * 2 + 1] * expf(wml[w * 2] - bm);
  }
  float* part =
      ws + ((static_cast<int64_t>(i) * heads + h) * splits + s) * (d + 2);
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (wml[w * 2] > -INFINITY) a += wacc[w * d + e] * expf(wml[w * 2] - bm);
    }
    if (splits == 1) {
      Store(out, qoff + e, a / bl);
    } else {
      part[2 + e] = a;
    }
  }
  if (splits > 1 && threadIdx.x == 0) {
    part[0] = bm;  // -inf for an empty split.
    part[1] = bl;
  }
}

// Merges the splits of one (token, head).
template <typename Out>
__global__ void CombineKernel(const float* ws, int splits, int d, Out* out) {
  const float* base = ws + static_cast<int64_t>(blockIdx.x) * splits * (d + 2);
  float bm = -INFINITY, bl = 0.0f;
  for (int s = 0; s < splits; ++s) bm = fmaxf(bm, base[s * (d + 2)]);
  for (int s = 0; s < splits; ++s) {
    const float ms = base[s * (d + 2)];
    if (ms > -INFINITY) bl += base[s * (d + 2) + 1] * expf(ms - bm);
  }
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = base[s * (d + 2)];
      if (ms > -INFINITY) a += base[s * (d + 2) + 2 + e] * expf(ms - bm);
    }
    Store(out, static_cast<int64_t>(blockIdx.x) * d + e, a / bl);
  }
}

// One block per (tile, head): the tile's query rows (up to kPrefillTile
// tokens of one sequence) stay in shared memory while 32-key chunks of K
// and V are staged there once and used by every row; each warp owns
// kPrefillTile / kWarps rows and keeps their online-softmax state.
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(const float* q, KvCaches c, AttnMeta m, int heads,
                  int kv_heads, int d, float scale, Out* out) {
  constexpr int kRows = kPrefillTile / kWarps;
  extern __shared__ float smem[];
  float* qs = smem;                   // [kPrefillTile, d]
  float* ks = qs + kPrefillTile * d;  // [kKeys, d + 1] (padded: banks)
  float* vs = ks + kKeys * (d + 1);   // [kKeys, d]
  const int t0 = m.tile_begin[blockIdx.x], tl = m.tile_len[blockIdx.x];
  const int h = blockIdx.y;
  const int seq = m.token_seq[t0];
  const int kvh = h / (heads / kv_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int dpl = d / 32;
  const int64_t row = static_cast<int64_t>(kv_heads) * d;
  for (int idx = threadIdx.x; idx < tl * d; idx += blockDim.x) {
    const int r = idx / d, e = idx % d;
    qs[r * d + e] =
        q[(static_cast<int64_t>(t0 + r) * heads + h) * d + e] * scale;
  }
  int max_pos = 0, min_pos = m.positions[t0];
  for (int r = 0; r < tl; ++r) {
    max_pos = max(max_pos, m.positions[t0 + r]);
    min_pos = min(min_pos, m.positions[t0 + r]);
  }
  // With a sliding window, keys before every row's window are never read
  // (their blocks may be gone); chunks stay aligned to kKeys.
  const int lo_tile = m.window > 0 ? max(0, min_pos - m.window + 1) : 0;
  int pos[kRows], lo[kRows];
  float mx[kRows], l[kRows], acc[kRows][kMaxDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int r = warp * kRows + rr;
    pos[rr] = r < tl ? m.positions[t0 + r] : -1;
    lo[rr] = m.window > 0 ? max(0, pos[rr] - m.window + 1) : 0;
    mx[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc[rr][c] = 0.0f;
  }

  for (int kb = lo_tile / kKeys * kKeys; kb <= max_pos; kb += kKeys) {
    __syncthreads();  // The previous chunk is consumed; q is loaded.
    const int nk = min(kKeys, max_pos + 1 - kb);
    for (int idx = threadIdx.x; idx < nk * d; idx += blockDim.x) {
      const int t = idx / d, e = idx % d;
      if (kb + t < lo_tile) {  // Outside every row's window: masked below.
        ks[t * (d + 1) + e] = 0.0f;
        vs[t * d + e] = 0.0f;
        continue;
      }
      const int64_t slot = Slot(m, seq, kb + t);
      const int64_t off = static_cast<int64_t>(kvh) * d + e;
      ks[t * (d + 1) + e] = __bfloat162float(KRow(c, slot, row)[off]);
      vs[t * d + e] = __bfloat162float(VRow(c, slot, row)[off]);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      // Uniform across the warp: chunks after the row, or wholly before
      // its window (whose scores would all be -inf).
      if (pos[rr] < kb || kb + nk <= lo[rr]) continue;
      const float* qr = qs + (warp * kRows + rr) * d;
      const int j = kb + lane;
      float sc = -INFINITY;
      if (lane < nk && j <= pos[rr] && j >= lo[rr]) {
        const float* kr = ks + lane * (d + 1);
        float dot = 0.0f;
        for (int e = 0; e < d; ++e) dot += qr[e] * kr[e];
        sc = dot;
      }
      const float nm = fmaxf(mx[rr], WarpMax(sc));
      const float p = sc == -INFINITY ? 0.0f : expf(sc - nm);
      const float alpha = expf(mx[rr] - nm);
      l[rr] = l[rr] * alpha + WarpSum(p);
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) acc[rr][c] *= alpha;
      const int cnt = min(nk, pos[rr] - kb + 1);
      for (int t = 0; t < cnt; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
#pragma unroll
        for (int c = 0; c < kMaxDimsPerLane; ++c) {
          if (c < dpl) acc[rr][c] += pt * vs[t * d + c * 32 + lane];
        }
      }
      mx[rr] = nm;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int r = warp * kRows + rr;
    if (r >= tl) continue;
    const int64_t o = (static_cast<int64_t>(t0 + r) * heads + h) * d;
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) {
      if (c < dpl) Store(out, o + c * 32 + lane, acc[rr][c] / l[rr]);
    }
  }
}

template <typename Out>
cudaError_t Decode(const float* q, const KvCaches& c, const AttnMeta& m,
                   int heads, int kv_heads, int d, float scale, Out* out,
                   float* ws, int splits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(m.n) * heads, splits);
  const size_t smem = (d + kWarps * d + kWarps * 2) * sizeof(float);
  DecodeKernel<Out><<<grid, kThreads, smem, stream>>>(q, c, m, heads, kv_heads,
                                                      d, scale, out, ws);
  if (splits > 1) {
    CombineKernel<Out><<<static_cast<unsigned>(m.n) * heads, d, 0, stream>>>(
        ws, splits, d, out);
  }
  return cudaGetLastError();
}

template <typename Out>
cudaError_t Prefill(const float* q, const KvCaches& c, const AttnMeta& m,
                    int heads, int kv_heads, int d, float scale, Out* out,
                    cudaStream_t stream) {
  const size_t smem =
      (kPrefillTile * d + kKeys * (d + 1) + kKeys * d) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        PrefillKernel<Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(m.n_tiles, heads);
  PrefillKernel<Out><<<grid, kThreads, smem, stream>>>(q, c, m, heads, kv_heads,
                                                       d, scale, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t WriteKv(const float* k, const float* v, const AttnMeta& meta,
                    int kv_heads, int d, const KvCaches& caches,
                    cudaStream_t stream) {
  const int row = kv_heads * d;
  const int64_t count = static_cast<int64_t>(meta.n) * row;
  if (count == 0) return cudaSuccess;
  WriteKvKernel<<<Blocks(count, 256), 256, 0, stream>>>(k, v, meta, row,
                                                        caches);
  return cudaGetLastError();
}

cudaError_t AttentionDecode(const float* q, const KvCaches& caches,
                            const AttnMeta& meta, int heads, int kv_heads,
                            int d, float scale, void* out, Dt out_dt,
                            float* workspace, int splits, cudaStream_t stream) {
  if (meta.n == 0) return cudaSuccess;
  if (out_dt == Dt::kBF16) {
    return Decode(q, caches, meta, heads, kv_heads, d, scale,
                  static_cast<Bf*>(out), workspace, splits, stream);
  }
  return Decode(q, caches, meta, heads, kv_heads, d, scale,
                static_cast<float*>(out), workspace, splits, stream);
}

cudaError_t AttentionPrefill(const float* q, const KvCaches& caches,
                             const AttnMeta& meta, int heads, int kv_heads,
                             int d, float scale, void* out, Dt out_dt,
                             cudaStream_t stream) {
  if (meta.n == 0) return cudaSuccess;
  if (out_dt == Dt::kBF16) {
    return Prefill(q, caches, meta, heads, kv_heads, d, scale,
                   static_cast<Bf*>(out), stream);
  }
  return Prefill(q, caches, meta, heads, kv_heads, d, scale,
                 static_cast<float*>(out), stream);
}

}  // namespace shardlm::cuda
