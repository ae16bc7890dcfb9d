// The CUDA ops: device twins of the CPU kernels in kernels/<op>/<op>.h.
//
// Every function validates its tensors first (memory type kDevice, dtype,
// shape; InvalidArgument naming the op and argument) and then queues work
// on `exec.stream`; it returns when the work is queued, not done. Launch
// errors become Status. Activations are f32; weights and the KV cache are
// bf16; outputs that only feed a GEMM may be bf16. Accumulation is f32
// everywhere (cuBLAS: bf16 inputs, CUBLAS_COMPUTE_32F).
//
// CUDA-free header (handles are void*); link shardlm_kernels_cuda, built
// only when SHARDLM_WITH_CUDA.
#ifndef SHARDLM_KERNELS_CUDA_OPS_H_
#define SHARDLM_KERNELS_CUDA_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backend/cuda_backend.h"
#include "core/tensor.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/sampling/sampling.h"
#include "kernels/ssm/gated_delta_net.h"
#include "model/model_config.h"

namespace shardlm {

// Move-only owner of a cublasHandle_t bound to one stream for its life,
// with a workspace of its own (so GEMMs can be captured in CUDA graphs).
class CublasHandle {
 public:
  static absl::StatusOr<CublasHandle> Create(void* stream);
  CublasHandle() = default;
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();
  void* get() const { return handle_; }

 private:
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  void* handle_ = nullptr;
  std::shared_ptr<DeviceBuffer> workspace_;
};

// Where an op runs: a cudaStream_t (null: the legacy default stream) and,
// for LinearCuda, a cuBLAS handle bound to that same stream
// (CublasHandle::Create(stream)); LinearCuda rejects a mismatch.
struct CudaExec {
  void* stream = nullptr;
  void* cublas = nullptr;
};

// table: [rows, hidden] bf16|f32  ids: [n] i32  out: [n, hidden] f32.
// Ids outside [vocab_begin, vocab_begin + rows) embed to zero.
absl::Status EmbeddingCuda(const Tensor& table, const Tensor& ids,
                           int64_t vocab_begin, Tensor& out,
                           const CudaExec& exec);

// x: [n, d] f32  weight: [d] f32  out: [n, d] f32|bf16 (may be x).
absl::Status RmsNormCuda(const Tensor& x, const Tensor& weight, float eps,
                         Tensor& out, const CudaExec& exec);

// In place. x: [n, heads, head_dim] f32  positions: [n] i32. Unscaled:
// pair k turns by position * theta^(-2k / head_dim).
absl::Status RopeCuda(Tensor& x, const Tensor& positions, float theta,
                      RopeStyle style, const CudaExec& exec);

// A RopeTable's frequencies on the device, for RopeCuda: uploaded once
// (e.g. with a runner's weights), so that the kernel reads fixed memory
// (CUDA graphs replay it).
struct CudaRopeTable {
  RopeStyle style = RopeStyle::kRotateHalf;
  std::shared_ptr<DeviceBuffer> inv_freq;  // [pairs] double.
  int64_t pairs = 0;                       // head_dim / 2.
  double mscale = 1.0;
};
// Copies `table` to `device` (synchronously: a load-time call).
absl::StatusOr<CudaRopeTable> UploadRopeTable(const RopeTable& table,
                                              int device);

// As Rope (kernels/rope/rope.h) with a table: pair k turns by position *
// inv_freq[k], its cos and sin scaled by mscale (RoPE scaling).
absl::Status RopeCuda(Tensor& x, const Tensor& positions,
                      const CudaRopeTable& table, const CudaExec& exec);

// gate, up: [n, f] f32  out: [n, f] f32|bf16 (may be gate or up if f32).
absl::Status SwiGluCuda(const Tensor& gate, const Tensor& up, Tensor& out,
                        const CudaExec& exec);

// The fused gate/up GEMM's SwiGLU: out = silu(gate_up[:, :f]) *
// gate_up[:, f:]. gate_up: [n, 2 f] f32  out: [n, f] f32|bf16.
absl::Status SwiGluFusedCuda(const Tensor& gate_up, Tensor& out,
                             const CudaExec& exec);

// The fused QKV GEMM's output into its blocks of columns.
//   qkv: [n, qd + 2 kd] f32  q: [n, qd]  k, v: [n, kd] f32
absl::Status SplitQkvCuda(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v,
                          const CudaExec& exec);

// x += y, both f32 of one shape.
absl::Status AddInPlaceCuda(Tensor& x, const Tensor& y, const CudaExec& exec);

// Mixtures of experts (ForwardOps::GatherRows, ScatterAddRows), with the
// rows listed on the host, each in [0, n):
//   out[i, :] = x[rows[i], :]. x: [n, c] f32|bf16  out: [rows, c] the same
absl::Status GatherRowsCuda(const Tensor& x, absl::Span<const int32_t> rows,
                            Tensor& out, const CudaExec& exec);
//   out[rows[i], :] += weights[i] * y[i, :], rows distinct.
//   y: [rows, c] f32  out: [n, c] f32
absl::Status ScatterAddRowsCuda(const Tensor& y, absl::Span<const int32_t> rows,
                                absl::Span<const float> weights, Tensor& out,
                                const CudaExec& exec);

// x[i, :] += bias for every row. x: [n, c] f32  bias: [c] f32.
absl::Status AddBiasCuda(Tensor& x, const Tensor& bias, const CudaExec& exec);

// dst = src converted between f32 and bf16 (or copied); equal shapes.
absl::Status CastCuda(const Tensor& src, Tensor& dst, const CudaExec& exec);

// Seeded uniform values in [-scale, scale) (synthetic weights).
absl::Status FillRandomCuda(Tensor& t, uint64_t seed, float scale,
                            const CudaExec& exec);

// y = x w^T (y += x w^T when accumulate), through cuBLAS.
//   x: [n, in] bf16  w: [out, in] bf16  y: [n, out] f32|bf16
absl::Status LinearCuda(const Tensor& x, const Tensor& w, Tensor& y,
                        bool accumulate, const CudaExec& exec);

// Quantized weights on the device (issue #43 part 4): w a Q8_0 or Q4_0
// device tensor [out, in] holding the packed layout of
// kernels/linear/quant_device_layout.h (PackQuantized, copied up byte for
// byte; in a multiple of 32). Not run on a GPU yet.
//
// y = x w^T (y += x w^T when accumulate) for n <= kQuantGemvMaxRows (8):
// a GEMV that reads each weight block once for all rows, dequantizing in
// registers. x: [n, in] bf16  y: [n, out] f32|bf16.
absl::Status LinearQuantizedCuda(const Tensor& x, const Tensor& w, Tensor& y,
                                 bool accumulate, const CudaExec& exec);
// Rows [row_begin, row_end) of w as bf16 (d * code rounded to nearest) into
// dst [row_end - row_begin, in] bf16.
absl::Status DequantizePackedCuda(const Tensor& w, int64_t row_begin,
                                  int64_t row_end, Tensor& dst,
                                  const CudaExec& exec);
// Any n: LinearQuantizedCuda up to 8 rows; above, chunks of w's rows are
// dequantized into `scratch` (device bf16, DequantChunkRows of
// quant_device_pack.h) and multiplied by cuBLAS (exec.cublas), one GEMM a
// chunk. FailedPrecondition without a scratch of at least one row.
absl::Status LinearPackedCuda(const Tensor& x, const Tensor& w, Tensor& y,
                              bool accumulate, const Tensor& scratch,
                              const CudaExec& exec);
// The rank's dequantization scratch (DequantScratchBytes), held with the
// cuBLAS handle of `exec` (one per runner and stream) and freed with it:
// reserved once when quantized weights are uploaded, before the KV pool is
// sized from the free memory; grows only (synchronizing exec's stream).
// Allocated on the current device, which must be the stream's.
absl::Status ReserveDequantScratchCuda(const CudaExec& exec, int64_t bytes);
// That scratch as flat bf16 [bytes / 2], or an empty tensor when none.
Tensor DequantScratchCuda(const CudaExec& exec);
int64_t DequantScratchBytesCuda(const CudaExec& exec);
// Called by ~CublasHandle: drops the scratch of handle `cublas`.
void ReleaseDequantScratchCuda(void* cublas);

// One step's AttentionBatch on the device, validated against a cache of
// `num_blocks` blocks of `block_size` tokens: positions, sequence of each
// token, cache slots, padded block tables and prefill tiles in one i32
// buffer, and the batch's sliding window. Reusable: Upload reallocates only
// when the step is larger than any before. The buffer is rewritten by the next
// Upload, queued on the same stream, so work queued earlier still reads the old
// contents.
class CudaAttentionBatch {
 public:
  // Block ids are [0, num_blocks): the first device_blocks in the device
  // pool, the rest in a host tier (-1: all in the device pool).
  absl::Status Upload(const AttentionBatch& batch, int64_t block_size,
                      int64_t num_blocks, int device, const CudaExec& exec,
                      int64_t device_blocks = -1);

  int64_t tokens() const { return n_; }
  int64_t max_context() const { return max_ctx_; }
  // The longest run of one sequence's tokens in a prefill tile (1 for a
  // pure decode step).
  int64_t max_tile() const { return max_tile_; }
  const Tensor& positions() const { return positions_; }  // [n] i32
  // Changes whenever the device buffer is replaced (CUDA graphs captured
  // over the old one are stale then).
  int64_t reallocations() const { return reallocations_; }
  // Layout of the buffer (with tokens(), fixes every kernel argument).
  int64_t padded_blocks() const { return max_blocks_; }
  int64_t tiles() const { return n_tiles_; }
  int64_t sequences() const { return n_seqs_; }

 private:
  friend class CudaAttentionAccess;
  std::shared_ptr<DeviceBuffer> buffer_;
  Tensor positions_;
  int64_t n_ = 0, n_seqs_ = 0, max_blocks_ = 0, max_ctx_ = 0, n_tiles_ = 0;
  int64_t block_size_ = 0, max_tile_ = 0, reallocations_ = 0, window_ = 0;
  int64_t num_blocks_ = 0, device_blocks_ = 0;
  int64_t off_token_seq_ = 0, off_slots_ = 0, off_tables_ = 0,
          off_tile_begin_ = 0, off_tile_len_ = 0;
};

// k, v: [n, kv_heads, head_dim] f32  caches: [blocks, bs, kv_heads,
// head_dim] bf16 on the device; with a batch whose block ids reach past
// the device pool, k_host/v_host are the host tier ([host blocks, bs,
// kv_heads, head_dim] bf16 in pinned memory, which the kernels address in
// place).
absl::Status WriteKvCuda(const Tensor& k, const Tensor& v,
                         const CudaAttentionBatch& batch, Tensor& k_cache,
                         Tensor& v_cache, const CudaExec& exec,
                         Tensor* k_host = nullptr, Tensor* v_host = nullptr);

// SplitQkvCuda, RopeCuda of the Q and K heads and WriteKvCuda in one
// kernel: q = RoPE'd Q block of the fused QKV output; the K (RoPE'd) and V
// blocks go straight to the caches (as WriteKvCuda's; no f32 K or V is
// written). Bit for bit the unfused ops' results.
//   qkv: [n, (heads + 2 kv_heads) head_dim] f32  q: [n, heads, head_dim] f32
absl::Status QkvRopeWriteKvCuda(const Tensor& qkv,
                                const CudaAttentionBatch& batch,
                                const CudaRopeTable& rope, Tensor& q,
                                Tensor& k_cache, Tensor& v_cache,
                                const CudaExec& exec, Tensor* k_host = nullptr,
                                Tensor* v_host = nullptr);

enum class AttentionKernel {
  kAuto,     // kDecode when every sequence has one token in the step.
  kDecode,   // Split-K over the context (flash-decoding).
  kPrefill,  // Query tiles with K/V chunks staged in shared memory.
};

// The decode kernel's split count PagedAttentionCuda picks (splits = 0) for
// `batch` with `heads` query and `kv_heads` KV heads on the current device
// (CudaDecodeSplits of kernels/attention/cuda_decode_plan.h); `window` as
// for PagedAttentionCuda.
int CudaDecodeSplitsFor(const CudaAttentionBatch& batch, int64_t heads,
                        int64_t kv_heads, int64_t window = -1);

// Causal attention as PagedAttention (call WriteKvCuda first), over the
// last batch.window positions of each query when the uploaded batch has one.
//   q: [n, heads, head_dim] f32  out: [n, heads, head_dim] f32|bf16
// head_dim must be a multiple of 32, at most 256. `splits` (decode) 0
// picks one from the context length.
// k_host / v_host: the host tier, as for WriteKvCuda. `window` >= 0
// replaces the batch's sliding window for this call (layers differ:
// Qwen2's max_window_layers); -1 keeps it. `workspace`: a device f32
// tensor the decode kernel's splits use when it holds enough floats
// (CudaDecodeWorkspaceFloats); otherwise (or when null) they come from the
// stream-ordered pool for the call, memory that KV sizing did not see.
absl::Status PagedAttentionCuda(const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache,
                                const CudaAttentionBatch& batch, float scale,
                                Tensor& out, const CudaExec& exec,
                                AttentionKernel kernel = AttentionKernel::kAuto,
                                int splits = 0, const Tensor* k_host = nullptr,
                                const Tensor* v_host = nullptr,
                                int64_t window = -1,
                                Tensor* workspace = nullptr);

// Swap: copies whole KV blocks src_blocks[i] of `src` to dst_blocks[i] of
// `dst` (caches [blocks, bs, kv_heads, head_dim] of one dtype and block
// shape; device <-> pinned host or device <-> device), asynchronously on
// `stream` (the swap stream: record an event to know when it is done).
// Runs of consecutive blocks go as one copy.
absl::Status CopyKvBlocksCuda(const Tensor& src, Tensor& dst,
                              absl::Span<const int32_t> src_blocks,
                              absl::Span<const int32_t> dst_blocks,
                              void* stream);

// Greedy sampling: out[r] = argmax of logits[r] (lowest index on ties, as
// SampleToken). logits: [rows, vocab] f32  out: [rows] i32.
absl::Status ArgmaxCuda(const Tensor& logits, Tensor& out,
                        const CudaExec& exec);

// Sampling on the device with SampleToken's semantics and draws: out[r] =
// SampleToken(logits[r], params[r], steps[r]) (greedy, temperature,
// top-k, top-p; the uniform draw SampleUniform(seed, step) is made on the
// host; rows with logit processors, SamplingParams::HasLogitProcessors,
// are refused: they are sampled on the host). Sums are in double like the
// CPU's, in another order, so a draw landing within ~1e-15 of a boundary could
// differ. logits: [rows, vocab] f32  out: [rows] i32.
absl::Status SampleCuda(const Tensor& logits,
                        absl::Span<const SamplingParams> params,
                        absl::Span<const uint64_t> steps, Tensor& out,
                        const CudaExec& exec);

// One sequence's consecutive tokens [begin, end) of a step and its state
// slot; `fresh`: its states are zeroed first (its tokens start at 0).
struct CudaDeltaRun {
  int64_t begin = 0, end = 0;
  int32_t slot = 0;
  bool fresh = false;
};

// One Gated DeltaNet layer's sequence mixing (kernels/ssm/gated_delta_net.h)
// as CpuForwardOps::GatedDeltaNet computes it: the convolution of [qk | v]
// and SiLU, the gates beta = sigmoid(beta_in) and g = a softplus(alpha_in
// + dt), the delta rule, and the gated RMS norm by z, each run through its
// slot. The runs are in token order and cover [0, n) exactly, their slots
// distinct. All f32 on the device:
//   qk [n, 2 k_heads k_dim], v, z [n, v_heads v_dim], beta_in, alpha_in
//   [n, v_heads], conv_weight [qk + v channels, taps] (2 <= taps <= 8), dt,
//   a [v_heads], norm [v_dim]; conv_state [slots, taps - 1, channels],
//   recurrent_state [slots, v_heads, k_dim, v_dim] (k_dim <= 256), both
//   in/out; conv_out [n, channels] and o [n, v_heads v_dim] scratch; out
//   [n, v_heads v_dim].
absl::Status GatedDeltaNetCuda(
    const Tensor& qk, const Tensor& v, const Tensor& z, const Tensor& beta_in,
    const Tensor& alpha_in, const Tensor& conv_weight, const Tensor& dt,
    const Tensor& a, const Tensor& norm, float eps,
    const GatedDeltaNetShape& shape, absl::Span<const CudaDeltaRun> runs,
    Tensor& conv_state, Tensor& recurrent_state, Tensor& conv_out, Tensor& o,
    Tensor& out, const CudaExec& exec);

// x *= sigmoid(gate): x [n, c] f32, gate [n, c] or [n, 1] (one per row).
absl::Status SigmoidGateCuda(Tensor& x, const Tensor& gate,
                             const CudaExec& exec);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_CUDA_OPS_H_
