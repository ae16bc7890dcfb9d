// CUDA twins of paged_attention_cpu.cc: KV writes, split-K decode
// attention (flash-decoding) and tiled causal prefill attention, over a
// bf16 paged cache [blocks, block_size, kv_heads, d] whose blocks past the
// device pool live in a host tier of pinned memory, read and written in
// place over the bus (KvCaches). Softmax statistics and accumulation are
// f32 (online softmax).
#include <algorithm>

#include "kernels/attention/cuda_decode_plan.h"
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
  if (slot < 0) return;  // A padding sequence's token writes nothing.
  const_cast<Bf*>(KRow(c, slot, row))[e] = __float2bfloat16_rn(k[idx]);
  const_cast<Bf*>(VRow(c, slot, row))[e] = __float2bfloat16_rn(v[idx]);
}

// The fused QKV GEMM's output [n, (heads + 2 kv_heads) d] -> q (RoPE'd,
// f32 [n, heads, d]) and the caches' slots (K RoPE'd, V as is, bf16), in
// one pass: the work of SplitQkv, two Ropes and WriteKv, with the same
// arithmetic (RopePairAt; round to nearest bf16). Threads [0, rot) turn
// one pair of a Q or K head each, the rest copy one V element each.
__global__ void QkvRopeKvKernel(const float* qkv, AttnMeta m, int heads,
                                int kv_heads, int d, const double* inv_freq,
                                double mscale, bool adjacent, float* q,
                                KvCaches c) {
  const int half = d / 2, turned = heads + kv_heads, row = kv_heads * d;
  const int64_t rot = static_cast<int64_t>(m.n) * turned * half;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= rot + static_cast<int64_t>(m.n) * row) return;
  const int64_t width = static_cast<int64_t>(heads + 2 * kv_heads) * d;
  if (idx < rot) {
    const int64_t head_row = idx / half;  // token * turned + head
    const int64_t i = head_row / turned;
    const int h = static_cast<int>(head_row % turned);
    const RopePair r =
        RopePairAt(m.positions[i], static_cast<int>(idx % half), d,
                   /*log_theta=*/0.0, inv_freq, mscale, adjacent);
    const float* x = qkv + i * width + static_cast<int64_t>(h) * d;
    const float x0 = x[r.a], x1 = x[r.b];
    const float y0 = x0 * r.cs - x1 * r.sn, y1 = x0 * r.sn + x1 * r.cs;
    if (h < heads) {
      float* out = q + (i * heads + h) * d;
      out[r.a] = y0;
      out[r.b] = y1;
      return;
    }
    const int64_t slot = m.slots[i];
    if (slot < 0) return;  // A padding sequence's token writes nothing.
    Bf* out = const_cast<Bf*>(KRow(c, slot, row)) +
              static_cast<int64_t>(h - heads) * d;
    out[r.a] = __float2bfloat16_rn(y0);
    out[r.b] = __float2bfloat16_rn(y1);
    return;
  }
  const int64_t j = idx - rot, i = j / row, e = j % row;
  const int64_t slot = m.slots[i];
  if (slot < 0) return;
  const_cast<Bf*>(VRow(c, slot, row))[e] = __float2bfloat16_rn(
      qkv[i * width + static_cast<int64_t>(turned) * d + e]);
}

// One block per (token, KV head, split), serving the query heads that
// share that KV head (a GQA group, or kCudaDecodeHeadsPerBlock of a larger
// one), so that each K/V row is read from memory once per block, not once
// per query head. Chunks of kKeys keys are staged in shared memory with
// coalesced 16-byte asynchronous copies (a row's head_dim elements are
// contiguous), kStages - 1 chunks ahead of the one in use; warp w owns heads w,
// w + kWarps, ... of the block: lane = key for the scores (each lane reads its
// key's row from shared memory 16 bytes at a time: the padded row stride keeps
// a quarter-warp's reads on distinct banks), lane = dimension for the weighted
// sum of V. A warp owns its heads' whole online-softmax state, so the block
// needs no merge; the splits (when more than one) are merged by CombineKernel
// through `ws`: per (token, head, split) [max, sum, acc[d]]
// (CudaDecodeWorkspaceFloats in cuda_decode_plan.h counts it).
constexpr int kHeadsPerWarp = kCudaDecodeHeadsPerBlock / kWarps;
constexpr int kRowPad = 8;  // bf16 elements: 16 bytes.
// Chunks in flight per block: one used while the next ones load.
constexpr int kStages = 3;

// Copies 16 bytes from global (device or mapped host) to shared memory
// without passing through registers (sm_80+; completion per commit group).
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d),
               "l"(src));
}
__device__ __forceinline__ void CommitAsync() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying keys [base, base + cnt) of the sequence into one stage's
// K rows (padded stride ks_row) and V rows, then closes this thread's
// commit group (empty when cnt is 0, so that every thread counts the same
// groups).
__device__ __forceinline__ void IssueChunk(const KvCaches& c, const AttnMeta& m,
                                           int seq, int base, int cnt, int d,
                                           int64_t row, int64_t head_off,
                                           Bf* ks, int ks_row, Bf* vs) {
  const int vec = d / 8;  // 16-byte pieces per row.
  for (int p = threadIdx.x; p < cnt * vec; p += kThreads) {
    const int t = p / vec, e = p % vec * 8;
    const int64_t slot = Slot(m, seq, base + t);
    CopyAsync16(ks + t * ks_row + e, KRow(c, slot, row) + head_off + e);
    CopyAsync16(vs + t * d + e, VRow(c, slot, row) + head_off + e);
  }
  CommitAsync();
}

template <typename Out>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const float* q, KvCaches c, AttnMeta m, int heads,
                 int kv_heads, int d, float scale, Out* out, float* ws) {
  extern __shared__ float smem[];
  const int group = heads / kv_heads;
  const int head_blocks =
      (group + kCudaDecodeHeadsPerBlock - 1) / kCudaDecodeHeadsPerBlock;
  const int hb = blockIdx.x % head_blocks;
  const int kvh = blockIdx.x / head_blocks % kv_heads;
  const int i = blockIdx.x / head_blocks / kv_heads;
  // The block's query heads: [h0, h0 + nh).
  const int h0 = kvh * group + hb * kCudaDecodeHeadsPerBlock;
  const int nh =
      min(kCudaDecodeHeadsPerBlock, group - hb * kCudaDecodeHeadsPerBlock);
  const int ks_row = d + kRowPad;
  const int stage = kKeys * (ks_row + d);  // bf16 elements of one stage.
  float* qs = smem;                        // [nh, d]
  // kStages x (K [kKeys, ks_row], V [kKeys, d]).
  Bf* kv = reinterpret_cast<Bf*>(qs + min(group, kCudaDecodeHeadsPerBlock) * d);

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
  const int64_t head_off = static_cast<int64_t>(kvh) * d;
  const int64_t qoff = (static_cast<int64_t>(i) * heads + h0) * d;
  const int chunks = end > begin ? (end - begin + kKeys - 1) / kKeys : 0;
  const auto issue = [&](int chunk) {
    const int base = begin + chunk * kKeys;
    const int cnt = chunk < chunks ? min(kKeys, end - base) : 0;
    Bf* ks = kv + (chunk % kStages) * stage;
    IssueChunk(c, m, seq, base, cnt, d, row, head_off, ks, ks_row,
               ks + kKeys * ks_row);
  };
#pragma unroll
  for (int chunk = 0; chunk < kStages - 1; ++chunk) issue(chunk);
  for (int e = threadIdx.x; e < nh * d; e += blockDim.x) {
    qs[e] = q[qoff + e] * scale;
  }

  float mx[kHeadsPerWarp], l[kHeadsPerWarp];
  float acc[kHeadsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    mx[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc[hh][c] = 0.0f;
  }
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int base = begin + chunk * kKeys;
    const int cnt = min(kKeys, end - base);
    // The stage this issue overwrites was consumed in the previous round.
    issue(chunk + kStages - 1);
    WaitAsync<kStages - 1>();  // This thread's copies of `chunk` landed...
    __syncthreads();           // ...and every thread's; q is stored.
    const Bf* ks = kv + (chunk % kStages) * stage;
    const Bf* vs = ks + kKeys * ks_row;
    // Scores of the warp's heads against the chunk's keys (lane = key).
    float sc[kHeadsPerWarp];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) sc[hh] = 0.0f;
    const Bf* kr = ks + lane * ks_row;
    for (int e = 0; e < d; e += 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(kr + e);
      const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
      float kf[8];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float2 f = __bfloat1622float2(k2[x]);
        kf[2 * x] = f.x;
        kf[2 * x + 1] = f.y;
      }
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
        const int h = warp + hh * kWarps;
        if (h < nh) {
          const float4* qh = reinterpret_cast<const float4*>(qs + h * d + e);
          const float4 a = qh[0], b = qh[1];
          sc[hh] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                    b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      if (warp + hh * kWarps >= nh) break;  // Uniform across the warp.
      const float score = lane < cnt ? sc[hh] : -INFINITY;
      const float nm = fmaxf(mx[hh], WarpMax(score));  // Lane 0 has a key.
      const float p = lane < cnt ? expf(score - nm) : 0.0f;
      const float alpha = expf(mx[hh] - nm);  // 0 on the first chunk.
      l[hh] = l[hh] * alpha + WarpSum(p);
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) acc[hh][c] *= alpha;
      for (int t = 0; t < cnt; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        const Bf* vr = vs + t * d;
#pragma unroll
        for (int c = 0; c < kMaxDimsPerLane; ++c) {
          if (c < dpl) acc[hh][c] += pt * __bfloat162float(vr[c * 32 + lane]);
        }
      }
      mx[hh] = nm;
    }
    __syncthreads();  // The stage is free for the next round's copies.
  }
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = warp + hh * kWarps;
    if (h >= nh) break;
    const int64_t th = static_cast<int64_t>(i) * heads + h0 + h;
    if (splits == 1) {
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) {
        if (c < dpl) Store(out, th * d + c * 32 + lane, acc[hh][c] / l[hh]);
      }
      continue;
    }
    float* part = ws + (th * splits + s) * (d + 2);
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) {
      if (c < dpl) part[2 + c * 32 + lane] = acc[hh][c];
    }
    if (lane == 0) {
      part[0] = mx[hh];  // -inf for an empty split.
      part[1] = l[hh];
    }
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
  const int group = heads / kv_heads;
  const int head_blocks =
      (group + kCudaDecodeHeadsPerBlock - 1) / kCudaDecodeHeadsPerBlock;
  const dim3 grid(static_cast<unsigned>(m.n) * kv_heads * head_blocks, splits);
  const size_t smem =
      std::min(group, kCudaDecodeHeadsPerBlock) * d * sizeof(float) +
      kStages * kKeys * (d + kRowPad + d) * sizeof(Bf);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        DecodeKernel<Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
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

cudaError_t QkvRopeWriteKv(const float* qkv, const AttnMeta& meta, int heads,
                           int kv_heads, int d, const double* inv_freq,
                           double mscale, bool adjacent_pairs, float* q,
                           const KvCaches& caches, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(meta.n) *
                        ((heads + kv_heads) * (d / 2) + kv_heads * d);
  if (count == 0) return cudaSuccess;
  QkvRopeKvKernel<<<Blocks(count, 256), 256, 0, stream>>>(
      qkv, meta, heads, kv_heads, d, inv_freq, mscale, adjacent_pairs, q,
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
