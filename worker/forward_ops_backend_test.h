// A backend as the ForwardOps conformance suite (forward_ops_test.cc) sees
// it: how to put host tensors on it and read them back, how it holds
// weights and KV caches, and its ops bound to a step. One per backend:
// CpuOpsBackend here, CudaOpsBackend (forward_ops_cuda_backend.cc) in the
// GPU binary.
#ifndef SHARDLM_WORKER_FORWARD_OPS_BACKEND_TEST_H_
#define SHARDLM_WORKER_FORWARD_OPS_BACKEND_TEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "model/rope_scaling.h"
#include "step/step.h"
#include "worker/forward.h"

namespace shardlm {

// One layer's K and V caches on a backend.
struct OpsKvCache {
  Tensor k, v;
};

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  virtual std::string name() const = 0;

  // A copy of host f32 `t` on the backend, as `dtype` (f32, or the GEMM
  // input type where an op writes one).
  virtual absl::StatusOr<Tensor> Put(const Tensor& t,
                                     DType dtype = DType::kF32) = 0;
  // A host weight matrix (f32 or quantized blocks) as the backend's runner
  // holds it after loading: the CPU keeps blocks, a GPU has bf16. (Norm
  // weights and biases stay f32: Put.)
  virtual absl::StatusOr<Tensor> Weight(const Tensor& t) = 0;
  // A zero tensor on the backend.
  virtual absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) = 0;
  // `t` as a host f32 tensor.
  virtual absl::StatusOr<Tensor> Get(const Tensor& t) = 0;
  // A layer's caches of `blocks` blocks in the backend's layout.
  virtual absl::StatusOr<OpsKvCache> NewKvCache(int64_t blocks,
                                                int64_t block_size,
                                                int64_t kv_heads,
                                                int64_t head_dim,
                                                DType dtype) = 0;
  // The ops bound to `step` (kept alive by the caller while they are used)
  // for a model of `hidden` and RoPE table `rope`, over caches of
  // `num_blocks` blocks of `block_size`.
  virtual absl::StatusOr<std::unique_ptr<ForwardOps>> Bind(
      const StepInput& step, const RopeTable& rope, int64_t hidden,
      int64_t block_size, int64_t num_blocks) = 0;

  // What the backend's buffers and weights are: the dtype of GEMM inputs
  // (RmsNorm's and SwiGlu's outputs, Linear's x), the relative rounding of
  // a weight as held (0: exact) and the KV and weight types it takes.
  virtual DType gemm_input() const = 0;
  virtual double weight_rounding() const = 0;
  virtual std::vector<DType> kv_dtypes() const = 0;
  virtual std::vector<DType> embedding_dtypes() const = 0;
  virtual std::vector<DType> linear_dtypes() const = 0;
  // The optional ops it implements (forward.h): fused Q/K/V and gate/up
  // (SplitQkv, SwiGluFused), PadColumns, and context parallel's
  // CompactRows and GatherLogitRows of row -1. The others must answer
  // Unimplemented (CompactRows) or refuse row -1. (Every backend has the
  // experts' GatherRows, ScatterAddRows and Zero.)
  virtual bool fused_ops() const = 0;
  virtual bool pad_columns() const = 0;
  virtual bool sequence_parallel() const = 0;
  // Hybrid models' GatedDeltaNet and SigmoidGate (CPU only so far).
  virtual bool gated_delta_net() const { return false; }
};

std::unique_ptr<OpsBackend> MakeCpuOpsBackend();
// Null when the machine has no GPU (only in the GPU binary).
std::unique_ptr<OpsBackend> MakeCudaOpsBackend();

}  // namespace shardlm

#endif  // SHARDLM_WORKER_FORWARD_OPS_BACKEND_TEST_H_
