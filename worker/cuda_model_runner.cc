#include "worker/cuda_model_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_status.h"
#include "core/log.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/sampling/sampling.h"
#include "worker/activation_memory.h"
#include "worker/cuda_forward_ops.h"
#include "worker/forward.h"
#include "worker/kv_copy_plan.h"
#include "worker/sample_step.h"

namespace shardlm {
absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    int device, const ModelConfig& config, const KvPoolConfig& kv) {
  RETURN_IF_ERROR(config.Validate());
  if (config.is_mla()) {
    return absl::UnimplementedError(absl::StrCat(
        "GPU workers do not run ", config.architecture,
        "'s multi-head latent attention yet; run it on CPU workers "
        "(--device cpu)"));
  }
  // GLM-4.5's parts run on CPU workers only so far (docs/moe.md).
  if (config.RotaryDims() != config.head_dim || config.n_shared_experts > 0 ||
      config.n_dense_layers > 0 ||
      config.expert_gating != ExpertGating::kSoftmax ||
      config.expert_score_bias || config.expert_groups > 1 ||
      config.expert_weights_scale != 1.0f) {
    return absl::UnimplementedError(absl::StrCat(
        "GPU workers do not run ", config.architecture,
        "'s partial RoPE, shared experts, dense layers in a mixture or "
        "sigmoid/grouped routing yet; run it on CPU workers (--device cpu)"));
  }
  // Gemma 2's and 3's parts: CPU workers only so far
  // (docs/design-notes.md).
  if (config.post_norms || config.ffn_activation != FfnActivation::kSilu ||
      config.embedding_scale != 1.0f || config.rope_local_theta > 0 ||
      config.attn_scale_factor != 1.0f || config.norm_weight_offset != 0 ||
      config.attn_softcap != 0 || config.final_softcap != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "GPU workers do not run ", config.architecture,
        "'s GeGLU, post-norms, scaled embeddings, per-layer RoPE or "
        "soft-capping yet; run it on CPU workers (--device cpu)"));
  }
  if (kv.n_layers < 1 || kv.n_layers > config.n_layers || kv.kv_heads < 1 ||
      kv.kv_heads > config.n_kv_heads || kv.head_dim != config.head_dim ||
      kv.block_size <= 0 || kv.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool of ", kv.n_layers, " layers x ", kv.kv_heads,
                     " heads x ", kv.head_dim, " (", kv.num_blocks,
                     " blocks of ", kv.block_size, ") does not fit the model"));
  }
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner());
  r->device_ = device;
  r->config_ = config;
  r->kv_config_ = kv;
  r->kv_config_.dtype = DType::kBF16;
  ASSIGN_OR_RETURN(r->backend_, NewCudaBackend(device));
  ASSIGN_OR_RETURN(r->stream_, r->backend_->CreateStream());
  ASSIGN_OR_RETURN(r->cublas_, CublasHandle::Create(r->stream_->native()));
  // The model's RoPE frequencies (scaled or not), read by every step.
  ASSIGN_OR_RETURN(r->rope_, UploadRopeTable(config.Rope(), device));
  r->exec_ = {.stream = r->stream_->native(), .cublas = r->cublas_.get()};
  RETURN_IF_ERROR(r->SetKvBlocks(kv.num_blocks));
  return r;
}

absl::Status CudaModelRunner::SetKvBlocks(int64_t num_blocks,
                                          int64_t num_host_blocks) {
  if (num_blocks <= 0 || num_host_blocks < 0 ||
      (num_blocks + num_host_blocks) * kv_config_.block_size > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pools of ", num_blocks, " device and ",
                     num_host_blocks, " host blocks (int32 slots)"));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  if (num_host_blocks > 0) {
    // The kernels read the host tier through its host pointers: pinned
    // memory is mapped at the same address only with unified addressing
    // (not, e.g., in confidential-computing mode).
    int unified = 0, can_map = 0;
    RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(
        &unified, cudaDevAttrUnifiedAddressing, device_));
    RETURN_IF_CUDA_ERROR(
        cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device_));
    if (unified == 0 || can_map == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA device ", device_,
          " cannot address pinned host memory in place (unified addressing ",
          unified, ", host memory mapping ", can_map,
          "): a host KV tier (--cpu-offload-bytes) is not possible here"));
    }
  }
  if (stream_ != nullptr) RETURN_IF_ERROR(stream_->Synchronize());
  if (copy_stream_ != nullptr) RETURN_IF_ERROR(copy_stream_->Synchronize());
  // Free the old pools before allocating the new ones.
  k_cache_.clear();
  v_cache_.clear();
  k_host_.clear();
  v_host_.clear();
  const KvPoolConfig& kv = kv_config_;
  const Shape cache = {num_blocks, kv.block_size, kv.kv_heads, kv.head_dim};
  const Shape host = {num_host_blocks, kv.block_size, kv.kv_heads, kv.head_dim};
  for (int64_t l = 0; l < kv.n_layers; ++l) {
    ASSIGN_OR_RETURN(
        Tensor k, backend_->Allocate(DType::kBF16, cache, MemoryType::kDevice));
    ASSIGN_OR_RETURN(
        Tensor v, backend_->Allocate(DType::kBF16, cache, MemoryType::kDevice));
    k_cache_.push_back(std::move(k));
    v_cache_.push_back(std::move(v));
    if (num_host_blocks > 0) {
      // Pinned memory is mapped into the device's address space (unified
      // addressing): the kernels take these pointers as they are.
      ASSIGN_OR_RETURN(Tensor hk, backend_->Allocate(DType::kBF16, host,
                                                     MemoryType::kHostPinned));
      ASSIGN_OR_RETURN(Tensor hv, backend_->Allocate(DType::kBF16, host,
                                                     MemoryType::kHostPinned));
      k_host_.push_back(std::move(hk));
      v_host_.push_back(std::move(hv));
    }
  }
  kv_config_.num_blocks = num_blocks;
  kv_config_.num_host_blocks = num_host_blocks;
  ++generation_;  // Captured graphs point at the old pool.
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ReserveActivations(int64_t tokens, int64_t rows) {
  if (tokens <= 0 || rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve ", tokens, " tokens and ", rows, " rows: must be positive"));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  // As GpuActivationBytes counts: decode steps run padded.
  rows = GraphPaddedRows(rows);
  return Reserve(std::max(tokens, rows), rows);
}

absl::Status CudaModelRunner::Synchronize() { return stream_->Synchronize(); }

CudaModelRunner::~CudaModelRunner() {
  graph_cache_.reset();  // Before the stream its graphs wait on.
}

absl::Status CudaModelRunner::SetWeights(LlamaWeights weights) {
  const ShardSpec& spec = weights.spec;
  if (spec.n_layers() != kv_config_.n_layers ||
      spec.n_kv_heads() != kv_config_.kv_heads ||
      static_cast<int64_t>(weights.layers.size()) != spec.n_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights of shard ", spec.DebugString(), " (", weights.layers.size(),
        " layers) do not fit the KV pool of ", kv_config_.n_layers,
        " layers x ", kv_config_.kv_heads, " KV heads"));
  }
  const bool moe = weights.config.is_moe();
  for (const LlamaLayerWeights& l : weights.layers) {
    if (l.wqkv.empty() || (moe ? l.exp_gate.empty() : l.w_gate_up.empty())) {
      return absl::InvalidArgumentError(
          "CudaModelRunner takes fused QKV and gate/up weights, or experts "
          "(UploadLlamaWeights makes them)");
    }
  }
  weights_ = std::move(weights);
  ++generation_;         // Graphs hold the old weights' addresses.
  cap_ = cap_rows_ = 0;  // Buffers are sized by the shard.
  return absl::OkStatus();
}

void CudaModelRunner::SetComms(ShardComms comms, bool on_stream) {
  comms_ = comms;
  comms_on_stream_ = on_stream;
  ++generation_;
}

absl::Status CudaModelRunner::Validate(const StepInput& step) const {
  const ModelConfig& c = config_;
  const size_t n = step.tokens.size();
  if (weights_.layers.empty() ||
      static_cast<int64_t>(weights_.layers.size()) != kv_config_.n_layers) {
    return absl::FailedPreconditionError("CudaModelRunner has no weights");
  }
  if (n == 0 && step.copies.empty()) {
    return absl::InvalidArgumentError("step has no tokens");
  }
  // Copies are checked where they are planned (RunCopies), before any is
  // queued; the block tables by the attention batch's upload.
  if (step.positions.size() != n || step.token_seq.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", n, " tokens but ", step.positions.size(),
                     " positions and ", step.token_seq.size(), " seq ids"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (step.tokens[i] < 0 || step.tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", step.tokens[i],
                       " is outside the vocabulary of ", c.vocab_size));
    }
    if (step.positions[i] < 0 || step.positions[i] >= c.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", step.positions[i],
                       " is outside the context of ", c.context_length));
    }
  }
  for (int32_t r : step.logit_rows) {
    if (r < 0 || static_cast<size_t>(r) >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit row ", r, " of a step of ", n, " tokens"));
    }
  }
  return absl::OkStatus();
}

Tensor& CudaModelRunner::Buffer(StepBuffer b) {
  switch (b) {
    case StepBuffer::kIds:
      return ids_;
    case StepBuffer::kX:
      return x_;
    case StepBuffer::kQ:
      return q_;
    case StepBuffer::kK:
      return k_;
    case StepBuffer::kV:
      return v_;
    case StepBuffer::kQkv:
      return qkv_;
    case StepBuffer::kGateUp:
      return gate_up_;
    case StepBuffer::kXn:
      return xn16_;
    case StepBuffer::kAttn:
      return attn16_;
    case StepBuffer::kH:
      return h16_;
    case StepBuffer::kPartial:
      return partial_;
    case StepBuffer::kRows:
      return rows_;
    case StepBuffer::kSampled:
      return sampled_;
    case StepBuffer::kLast:
      return last_;
    case StepBuffer::kLastN:
      return last16_;
    case StepBuffer::kLogits:
      return logits_;
    case StepBuffer::kGathered:
      return gathered_;
    case StepBuffer::kRouterLogits:
      return router_logits_;
    case StepBuffer::kMoeX:
      return moe_x16_;
    case StepBuffer::kMoeGate:
      return moe_gate_;
    case StepBuffer::kMoeUp:
      return moe_up_;
    case StepBuffer::kMoeH:
      return moe_h16_;
    case StepBuffer::kMoeOut:
      return moe_out_;
  }
  return x_;  // Unreachable: every StepBuffer is above.
}

// The buffers of GpuStepBuffers (activation_memory.h), which serving counts
// before it sizes the KV pool; grown to twice the old capacity at least.
absl::Status CudaModelRunner::Reserve(int64_t n, int64_t rows) {
  const ModelConfig& c = config_;
  const ShardSpec& spec = weights_.spec;
  Backend& b = *backend_;
  // Every step calls this; the list is made only when a buffer grows.
  const auto allocate = [&](bool per_row, int64_t cap) -> absl::Status {
    for (const StepBufferPlan& p : GpuStepBuffers(ActivationDimsOf(c, spec))) {
      if (p.per_row != per_row) continue;
      const Shape shape = p.width == 1 ? Shape{cap}
                          : p.flat     ? Shape{cap * p.width}
                                       : Shape{cap, p.width};
      ASSIGN_OR_RETURN(Buffer(p.buffer),
                       b.Allocate(p.dtype, shape, MemoryType::kDevice));
    }
    return absl::OkStatus();
  };
  if (n > cap_) {
    const int64_t cap = std::max<int64_t>(n, 2 * cap_);
    RETURN_IF_ERROR(stream_->Synchronize());  // Old buffers may be in use.
    RETURN_IF_ERROR(allocate(/*per_row=*/false, cap));
    cap_ = cap;
    ++generation_;
  }
  if (rows > cap_rows_) {
    const int64_t cap = std::max<int64_t>(rows, 2 * cap_rows_);
    RETURN_IF_ERROR(stream_->Synchronize());
    RETURN_IF_ERROR(allocate(/*per_row=*/true, cap));
    if (spec.last_stage()) {
      // Where the logits land on the host (pinned: not device memory).
      ASSIGN_OR_RETURN(host_logits_,
                       b.Allocate(DType::kF32, {cap, c.vocab_size},
                                  MemoryType::kHostPinned));
    }
    // The decode attention's splits for up to `cap` sequences of one token,
    // held for good so that KV sizing sees it (the kernel would otherwise
    // take it from the stream-ordered pool each step).
    const int64_t ws_floats = CudaDecodeWorkspaceFloats(
        cap, spec.n_heads(), c.head_dim, kMaxCudaDecodeSplits);
    ASSIGN_OR_RETURN(attn_ws_,
                     b.Allocate(DType::kF32, {std::max<int64_t>(ws_floats, 1)},
                                MemoryType::kDevice));
    cap_rows_ = cap;
    ++generation_;
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::RunCopies(absl::Span<const BlockCopy> copies) {
  const KvPoolConfig& kv = kv_config_;
  ASSIGN_OR_RETURN(std::vector<KvCopyRun> runs,
                   PlanKvCopies(copies, kv.num_blocks, kv.num_host_blocks));
  if (runs.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  if (copy_stream_ == nullptr) {
    ASSIGN_OR_RETURN(copy_stream_, backend_->CreateStream());
    ASSIGN_OR_RETURN(compute_done_, backend_->CreateEvent());
    ASSIGN_OR_RETURN(copies_done_, backend_->CreateEvent());
  }
  // After the previous step's compute (which read the sources and may
  // still read blocks about to be overwritten)...
  RETURN_IF_ERROR(compute_done_->Record(*stream_));
  RETURN_IF_ERROR(compute_done_->Wait(*copy_stream_));
  for (const KvCopyRun& run : runs) {
    for (int64_t l = 0; l < kv.n_layers; ++l) {
      const auto pool = [&](KvTier t, bool key) -> Tensor& {
        if (t == KvTier::kDevice) return key ? k_cache_[l] : v_cache_[l];
        return key ? k_host_[l] : v_host_[l];
      };
      for (const bool key : {true, false}) {
        RETURN_IF_ERROR(CopyKvBlocksCuda(pool(run.src, key), pool(run.dst, key),
                                         run.src_blocks, run.dst_blocks,
                                         copy_stream_->native()));
      }
    }
  }
  // ...and before this step's.
  RETURN_IF_ERROR(copies_done_->Record(*copy_stream_));
  RETURN_IF_ERROR(copies_done_->Wait(*stream_));
  stats_.copied_blocks += static_cast<int64_t>(copies.size());
  stats_.copy_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ForwardOnDevice(const StepInput& step,
                                              Tensor& logits) {
  RETURN_IF_ERROR(Validate(step));
  // The caller's thread may have another device current.
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  if (step.tokens.empty()) return RunCopies(step.copies);  // Copies only.
  int64_t n = static_cast<int64_t>(step.tokens.size());
  const int64_t m = static_cast<int64_t>(step.logit_rows.size());
  // Communicator calls are host calls: no graphs across them; nor across
  // a mixture's routing, which reads the router's logits on the host.
  const bool comms = comms_.tp != nullptr || comms_.pp != nullptr;
  const bool graph = graphs_ && !comms && !config_.is_moe() &&
                     GraphBatchSize(n) > 0 && IsDecodeStep(step);
  // A graph's decode step runs at its padded batch size; its inputs are
  // these (the step's own otherwise).
  PaddedDecode padded;
  absl::Span<const int32_t> tokens = step.tokens, rows = step.logit_rows;
  // Block tables are checked here, before anything is written.
  // Windows are per layer (the attention call's).
  AttentionBatch attn{.positions = step.positions, .token_seq = step.token_seq};
  if (graph) {
    padded = PadDecodeStep(step, GraphBatchSize(n));
    n = static_cast<int64_t>(padded.tokens.size());
    tokens = padded.tokens;
    rows = padded.logit_rows;
    attn = {.positions = padded.positions,
            .token_seq = padded.token_seq,
            .block_tables = padded.block_tables,
            .padding = padded.padding};
  } else {
    for (const auto& table : step.block_tables)
      attn.block_tables.push_back(table);
  }
  const int64_t rows_run = static_cast<int64_t>(rows.size());
  // A step of one token per sequence runs the decode attention, whose
  // workspace is sized by rows: enough for all n of them.
  const bool decode = static_cast<size_t>(n) == attn.block_tables.size();
  RETURN_IF_ERROR(Reserve(n, std::max<int64_t>({rows_run, 1, decode ? n : 0})));
  RETURN_IF_ERROR(batch_.Upload(attn, kv_config_.block_size,
                                kv_config_.total_blocks(), device_, exec_,
                                kv_config_.num_blocks));
  // Everything is checked now (the copies by their plan): they go first.
  RETURN_IF_ERROR(RunCopies(step.copies));
  auto* s = static_cast<cudaStream_t>(exec_.stream);
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(ids_.raw(), tokens.data(),
                                       n * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, s));
  const bool sampled_here = m > 0 && weights_.spec.last_stage();
  if (rows_run > 0) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(rows_.raw(), rows.data(),
                                         rows_run * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, s));
  }
  if (sampled_here) {
    // The step's own rows: a padded step's come first.
    ASSIGN_OR_RETURN(logits, logits_.Rows(0, m));
  }
  if (graph) return LaunchGraph(n);
  host_logits_view_ = Tensor();
  RETURN_IF_ERROR(Launch(n, m));
  // The TP gather leaves the logits on the host, on TP rank 0 only: the
  // other ranks return none (as the CPU runner does), not their device
  // buffer of vocab_padded columns.
  if (comms_.tp != nullptr) logits = host_logits_view_;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::LaunchGraph(int64_t n) {
  if (graph_cache_ == nullptr) {
    graph_cache_ = std::make_unique<GraphCache>(
        kMaxGraphs, kMaxGraphFailures, [this](void* exec) {
          // A replay of it may still run.
          cudaStreamSynchronize(static_cast<cudaStream_t>(exec_.stream));
          cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
        });
  }
  // Graphs captured over buffers that have moved since are of no use.
  if (cached_generation_ != generation_ ||
      cached_reallocations_ != batch_.reallocations()) {
    graph_cache_->Clear();
    cached_generation_ = generation_;
    cached_reallocations_ = batch_.reallocations();
  }
  // With the buffers' generation (above), these fix every kernel argument
  // of a decode step, so a graph captured for the same key replays it.
  const GraphCache::Key key = {
      n, batch_.padded_blocks(),
      // The decode kernel's split count on layers without a window
      // (windowed layers' change only when it does).
      CudaDecodeSplitsFor(batch_, weights_.spec.n_heads(),
                          weights_.spec.n_kv_heads(),
                          /*window=*/0)};
  if (graph_cache_->Failed(key)) return Launch(n, n);
  void* exec = graph_cache_->Find(key);
  if (exec == nullptr) {
    absl::StatusOr<void*> captured = Capture(n, n);
    if (absl::IsResourceExhausted(captured.status()) &&
        graph_cache_->size() > 0) {
      // The other shapes' graphs hold device memory: drop them and retry
      // before counting this shape as failed.
      graph_cache_->Clear();
      captured = Capture(n, n);
    }
    if (!captured.ok()) {
      graph_cache_->MarkFailed(key);
      Log("CUDA graph capture of a decode step of %lld sequences failed, "
          "running that shape eagerly%s: %s",
          static_cast<long long>(n),
          graph_cache_->Disabled() ? " (and every other from now on)" : "",
          std::string(captured.status().message()).c_str());
      if (graph_cache_->Disabled()) graphs_ = false;
      return Launch(n, n);
    }
    exec = *captured;
    graph_cache_->Insert(key, exec);
  } else {
    ++replays_;
  }
  return CudaStatus(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec),
                                    static_cast<cudaStream_t>(exec_.stream)),
                    "cudaGraphLaunch");
}

absl::StatusOr<void*> CudaModelRunner::Capture(int64_t n, int64_t m) {
  auto* s = static_cast<cudaStream_t>(exec_.stream);
  RETURN_IF_CUDA_ERROR(
      cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const absl::Status launched = Launch(n, m);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (!launched.ok() || ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // Clear a capture error; the stream is usable.
    RETURN_IF_ERROR(launched);
    return CudaStatus(
        ended == cudaSuccess ? cudaErrorStreamCaptureInvalidated : ended,
        "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_ERROR(CudaStatus(inst, "cudaGraphInstantiate"));
  ++captures_;
  return static_cast<void*>(exec);
}

absl::Status CudaModelRunner::Launch(int64_t n, int64_t m) {
  // Views of the first n (m) rows of the runner's buffers; GEMM inputs are
  // bf16, the residual stream and GEMM outputs f32.
  ForwardBuffers b;
  ASSIGN_OR_RETURN(Tensor ids, ids_.Rows(0, n));
  ASSIGN_OR_RETURN(b.x, x_.Rows(0, n));
  ASSIGN_OR_RETURN(b.xn, xn16_.Rows(0, n));
  ASSIGN_OR_RETURN(b.q, q_.Rows(0, n));
  ASSIGN_OR_RETURN(b.k, k_.Rows(0, n));
  ASSIGN_OR_RETURN(b.v, v_.Rows(0, n));
  ASSIGN_OR_RETURN(b.attn, attn16_.Rows(0, n));
  ASSIGN_OR_RETURN(b.qkv, qkv_.Rows(0, n));
  if (config_.is_moe()) {
    ASSIGN_OR_RETURN(b.router_logits, router_logits_.Rows(0, n));
    ASSIGN_OR_RETURN(b.moe_x, moe_x16_.Rows(0, n));
    ASSIGN_OR_RETURN(b.moe_gate, moe_gate_.Rows(0, n));
    ASSIGN_OR_RETURN(b.moe_up, moe_up_.Rows(0, n));
    ASSIGN_OR_RETURN(b.moe_h, moe_h16_.Rows(0, n));
    ASSIGN_OR_RETURN(b.moe_out, moe_out_.Rows(0, n));
  } else {
    ASSIGN_OR_RETURN(b.gate_up, gate_up_.Rows(0, n));
    ASSIGN_OR_RETURN(b.h, h16_.Rows(0, n));
  }
  if (comms_.tp != nullptr || config_.is_moe()) {
    ASSIGN_OR_RETURN(b.partial, partial_.Rows(0, n));
  }
  const ShardSpec& spec = weights_.spec;
  Tensor rows;
  if (m > 0 && spec.last_stage()) {
    ASSIGN_OR_RETURN(rows, rows_.Rows(0, m));
    ASSIGN_OR_RETURN(b.last, last_.Rows(0, m));
    ASSIGN_OR_RETURN(b.last_n, last16_.Rows(0, m));
    ASSIGN_OR_RETURN(b.local_logits, logits_.Rows(0, m));
    if (comms_.tp != nullptr) {
      const int64_t tp = spec.tp_size, vp = spec.vocab_padded;
      ASSIGN_OR_RETURN(Tensor flat, gathered_.Rows(0, tp * m * vp));
      ASSIGN_OR_RETURN(b.gathered, flat.Reshaped({tp, m, vp}));
    }
  }
  CudaForwardOps ops(exec_, ids, rows, batch_, rope_, attn_ws_);
  // The stream's work must be done before a communicator reads the data,
  // unless it runs on this stream too (NCCL, enqueued after the kernels).
  if (stats_.expert_tokens.size() != static_cast<size_t>(spec.n_experts())) {
    stats_.expert_begin = spec.expert_begin;
    stats_.expert_tokens.assign(spec.n_experts(), 0);
  }
  const ShardForward forward{
      .weights = weights_,
      .comms = comms_,
      .ops = ops,
      .comm =
          [this](const std::function<absl::Status()>& call) {
            if (!comms_on_stream_) RETURN_IF_ERROR(stream_->Synchronize());
            return call();
          },
      .expert_tokens = &stats_.expert_tokens};
  RETURN_IF_ERROR(forward.Layers(b, {.k = &k_cache_,
                                     .v = &v_cache_,
                                     .k_host = &k_host_,
                                     .v_host = &v_host_}));
  if (!spec.last_stage()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Tensor logits, forward.Logits(b));
  if (logits.memory() != MemoryType::kDevice) host_logits_view_ = logits;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::FinishStep() {
  // An asynchronous communicator's collectives were only queued: its
  // Synchronize returns the error (naming the group and peers) that its
  // watchdog recorded, where a hung peer would otherwise hold the stream.
  for (Communicator* c : {comms_.tp, comms_.pp}) {
    if (c != nullptr && c->asynchronous()) RETURN_IF_ERROR(c->Synchronize());
  }
  return stream_->Synchronize();
}

absl::StatusOr<Tensor> CudaModelRunner::Forward(const StepInput& step) {
  const StepTimer timer(stats_);
  Tensor logits;
  RETURN_IF_ERROR(ForwardOnDevice(step, logits));
  if (logits.empty() || logits.memory() != MemoryType::kDevice) {
    RETURN_IF_ERROR(FinishStep());
    return logits;  // None (a stage before the last), or gathered on the host.
  }
  ASSIGN_OR_RETURN(Tensor pinned, host_logits_.Rows(0, logits.dim(0)));
  RETURN_IF_ERROR(backend_->Copy(logits, pinned, stream_.get()));
  RETURN_IF_ERROR(FinishStep());
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::HostUninitialized(DType::kF32, logits.shape()));
  std::memcpy(out.raw(), pinned.raw(), out.bytes());
  return out;
}

absl::StatusOr<StepOutput> CudaModelRunner::Step(const StepInput& step) {
  const size_t rows = step.logit_rows.size();
  RETURN_IF_ERROR(ValidateStepSampling(step));
  const bool logprobs = std::any_of(step.logprobs.begin(), step.logprobs.end(),
                                    [](int32_t n) { return n > 0; });
  // The logit processors (penalties, logit_bias, min_tokens and grammar
  // masks) run on the host: the device sampler has no sparse per-row edits.
  const bool processed =
      std::any_of(
          step.sampling.begin(), step.sampling.end(),
          [](const SamplingParams& p) { return p.HasLogitProcessors(); }) ||
      std::any_of(step.history.begin(), step.history.end(),
                  [](const SampleHistory& h) { return !h.empty(); }) ||
      step.late_masks != nullptr;
  // Sampled on the host when the logits end there anyway (TP gather).
  // Scored rows (prompt logprobs) too: they come with logprobs.
  if (step.return_logits || logprobs || processed || rows == 0 ||
      !step.score_tokens.empty() || comms_.tp != nullptr) {
    ASSIGN_OR_RETURN(Tensor logits, Forward(step));
    return SampleStep(step, std::move(logits));
  }
  const StepTimer timer(stats_);
  // Sampled on the device; only the token ids come back.
  Tensor logits;
  RETURN_IF_ERROR(ForwardOnDevice(step, logits));
  ASSIGN_OR_RETURN(Tensor ids, sampled_.Rows(0, rows));
  RETURN_IF_ERROR(
      SampleCuda(logits, step.sampling, step.sample_index, ids, exec_));
  StepOutput out;
  out.tokens.resize(rows);
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
      out.tokens.data(), ids.raw(), rows * sizeof(int32_t),
      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(exec_.stream)));
  RETURN_IF_ERROR(FinishStep());
  return out;
}

}  // namespace shardlm
