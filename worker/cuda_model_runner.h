// The forward pass (worker/forward.h) on one GPU: one shard (the whole
// model, or a TP x PP shard with communicators from SetComms) over a paged
// bf16 KV cache, through the CUDA ops of kernels/cuda_ops.h.
// It takes the same StepInput as ModelRunner and returns the same logits
// and sampled tokens, so that the two can be compared step for step; what
// it adds is device memory, the step's upload, CUDA graphs and sampling on
// the device.
//
// Numerics: weights are dequantized on the host (LoadLlamaWeights) and
// stored as bf16; the residual stream, norms' statistics, RoPE, softmax
// and every accumulation are f32; GEMM inputs (normed activations,
// attention output, SwiGLU output) and the KV cache are bf16. The residual
// adds are fused into the o/down GEMMs (beta = 1).
//
// Not thread-safe: one thread drives a runner (any thread: each call makes
// the runner's device current). All work runs on the runner's own stream;
// Forward returns when the logits are on the host.
//
// KV tiers: block ids [0, num_blocks) are the device pool, [num_blocks,
// num_blocks + num_host_blocks) a host tier in pinned host memory that the
// attention kernels read (and write) in place over the bus, so that a lone
// sequence longer than the device pool runs with its oldest blocks there.
// A step's block copies (swaps, spills) run before its compute on a copy
// stream of their own, in the order recorded (PlanKvCopies), ordered by
// events after the previous step's compute and before this step's.
#ifndef SHARDLM_WORKER_CUDA_MODEL_RUNNER_H_
#define SHARDLM_WORKER_CUDA_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "core/tensor.h"
#include "kernels/cuda_ops.h"
#include "model/model_config.h"
#include "worker/activation_memory.h"
#include "worker/cuda_graphs.h"
#include "worker/cuda_weights.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"
#include "worker/model_runner.h"

namespace shardlm {

class CudaModelRunner : public ShardRunner {
 public:
  // Takes device `device`, allocates the KV pool (`kv`: bf16 blocks) and a
  // stream and cuBLAS handle of its own.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      int device, const ModelConfig& config, const KvPoolConfig& kv);

  // The backend, stream and cuBLAS handle weights must be made with.
  Backend& backend() { return *backend_; }
  const CudaExec& exec() const { return exec_; }
  // InvalidArgument when the shard's layers and KV heads are not the KV
  // pool's, or the weights are not fused (wqkv, w_gate_up: as
  // UploadLlamaWeights makes them).
  absl::Status SetWeights(LlamaWeights weights);
  const LlamaWeights& weights() const { return weights_; }
  // The shard's TP group and PP chain (none: a whole model). Steps with
  // communicators run eagerly. `on_stream`: the communicators enqueue on
  // this runner's stream (exec().stream; NCCL) and return when it has
  // drained, or, asynchronous ones, once queued (each step ends with their
  // Synchronize); else (host or staged communicators) the stream is
  // synchronized before each call.
  void SetComms(ShardComms comms, bool on_stream = false);

  const ModelConfig& config() const override { return config_; }
  int64_t weight_bytes() const override { return weights_.bytes_per_step(); }
  // The CUDA kernels keep K and V in bf16 (paged_attention_cuda.cu).
  DType kv_dtype() const override { return DType::kBF16; }
  // kv_dtype and kv_bytes_per_token from the pool's shape: bf16 K and V.
  RunnerStats stats() const override {
    RunnerStats s = stats_;
    s.kv_dtype = DType::kBF16;
    s.kv_bytes_per_token =
        2 * kv_config_.n_layers * kv_config_.kv_heads * kv_config_.head_dim * 2;
    return s;
  }
  const KvPoolConfig& kv_config() const { return kv_config_; }

  // Replaces the KV pools by `num_blocks` device blocks and
  // `num_host_blocks` blocks of pinned host memory (their contents are
  // lost): serving sizes the pools after the weights are on the device.
  absl::Status SetKvBlocks(int64_t num_blocks, int64_t num_host_blocks = 0);
  // Grows the activation buffers to `tokens` tokens and `rows` logit rows
  // (GraphPaddedRows(rows): decode steps run padded) now, so that steps
  // within those sizes allocate nothing (and memory sizing sees them, as
  // GpuActivationBytes counts).
  absl::Status ReserveActivations(int64_t tokens, int64_t rows);

  // As ModelRunner::Forward on a whole-model shard: the f32 logits of the
  // step's logit rows, [logit_rows.size(), vocab], on the host (empty when
  // there are none). InvalidArgument for bad steps, before anything is
  // written.
  absl::StatusOr<Tensor> Forward(const StepInput& step) override;

  // Forward and sampling, as SampleStep(step, Forward(step)): sampled on
  // the device (SampleCuda: SampleToken's draws) with only the ids copied
  // back, unless the logits or log-probabilities are wanted too or a row
  // has logit processors (penalties, logit_bias, min_tokens masks); then
  // the logits come back and SampleStep draws on the host.
  absl::StatusOr<StepOutput> Step(const StepInput& step) override;

  // Waits for all queued work.
  absl::Status Synchronize();

  // Decode steps of at most kMaxGraphBatch sequences run as CUDA graphs
  // (worker/cuda_graphs.h): padded to GraphBatchSize sequences and
  // replayed from a cache of graphs kept per step shape (padded batch,
  // block-table width, split count), so that a steady decode loop captures
  // a few graphs and then only replays: a decode step is ~15 launches per
  // layer, which otherwise bounds small batches by launch latency. Prefill
  // and mixed steps, steps with communicators or a mixture's routing launch
  // eagerly. A shape whose capture fails runs eagerly (reported once on
  // stderr); after kMaxGraphFailures such shapes graphs are off.
  void set_cuda_graphs(bool on) { graphs_ = on; }
  bool cuda_graphs() const { return graphs_; }
  int64_t graph_captures() const { return captures_; }
  int64_t graph_replays() const { return replays_; }
  static constexpr size_t kMaxGraphs = 64;
  static constexpr int kMaxGraphFailures = 3;

  CudaModelRunner(const CudaModelRunner&) = delete;
  CudaModelRunner& operator=(const CudaModelRunner&) = delete;
  ~CudaModelRunner();

 private:
  CudaModelRunner() = default;
  // Queues the layers and LM head for the uploaded step (n tokens, m
  // logit rows), eagerly or while capturing.
  absl::Status Launch(int64_t n, int64_t m);
  // Captures Launch(n, m) as an executable graph (cudaGraphExec_t).
  absl::StatusOr<void*> Capture(int64_t n, int64_t m);
  // Runs the uploaded decode step of n (padded) sequences from the graph
  // cache, capturing it on a miss; eagerly where capture fails.
  absl::Status LaunchGraph(int64_t n);
  absl::Status Validate(const StepInput& step) const;
  // Queues the step's block copies on the copy stream, after the previous
  // step's compute, and makes the compute stream wait for them.
  absl::Status RunCopies(absl::Span<const BlockCopy> copies);
  // Validates and uploads the step, then runs the layers and the LM head
  // (as a graph when it can); `logits` views the device logits [rows,
  // vocab] f32.
  absl::Status ForwardOnDevice(const StepInput& step, Tensor& logits);
  absl::Status Reserve(int64_t n, int64_t rows);
  // Waits for the step: the communicators' queued work, then the stream.
  absl::Status FinishStep();
  Tensor& Buffer(StepBuffer b);  // The member that holds it.

  int device_ = 0;
  ModelConfig config_;
  KvPoolConfig kv_config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
  CublasHandle cublas_;
  CudaExec exec_;
  CudaRopeTable rope_;  // config_.Rope() on the device.
  LlamaWeights weights_;
  ShardComms comms_;
  bool comms_on_stream_ = false;
  RunnerStats stats_;
  std::vector<Tensor> k_cache_, v_cache_;  // Per layer, bf16, device.
  std::vector<Tensor> k_host_, v_host_;    // Per layer, bf16, pinned; or none.
  std::unique_ptr<Stream> copy_stream_;    // Block copies between tiers.
  std::unique_ptr<Event> compute_done_, copies_done_;
  CudaAttentionBatch batch_;

  // Activation buffers of capacity cap_ tokens (cap_rows_ logit rows),
  // grown on demand; each step uses their first rows.
  int64_t cap_ = 0, cap_rows_ = 0;
  Tensor ids_, rows_, sampled_;           // i32 [cap], [cap_rows], [cap_rows]
  Tensor x_, q_, k_, v_, qkv_, gate_up_;  // f32
  Tensor partial_;  // f32 [cap, hidden]: TP or a mixture of experts
  // Mixtures of experts (ForwardBuffers::router_logits, moe_*).
  Tensor router_logits_, moe_x16_, moe_gate_, moe_up_, moe_h16_, moe_out_;
  Tensor xn16_, attn16_, h16_;     // bf16 GEMM inputs
  Tensor last_, last16_, logits_;  // [cap_rows, ...]
  Tensor host_logits_;             // pinned [cap_rows, vocab]
  Tensor gathered_;          // TP: flat [tp * cap_rows * vocab_padded] f32.
  Tensor attn_ws_;           // Decode attention splits for cap_rows tokens.
  Tensor host_logits_view_;  // The last eager step's host logits (TP).

  bool graphs_ = true;
  std::unique_ptr<GraphCache> graph_cache_;  // Of cudaGraphExec_t.
  int64_t generation_ = 0;  // Bumped when buffers or weights move.
  int64_t cached_generation_ = -1, cached_reallocations_ = -1;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_MODEL_RUNNER_H_
