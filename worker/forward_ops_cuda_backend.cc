// The CUDA backend of the ForwardOps conformance suite (forward_ops_test.cc,
// built into forward_ops_gpu_test): device tensors, weights as
// CudaModelRunner uploads them (dequantized, bf16), bf16 KV caches in the
// CUDA layout, and CudaForwardOps bound to a step's uploaded metadata.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backend/cuda_backend.h"
#include "backend/cuda_status.h"
#include "core/half.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/cuda_ops.h"
#include "model/dequantize.h"
#include "worker/cuda_forward_ops.h"
#include "worker/forward_ops_backend_test.h"

namespace shardlm {
namespace {

// What the ops point at: the step's device ids and logit rows, its
// attention metadata, the RoPE table and the decode workspace
// (base-from-member: built before the ops that refer to it).
struct CudaStepHolder {
  Tensor ids, rows, workspace;
  CudaAttentionBatch batch;
  CudaRopeTable rope;
};

class BoundCudaOps : private CudaStepHolder, public CudaForwardOps {
 public:
  BoundCudaOps(CudaStepHolder held, const CudaExec& exec)
      : CudaStepHolder(std::move(held)),
        CudaForwardOps(exec, ids, rows, batch, rope, workspace) {}
};

class CudaOpsBackend : public OpsBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaOpsBackend>> Create(int device) {
    auto b = std::unique_ptr<CudaOpsBackend>(new CudaOpsBackend());
    b->device_ = device;
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
    ASSIGN_OR_RETURN(b->backend_, NewCudaBackend(device));
    ASSIGN_OR_RETURN(b->stream_, b->backend_->CreateStream());
    ASSIGN_OR_RETURN(b->cublas_, CublasHandle::Create(b->stream_->native()));
    b->exec_ = {.stream = b->stream_->native(), .cublas = b->cublas_.get()};
    return b;
  }

  std::string name() const override { return "cuda"; }

  absl::StatusOr<Tensor> Put(const Tensor& t, DType dtype) override {
    if (t.dtype() != DType::kF32) {
      return absl::InvalidArgumentError("Put takes host f32 tensors");
    }
    ASSIGN_OR_RETURN(Tensor f32, backend_->Allocate(DType::kF32, t.shape(),
                                                    MemoryType::kDevice));
    RETURN_IF_ERROR(backend_->Copy(t, f32));
    if (dtype == DType::kF32) return f32;
    ASSIGN_OR_RETURN(Tensor out,
                     backend_->Allocate(dtype, t.shape(), MemoryType::kDevice));
    RETURN_IF_ERROR(CastCuda(f32, out, exec_));
    RETURN_IF_ERROR(stream_->Synchronize());
    return out;
  }
  // As CudaModelRunner's upload: blocks dequantized on the host, then bf16.
  absl::StatusOr<Tensor> Weight(const Tensor& t) override {
    if (!IsQuantized(t.dtype())) return Put(t, DType::kBF16);
    ASSIGN_OR_RETURN(Tensor f32,
                     Tensor::HostUninitialized(DType::kF32, t.shape()));
    RETURN_IF_ERROR(DequantizeRow(t.dtype(),
                                  static_cast<const uint8_t*>(t.raw()),
                                  t.numel(), f32.data<float>()));
    return Put(f32, DType::kBF16);
  }
  absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) override {
    ASSIGN_OR_RETURN(Tensor t,
                     backend_->Allocate(dtype, shape, MemoryType::kDevice));
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
        t.raw(), 0, t.bytes(), static_cast<cudaStream_t>(exec_.stream)));
    RETURN_IF_ERROR(stream_->Synchronize());
    return t;
  }
  absl::StatusOr<Tensor> Get(const Tensor& t) override {
    RETURN_IF_ERROR(stream_->Synchronize());
    ASSIGN_OR_RETURN(Tensor raw,
                     Tensor::HostUninitialized(t.dtype(), t.shape()));
    if (t.memory() == MemoryType::kHost) {
      std::memcpy(raw.raw(), t.raw(), t.bytes());
    } else {
      RETURN_IF_CUDA_ERROR(
          cudaMemcpy(raw.raw(), t.raw(), t.bytes(), cudaMemcpyDeviceToHost));
    }
    if (t.dtype() == DType::kF32) return raw;
    if (t.dtype() != DType::kBF16) {
      return absl::InvalidArgumentError("Get reads f32 or bf16 tensors");
    }
    ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, t.shape()));
    const auto* src = raw.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      out.f32()[i] = Bf16ToFloat(src[i]);
    }
    return out;
  }
  absl::StatusOr<OpsKvCache> NewKvCache(int64_t blocks, int64_t block_size,
                                        int64_t kv_heads, int64_t head_dim,
                                        DType dtype) override {
    OpsKvCache c;
    ASSIGN_OR_RETURN(c.k,
                     Zeros(dtype, {blocks, block_size, kv_heads, head_dim}));
    ASSIGN_OR_RETURN(c.v,
                     Zeros(dtype, {blocks, block_size, kv_heads, head_dim}));
    return c;
  }
  absl::StatusOr<std::unique_ptr<ForwardOps>> Bind(
      const StepInput& step, const RopeTable& rope, int64_t hidden,
      int64_t block_size, int64_t num_blocks) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
    CudaStepHolder h;
    const auto i32 = [&](const std::vector<int32_t>& v,
                         Tensor& out) -> absl::Status {
      if (v.empty()) return absl::OkStatus();
      ASSIGN_OR_RETURN(
          out, backend_->Allocate(DType::kI32, {static_cast<int64_t>(v.size())},
                                  MemoryType::kDevice));
      RETURN_IF_CUDA_ERROR(cudaMemcpy(out.raw(), v.data(),
                                      v.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice));
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(i32(step.tokens, h.ids));
    RETURN_IF_ERROR(i32(step.logit_rows, h.rows));
    AttentionBatch attn{.positions = step.positions,
                        .token_seq = step.token_seq};
    for (const auto& table : step.block_tables) {
      attn.block_tables.push_back(table);
    }
    RETURN_IF_ERROR(
        h.batch.Upload(attn, block_size, num_blocks, device_, exec_));
    if (!rope.inv_freq.empty()) {
      ASSIGN_OR_RETURN(h.rope, UploadRopeTable(rope, device_));
    }
    // Enough for the decode kernel at any head count the suite uses.
    const int64_t floats =
        CudaDecodeWorkspaceFloats(static_cast<int64_t>(step.tokens.size()), 64,
                                  256, kMaxCudaDecodeSplits);
    ASSIGN_OR_RETURN(h.workspace,
                     Zeros(DType::kF32, {std::max<int64_t>(floats, 1)}));
    RETURN_IF_ERROR(stream_->Synchronize());
    return std::make_unique<BoundCudaOps>(std::move(h), exec_);
  }

  DType gemm_input() const override { return DType::kBF16; }
  double weight_rounding() const override { return 1.0 / 256; }
  std::vector<DType> kv_dtypes() const override { return {DType::kBF16}; }
  std::vector<DType> embedding_dtypes() const override {
    return {DType::kF32, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};
  }
  std::vector<DType> linear_dtypes() const override {
    return {DType::kF32, DType::kQ8_0, DType::kQ4_1, DType::kQ4_K,
            DType::kQ6_K};
  }
  bool fused_ops() const override { return true; }
  bool pad_columns() const override { return false; }
  bool sequence_parallel() const override { return false; }

 private:
  CudaOpsBackend() = default;

  int device_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
  CublasHandle cublas_;
  CudaExec exec_;
};

}  // namespace

std::unique_ptr<OpsBackend> MakeCudaOpsBackend() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // No device: not an error to keep.
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<CudaOpsBackend>> b = CudaOpsBackend::Create(0);
  if (!b.ok()) {
    std::fprintf(stderr, "CUDA backend: %s\n",
                 std::string(b.status().message()).c_str());
    return nullptr;
  }
  return *std::move(b);
}

}  // namespace shardlm
