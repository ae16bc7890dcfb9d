#include "worker/cuda_weights.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "backend/cuda_status.h"
#include "core/status.h"
#include "kernels/linear/quant_device_pack.h"
#include "model/dequantize.h"
#include "worker/activation_memory.h"

namespace shardlm {

namespace {

// A device bf16 (matrices) or f32 (norms) copy of a host f32 tensor.
absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype, Backend& backend,
                              const CudaExec& exec) {
  if (host.empty()) return Tensor();  // Not held by this shard.
  if (IsQuantized(host.dtype())) {
    // GGUF blocks as loaded for the CPU: dequantized here, then uploaded.
    ASSIGN_OR_RETURN(Tensor f32,
                     Tensor::HostUninitialized(DType::kF32, host.shape()));
    RETURN_IF_ERROR(DequantizeRow(host.dtype(),
                                  static_cast<const uint8_t*>(host.raw()),
                                  host.numel(), f32.data<float>()));
    return Upload(f32, dtype, backend, exec);
  }
  ASSIGN_OR_RETURN(Tensor f32, backend.Allocate(DType::kF32, host.shape(),
                                                MemoryType::kDevice));
  RETURN_IF_ERROR(backend.Copy(host, f32));
  if (dtype == DType::kF32) return f32;
  ASSIGN_OR_RETURN(Tensor out,
                   backend.Allocate(dtype, host.shape(), MemoryType::kDevice));
  RETURN_IF_ERROR(CastCuda(f32, out, exec));
  // f32 is freed when this returns: finish the cast first.
  RETURN_IF_CUDA_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(exec.stream)));
  return out;
}

// The rows of `parts` (host tensors of one width, or 1-D), one after the
// other, as an f32 host tensor: the fused QKV and gate/up weights.
absl::StatusOr<Tensor> ConcatRows(std::initializer_list<const Tensor*> parts) {
  int64_t rows = 0;
  const int64_t width =
      (*parts.begin())->rank() == 2 ? (*parts.begin())->dim(1) : 1;
  for (const Tensor* p : parts) {
    if (p->empty() || (p->rank() == 2 ? p->dim(1) : 1) != width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot fuse ", p->DebugString(), " with rows of ", width));
    }
    rows += p->rank() == 2 ? p->dim(0) : p->numel();
  }
  const Shape shape =
      (*parts.begin())->rank() == 2 ? Shape{rows, width} : Shape{rows};
  ASSIGN_OR_RETURN(Tensor out, Tensor::HostUninitialized(DType::kF32, shape));
  float* dst = out.data<float>();
  for (const Tensor* p : parts) {
    if (IsQuantized(p->dtype())) {
      RETURN_IF_ERROR(DequantizeRow(
          p->dtype(), static_cast<const uint8_t*>(p->raw()), p->numel(), dst));
    } else if (p->dtype() == DType::kF32) {
      std::memcpy(dst, p->raw(), p->bytes());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot fuse a ", DTypeName(p->dtype()), " tensor"));
    }
    dst += p->numel();
  }
  return out;
}

// Whether `t` goes up packed under `options` (a 2-D Q8_0 / Q4_0 host
// matrix of whole blocks per row).
bool Packable(const Tensor& t, const CudaUploadOptions& options) {
  return options.weights == CudaWeights::kQuantized && !t.empty() &&
         t.rank() == 2 && HasDeviceQuantLayout(t.dtype()) &&
         PackedQuantBytes(t.dtype(), t.dim(0), t.dim(1)).ok();
}

// The rows of `parts` (host matrices of one packable dtype and width) as
// one GGUF matrix of that dtype, block bytes back to back; an empty tensor
// when they differ in dtype or width or one is not packable.
absl::StatusOr<Tensor> ConcatQuantizedRows(
    std::initializer_list<const Tensor*> parts,
    const CudaUploadOptions& options) {
  const Tensor& first = **parts.begin();
  int64_t rows = 0;
  for (const Tensor* p : parts) {
    if (!Packable(*p, options) || p->dtype() != first.dtype() ||
        p->dim(1) != first.dim(1)) {
      return Tensor();
    }
    rows += p->dim(0);
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::HostUninitialized(first.dtype(),
                                                         {rows, first.dim(1)}));
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (const Tensor* p : parts) {
    std::memcpy(dst, p->raw(), p->bytes());
    dst += p->bytes();
  }
  return out;
}

// A packable host matrix, repacked (PackQuantized) and copied up as is.
absl::StatusOr<Tensor> UploadPacked(const Tensor& host, Backend& backend) {
  ASSIGN_OR_RETURN(const Tensor packed, PackQuantized(host));
  ASSIGN_OR_RETURN(
      Tensor device,
      backend.Allocate(packed.dtype(), packed.shape(), MemoryType::kDevice));
  RETURN_IF_ERROR(backend.Copy(packed, device));
  return device;
}

// A projection: packed when it can be, else bf16.
absl::StatusOr<Tensor> UploadMatrix(const Tensor& host, Backend& backend,
                                    const CudaExec& exec,
                                    const CudaUploadOptions& options) {
  if (Packable(host, options)) return UploadPacked(host, backend);
  return Upload(host, DType::kBF16, backend, exec);
}

// A fused projection (QKV, gate/up): one packed matrix when every part is
// of one packable format, else the bf16 concatenation.
absl::StatusOr<Tensor> UploadFused(std::initializer_list<const Tensor*> parts,
                                   Backend& backend, const CudaExec& exec,
                                   const CudaUploadOptions& options) {
  ASSIGN_OR_RETURN(const Tensor quantized, ConcatQuantizedRows(parts, options));
  if (!quantized.empty()) return UploadPacked(quantized, backend);
  ASSIGN_OR_RETURN(const Tensor f32, ConcatRows(parts));
  return Upload(f32, DType::kBF16, backend, exec);
}

absl::StatusOr<Tensor> Random(DType dtype, const Shape& shape, uint64_t seed,
                              float scale, Backend& backend,
                              const CudaExec& exec) {
  ASSIGN_OR_RETURN(Tensor t,
                   backend.Allocate(dtype, shape, MemoryType::kDevice));
  RETURN_IF_ERROR(FillRandomCuda(t, seed, scale, exec));
  return t;
}

// A packed Q8_0 / Q4_0 matrix of random codes (FillRandomCuda's bf16 bits
// over the codes), every scale 0x1c1c (f16 2^-8 * 1.027): for timing.
absl::StatusOr<Tensor> RandomPacked(DType dtype, const Shape& shape,
                                    uint64_t seed, Backend& backend,
                                    const CudaExec& exec) {
  ASSIGN_OR_RETURN(const quant_layout::QuantFormat f, DeviceQuantFormat(dtype));
  ASSIGN_OR_RETURN(const int64_t bytes,
                   PackedQuantBytes(dtype, shape[0], shape[1]));
  ASSIGN_OR_RETURN(Tensor t,
                   backend.Allocate(dtype, shape, MemoryType::kDevice));
  const int64_t codes = quant_layout::ScalesOffset(f, shape[0], shape[1]);
  ASSIGN_OR_RETURN(Tensor as_bf16, Tensor::View(DType::kBF16, {codes / 2},
                                                t.raw(), MemoryType::kDevice));
  RETURN_IF_ERROR(FillRandomCuda(as_bf16, seed, 1.0f, exec));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(static_cast<uint8_t*>(t.raw()) + codes,
                                       0x1c, bytes - codes,
                                       static_cast<cudaStream_t>(exec.stream)));
  return t;
}

absl::StatusOr<Tensor> Ones(const Shape& shape, Backend& backend) {
  ASSIGN_OR_RETURN(Tensor host, Tensor::Host(DType::kF32, shape));
  for (float& v : host.f32()) v = 1.0f;
  ASSIGN_OR_RETURN(Tensor t,
                   backend.Allocate(DType::kF32, shape, MemoryType::kDevice));
  RETURN_IF_ERROR(backend.Copy(host, t));
  return t;
}

}  // namespace

absl::StatusOr<LlamaWeights> UploadLlamaWeights(
    const LlamaWeights& host, Backend& backend, const CudaExec& exec,
    const CudaUploadOptions& options) {
  LlamaWeights w;
  w.config = host.config;
  w.spec = host.spec;
  const DType bf = DType::kBF16;
  ASSIGN_OR_RETURN(w.token_embd, Upload(host.token_embd, bf, backend, exec));
  for (const LlamaLayerWeights& l : host.layers) {
    LlamaLayerWeights d;
    ASSIGN_OR_RETURN(d.attn_norm,
                     Upload(l.attn_norm, DType::kF32, backend, exec));
    // Q, K and V as one matrix (one GEMM), and Qwen2's biases with them
    // (added to the f32 output); gate and up as another.
    ASSIGN_OR_RETURN(
        d.wqkv, UploadFused({&l.wq, &l.wk, &l.wv}, backend, exec, options));
    if (!l.bq.empty()) {
      ASSIGN_OR_RETURN(Tensor bqkv, ConcatRows({&l.bq, &l.bk, &l.bv}));
      ASSIGN_OR_RETURN(d.bqkv, Upload(bqkv, DType::kF32, backend, exec));
    }
    // Exact columns: a CPU slice of whole blocks is cut to this rank's.
    const int64_t q_cols = host.spec.n_heads() * host.config.head_dim;
    const int64_t f_cols = host.spec.ffn_end - host.spec.ffn_begin;
    if (l.wo_offset == 0 && l.wo.rank() == 2 && l.wo.dim(1) == q_cols &&
        Packable(l.wo, options)) {
      ASSIGN_OR_RETURN(d.wo, UploadPacked(l.wo, backend));
    } else {
      ASSIGN_OR_RETURN(const Tensor wo,
                       ExactColumns(l.wo, l.wo_offset, q_cols));
      ASSIGN_OR_RETURN(d.wo, Upload(wo, bf, backend, exec));
    }
    ASSIGN_OR_RETURN(d.ffn_norm,
                     Upload(l.ffn_norm, DType::kF32, backend, exec));
    ASSIGN_OR_RETURN(d.q_norm, Upload(l.q_norm, DType::kF32, backend, exec));
    ASSIGN_OR_RETURN(d.k_norm, Upload(l.k_norm, DType::kF32, backend, exec));
    if (host.config.is_moe()) {
      // The router (replicated) and the held experts, each expert's gate
      // and up rows and its down rows as stored (ForwardBuffers' one
      // expert at a time), down cut to this rank's columns.
      ASSIGN_OR_RETURN(d.router, Upload(l.router, bf, backend, exec));
      ASSIGN_OR_RETURN(d.exp_gate, Upload(l.exp_gate, bf, backend, exec));
      ASSIGN_OR_RETURN(d.exp_up, Upload(l.exp_up, bf, backend, exec));
      ASSIGN_OR_RETURN(const Tensor exp_down,
                       ExactColumns(l.exp_down, l.exp_down_offset, f_cols));
      ASSIGN_OR_RETURN(d.exp_down, Upload(exp_down, bf, backend, exec));
      w.layers.push_back(std::move(d));
      continue;
    }
    ASSIGN_OR_RETURN(d.w_gate_up,
                     UploadFused({&l.w_gate, &l.w_up}, backend, exec, options));
    if (l.w_down_offset == 0 && l.w_down.rank() == 2 &&
        l.w_down.dim(1) == f_cols && Packable(l.w_down, options)) {
      ASSIGN_OR_RETURN(d.w_down, UploadPacked(l.w_down, backend));
    } else {
      ASSIGN_OR_RETURN(const Tensor w_down,
                       ExactColumns(l.w_down, l.w_down_offset, f_cols));
      ASSIGN_OR_RETURN(d.w_down, Upload(w_down, bf, backend, exec));
    }
    w.layers.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(w.output_norm,
                   Upload(host.output_norm, DType::kF32, backend, exec));
  if (!host.lm_head.empty() && host.lm_head.raw() == host.token_embd.raw()) {
    w.lm_head = w.token_embd;  // Tied: one device copy.
  } else {
    ASSIGN_OR_RETURN(w.lm_head,
                     UploadMatrix(host.lm_head, backend, exec, options));
  }
  // Steps of more than 8 rows dequantize packed matrices chunk by chunk.
  RETURN_IF_ERROR(ReserveDequantScratchCuda(
      exec, DequantScratchBytes(LargestPackedMatrix(w))));
  return w;
}

absl::StatusOr<LlamaWeights> RandomLlamaWeights(const ModelConfig& c,
                                                uint64_t seed, Backend& backend,
                                                const CudaExec& exec,
                                                DType matrices) {
  RETURN_IF_ERROR(c.Validate());
  if (matrices != DType::kBF16 && !HasDeviceQuantLayout(matrices)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RandomLlamaWeights: matrices in ", DTypeName(matrices),
                     "; bf16, Q8_0 or Q4_0"));
  }
  // A projection [out, in]: bf16 in [-1, 1) * scale, or packed blocks.
  const auto matrix = [&](const Shape& shape, uint64_t id,
                          float scale) -> absl::StatusOr<Tensor> {
    if (matrices == DType::kBF16) {
      return Random(DType::kBF16, shape, id, scale, backend, exec);
    }
    return RandomPacked(matrices, shape, id, backend, exec);
  };
  LlamaWeights w;
  w.config = c;
  w.spec = WholeModelSpec(c);
  const DType bf = DType::kBF16;
  const int64_t q_dim = c.n_heads * c.head_dim,
                kv_dim = c.n_kv_heads * c.head_dim;
  const auto scale = [](int64_t in) {
    return 1.0f / std::sqrt(static_cast<float>(in));
  };
  uint64_t next = seed * 1000;
  ASSIGN_OR_RETURN(w.token_embd, Random(bf, {c.vocab_size, c.hidden}, ++next,
                                        1.0f, backend, exec));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LlamaLayerWeights d;
    ASSIGN_OR_RETURN(d.attn_norm, Ones({c.hidden}, backend));
    ASSIGN_OR_RETURN(d.ffn_norm, Ones({c.hidden}, backend));
    // Fused as UploadLlamaWeights fuses them (the same scale in each).
    ASSIGN_OR_RETURN(d.wqkv, matrix({q_dim + 2 * kv_dim, c.hidden}, ++next,
                                    scale(c.hidden)));
    ASSIGN_OR_RETURN(d.wo, matrix({c.hidden, q_dim}, ++next, scale(q_dim)));
    ASSIGN_OR_RETURN(d.w_gate_up, matrix({2 * c.ffn_hidden, c.hidden}, ++next,
                                         scale(c.hidden)));
    ASSIGN_OR_RETURN(d.w_down, matrix({c.hidden, c.ffn_hidden}, ++next,
                                      scale(c.ffn_hidden)));
    w.layers.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(w.output_norm, Ones({c.hidden}, backend));
  if (c.tied_embeddings) {
    w.lm_head = w.token_embd;
  } else {
    ASSIGN_OR_RETURN(w.lm_head,
                     matrix({c.vocab_size, c.hidden}, ++next, scale(c.hidden)));
  }
  RETURN_IF_ERROR(ReserveDequantScratchCuda(
      exec, DequantScratchBytes(LargestPackedMatrix(w))));
  RETURN_IF_CUDA_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(exec.stream)));
  return w;
}

}  // namespace shardlm
