// Raw-pointer launchers of the CUDA kernels (kernels/<op>/<op>_cuda.cu).
// Internal to shardlm_kernels_cuda: callers use kernels/cuda_ops.h, whose
// functions validate tensors and then call these. Launchers do no checks
// beyond what the kernels need, never allocate, and return the launch's
// cudaError_t. Kept light (no Abseil) because nvcc compiles every .cu
// twice (sm_80, sm_90).
#ifndef SHARDLM_KERNELS_CUDA_LAUNCH_H_
#define SHARDLM_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace shardlm::cuda {

// Element types the CUDA kernels take for "f32 or bf16" arguments.
enum class Dt : int { kF32 = 0, kBF16 = 1 };

// Most head_dim / 32 the attention kernels support (head_dim <= 256).
inline constexpr int kMaxDimsPerLane = 8;
// Query tokens per tile of the prefill kernel.
inline constexpr int kPrefillTile = 16;

// out[i, :] = table[ids[i] - vocab_begin, :] (zero outside [0, rows)).
//   table: [rows, hidden] (dt)  ids: [n]  out: [n, hidden] f32
cudaError_t Embedding(const void* table, Dt table_dt, const int32_t* ids,
                      int64_t n, int64_t rows, int64_t hidden,
                      int64_t vocab_begin, float* out, cudaStream_t stream);

//   x: [n, d] f32  w: [d] f32  out: [n, d] (out_dt; may alias x if f32)
cudaError_t RmsNorm(const float* x, const float* w, float eps, int64_t n,
                    int64_t d, void* out, Dt out_dt, cudaStream_t stream);

// In place. x: [n, heads, d] f32  positions: [n]. Pair k of a head turns
// by positions[i] * inv_freq[k] (inv_freq: [d / 2] f64 on the device; null:
// theta^(-2k / d)), its cos and sin scaled by mscale.
cudaError_t Rope(float* x, const int32_t* positions, int64_t n, int64_t heads,
                 int64_t d, float theta, const double* inv_freq, double mscale,
                 bool adjacent_pairs, cudaStream_t stream);

// out = silu(gate) * up. gate, up: [count] f32  out: [count] (out_dt)
cudaError_t SwiGlu(const float* gate, const float* up, int64_t count, void* out,
                   Dt out_dt, cudaStream_t stream);

// out = silu(gate_up[:, :f]) * gate_up[:, f:] (the fused gate/up GEMM's
// output). gate_up: [n, 2 f] f32  out: [n, f] (out_dt)
cudaError_t SwiGluFused(const float* gate_up, int64_t n, int64_t f, void* out,
                        Dt out_dt, cudaStream_t stream);

// q, k, v = the column blocks [0, qd), [qd, qd + kd), [qd + kd, qd + 2 kd)
// of qkv ([n, qd + 2 kd] f32, the fused projection's output).
cudaError_t SplitQkv(const float* qkv, int64_t n, int64_t qd, int64_t kd,
                     float* q, float* k, float* v, cudaStream_t stream);

// Mixtures of experts: up to kExpertRowsPerLaunch row indices (and their
// routing weights) of one launch, passed by value (2 KB of the launch's
// 4 KB of arguments).
inline constexpr int kExpertRowsPerLaunch = 256;
struct ExpertRows {
  int32_t row[kExpertRowsPerLaunch];
  float weight[kExpertRowsPerLaunch];
  int32_t count = 0;
};

// out[i, :] = x[rows.row[i], :] for i < rows.count.
//   x: [n, c] (dt)  out: [rows.count, c] (dt)
cudaError_t GatherRows(const void* x, Dt dt, int64_t c, const ExpertRows& rows,
                       void* out, cudaStream_t stream);

// out[rows.row[i], :] += rows.weight[i] * y[i, :] for i < rows.count; the
// rows must be distinct. y: [rows.count, c] f32  out: [n, c] f32
cudaError_t ScatterAddRows(const float* y, int64_t c, const ExpertRows& rows,
                           float* out, cudaStream_t stream);

// x += y, [count] f32.
cudaError_t Add(float* x, const float* y, int64_t count, cudaStream_t stream);

// x[i, :] += bias for every row. x: [n, c] f32  bias: [c] f32
cudaError_t AddBias(float* x, const float* bias, int64_t n, int64_t c,
                    cudaStream_t stream);

// y = x w^T (y += x w^T when accumulate) for 1 to kGemvMaxRows rows of x:
// x [n, in] bf16, w [out, in] bf16, y [n, out] (y_dt); in a multiple of 8,
// x and w 16-byte aligned (LinearCuda checks). LinearCuda takes it for up
// to kGemvDefaultRows rows: on an H200 (Llama-8B shapes, gpu_decode_bench)
// it reads the weights 7% faster than cuBLAS at one row and loses from two
// rows on (its f32 FMAs, not tensor cores, bound it there).
inline constexpr int kGemvMaxRows = 8;
inline constexpr int kGemvDefaultRows = 1;
cudaError_t GemvBf16(const void* x, const void* w, void* y, Dt y_dt, int n,
                     int64_t in, int64_t out, bool accumulate,
                     cudaStream_t stream);

// dst = src converted (f32 <-> bf16, or a plain copy), [count].
cudaError_t Cast(const void* src, Dt src_dt, void* dst, Dt dst_dt,
                 int64_t count, cudaStream_t stream);

// dst[i] = uniform in [-scale, scale), a pure function of (seed, i).
cudaError_t FillRandom(void* dst, Dt dt, int64_t count, uint64_t seed,
                       float scale, cudaStream_t stream);

// Device-side description of one step's attention batch (all device
// pointers into one i32 buffer; see kernels/cuda_ops.h).
struct AttnMeta {
  const int32_t* positions;     // [n]
  const int32_t* token_seq;     // [n]
  const int32_t* slots;         // [n] block * block_size + pos % block_size
  const int32_t* block_tables;  // [n_seqs, max_blocks], -1 padded
  const int32_t* tile_begin;    // [n_tiles] first token of a prefill tile
  const int32_t* tile_len;      // [n_tiles] <= kPrefillTile, one sequence
  int n, n_seqs, max_blocks, max_ctx, n_tiles, block_size;
  // > 0: sliding-window attention; the token at position p attends to
  // positions (p - window, p] only. 0: its whole context.
  int window;
};

// One layer's paged bf16 caches, [blocks, bs, kv_heads, d] each: the
// device pool and, optionally, a host tier in pinned (device-mapped)
// memory. Slot s (block * bs + offset) is row s of the device pool when
// s < device_slots, else row s - device_slots of the host tier.
struct KvCaches {
  void* k;
  void* v;
  void* k_host;  // Null without a host tier.
  void* v_host;
  int64_t device_slots;
};

// k, v: [n, kv_heads, d] f32 -> the caches' slots of the step's tokens.
cudaError_t WriteKv(const float* k, const float* v, const AttnMeta& meta,
                    int kv_heads, int d, const KvCaches& caches,
                    cudaStream_t stream);

// SplitQkv, Rope of the Q and K heads (inv_freq: [d / 2] f64 on the device,
// scaled by mscale) and WriteKv in one kernel: q = the RoPE'd Q block, the
// caches' slots = the RoPE'd K block and the V block (bf16).
//   qkv: [n, (heads + 2 kv_heads) d] f32  q: [n, heads, d] f32
cudaError_t QkvRopeWriteKv(const float* qkv, const AttnMeta& meta, int heads,
                           int kv_heads, int d, const double* inv_freq,
                           double mscale, bool adjacent_pairs, float* q,
                           const KvCaches& caches, cudaStream_t stream);

// Split-K (flash-decoding) attention: each (token, head) context is cut
// into `splits` parts reduced in a second kernel. `workspace` holds
// CudaDecodeWorkspaceFloats(n, heads, d, splits) floats
// (kernels/attention/paged_attention.h) when splits > 1 (unused otherwise).
//   q: [n, heads, d] f32  caches: bf16  out: [n, heads, d] (out_dt)
cudaError_t AttentionDecode(const float* q, const KvCaches& caches,
                            const AttnMeta& meta, int heads, int kv_heads,
                            int d, float scale, void* out, Dt out_dt,
                            float* workspace, int splits, cudaStream_t stream);

// Flash-style causal attention over tiles of up to kPrefillTile tokens of
// one sequence: K/V chunks are staged in shared memory once per tile.
cudaError_t AttentionPrefill(const float* q, const KvCaches& caches,
                             const AttnMeta& meta, int heads, int kv_heads,
                             int d, float scale, void* out, Dt out_dt,
                             cudaStream_t stream);

// out[r] = argmax of logits[r, 0:vocab] (lowest index among equal maxima).
//   logits: [rows, vocab] f32
cudaError_t Argmax(const float* logits, int64_t rows, int64_t vocab,
                   int32_t* out, cudaStream_t stream);

// Per-row parameters of Sample: SampleToken's, with the uniform draw
// u = SampleUniform(seed, step) made on the host.
struct SampleRow {
  float temperature;
  int32_t top_k;
  float top_p;
  int32_t unused;
  double u;
};

// out[r] = SampleToken(logits[r], params[r], step) for each row (params
// in device memory).
cudaError_t Sample(const float* logits, int64_t rows, int64_t vocab,
                   const SampleRow* params, int32_t* out, cudaStream_t stream);

// Gated DeltaNet (kernels/ssm/gated_delta_net_cuda.cu). A launch takes up
// to kDeltaRunsPerLaunch runs, each one sequence's consecutive tokens
// [begin, end) of the step and its state slot; `fresh` zeroes the slot's
// states first (a sequence starting at position 0). The runs' tokens and
// slots are disjoint (their blocks run side by side).
inline constexpr int kDeltaRunsPerLaunch = 64;
inline constexpr int kMaxConvTaps = 8;
inline constexpr int kMaxDeltaKeyDim = 256;
struct DeltaRuns {
  int count = 0;
  int begin[kDeltaRunsPerLaunch];
  int end[kDeltaRunsPerLaunch];
  int slot[kDeltaRunsPerLaunch];
  int fresh[kDeltaRunsPerLaunch];
};
struct DeltaShape {
  int k_heads, v_heads, k_dim, v_dim;
  bool v_tiled;
  int v_head_begin, v_heads_total;
};

// out[t, c] = silu(sum_j weight[c, j] xp[t + j, c]) over xp = [state;
// [qk | v]] per run, state [slots, taps - 1, nqk + nv] carried.
cudaError_t CausalConv1dSilu(const float* qk, const float* v, int64_t nqk,
                             int64_t nv, const float* weight, int taps,
                             float* state, const DeltaRuns& runs, float* out,
                             cudaStream_t stream);

// The gates (beta = sigmoid(beta_in), g = a softplus(alpha_in + dt)) and
// the delta rule over conv = [q | k | v] rows ([n, 2 k_heads k_dim +
// v_heads v_dim]); state [slots, v_heads, k_dim, v_dim] carried; out [n,
// v_heads, v_dim].
cudaError_t GatedDeltaRule(const float* conv, const float* beta_in,
                           const float* alpha_in, const float* dt,
                           const float* a, const DeltaShape& shape,
                           float* state, const DeltaRuns& runs, float* out,
                           cudaStream_t stream);

// out[r, :] = o[r, :] / sqrt(mean(o[r, :]^2) + eps) * w * silu(z[r, :]) for
// rows of d values (out may be o or z).
cudaError_t GatedRmsNorm(const float* o, const float* z, const float* w,
                         float eps, int64_t rows, int64_t d, float* out,
                         cudaStream_t stream);

// x[r, j] *= sigmoid(gate[r, per_row ? 0 : j]), x [n, c].
cudaError_t SigmoidGate(float* x, const float* gate, int64_t n, int64_t c,
                        bool per_row, cudaStream_t stream);

}  // namespace shardlm::cuda

#endif  // SHARDLM_KERNELS_CUDA_LAUNCH_H_
