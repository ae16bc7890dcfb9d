// The CUDA ops on packed Q8_0 / Q4_0 weights (kernels/cuda_ops.h):
// validation (quant_device_pack.h), the GEMV launcher, and the prefill path
// that dequantizes chunks of rows into the rank's scratch for cuBLAS.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backend/cuda_status.h"
#include "core/status.h"
#include "kernels/cuda_ops.h"
#include "kernels/linear/linear_quant_cuda.h"
#include "kernels/linear/quant_device_pack.h"

namespace shardlm {

namespace {

cudaStream_t S(const CudaExec& exec) {
  return static_cast<cudaStream_t>(exec.stream);
}

cuda::Dt ToDt(DType d) {
  return d == DType::kBF16 ? cuda::Dt::kBF16 : cuda::Dt::kF32;
}

// The dequantization scratch of each cuBLAS handle (one per runner and
// stream), freed with the handle (CublasHandle calls
// ReleaseDequantScratchCuda).
struct Scratches {
  std::mutex mu;
  std::map<void*, std::shared_ptr<DeviceBuffer>> by_handle;
};
Scratches& AllScratches() {
  static auto* s = new Scratches;
  return *s;
}

constexpr int64_t kMaxInt = 0x7fffffff;

}  // namespace

absl::Status LinearQuantizedCuda(const Tensor& x, const Tensor& w, Tensor& y,
                                 bool accumulate, const CudaExec& exec) {
  RETURN_IF_ERROR(CheckQuantGemvArgs(x, w, y));
  const int64_t n = x.dim(0), in = w.dim(1), out = w.dim(0);
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const quant_layout::QuantFormat f,
                   DeviceQuantFormat(w.dtype()));
  return CudaStatus(
      cuda::GemvQuant(x.raw(), w.raw(), f, y.raw(), ToDt(y.dtype()),
                      static_cast<int>(n), in, out, accumulate, S(exec)),
      "LinearQuantizedCuda");
}

absl::Status DequantizePackedCuda(const Tensor& w, int64_t row_begin,
                                  int64_t row_end, Tensor& dst,
                                  const CudaExec& exec) {
  RETURN_IF_ERROR(CheckDequantizePackedArgs(w, row_begin, row_end, dst));
  ASSIGN_OR_RETURN(const quant_layout::QuantFormat f,
                   DeviceQuantFormat(w.dtype()));
  return CudaStatus(
      cuda::DequantizePacked(w.raw(), f, w.dim(0), w.dim(1), row_begin,
                             row_end - row_begin, dst.raw(), S(exec)),
      "DequantizePackedCuda");
}

absl::Status LinearPackedCuda(const Tensor& x, const Tensor& w, Tensor& y,
                              bool accumulate, const Tensor& scratch,
                              const CudaExec& exec) {
  if (x.rank() == 2 && x.dim(0) <= kQuantGemvMaxRows) {
    return LinearQuantizedCuda(x, w, y, accumulate, exec);
  }
  // The GEMV's checks on w, and the shapes of x and y, for any n.
  if (x.rank() != 2 || w.rank() != 2 || y.rank() != 2) {
    return absl::InvalidArgumentError("LinearPackedCuda: x, w, y must be 2-D");
  }
  const int64_t n = x.dim(0), in = w.dim(1), out = w.dim(0);
  {
    ASSIGN_OR_RETURN(Tensor x1, x.Rows(0, 1));
    ASSIGN_OR_RETURN(Tensor y1, y.Rows(0, 1));
    RETURN_IF_ERROR(CheckQuantGemvArgs(x1, w, y1));
  }
  if (y.dim(0) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearPackedCuda: y has ", y.dim(0), " rows, x ", n));
  }
  if (n > kMaxInt || in > kMaxInt || out > kMaxInt) {
    return absl::InvalidArgumentError(
        "LinearPackedCuda: dimension beyond int32");
  }
  if (scratch.empty() || scratch.dtype() != DType::kBF16 ||
      scratch.memory() != MemoryType::kDevice || scratch.numel() < in) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LinearPackedCuda: a step of ", n, " rows on ", DTypeName(w.dtype()),
        " weights needs a device bf16 dequantization scratch of at least ", in,
        " values (ReserveDequantScratchCuda), not ",
        scratch.empty() ? std::string("none") : scratch.DebugString()));
  }
  if (exec.cublas == nullptr) {
    return absl::InvalidArgumentError("LinearPackedCuda: no cuBLAS handle");
  }
  auto h = static_cast<cublasHandle_t>(exec.cublas);
  cudaStream_t bound = nullptr;
  if (cublasGetStream(h, &bound) != CUBLAS_STATUS_SUCCESS || bound != S(exec)) {
    return absl::InvalidArgumentError(
        "LinearPackedCuda: the cuBLAS handle is bound to another stream");
  }
  // Chunks of output rows: dequantized, then y[:, r0:r1] (column-major
  // y^T rows r0..r1, leading dimension out) = w[r0:r1] x^T.
  const int64_t chunk = DequantChunkRows(out, in, scratch.numel());
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const size_t y_elem = y.dtype() == DType::kBF16 ? 2 : 4;
  for (int64_t r0 = 0; r0 < out; r0 += chunk) {
    const int64_t rows = std::min(chunk, out - r0);
    ASSIGN_OR_RETURN(Tensor tile,
                     Tensor::View(DType::kBF16, {rows, in}, scratch.raw(),
                                  MemoryType::kDevice));
    RETURN_IF_ERROR(DequantizePackedCuda(w, r0, r0 + rows, tile, exec));
    const cublasStatus_t s = cublasGemmEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
        static_cast<int>(n), static_cast<int>(in), &alpha, tile.raw(),
        CUDA_R_16BF, static_cast<int>(in), x.raw(), CUDA_R_16BF,
        static_cast<int>(in), &beta, static_cast<char*>(y.raw()) + r0 * y_elem,
        y.dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F,
        static_cast<int>(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("LinearPackedCuda: cublasGemmEx failed (status ",
                       static_cast<int>(s), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReserveDequantScratchCuda(const CudaExec& exec, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (exec.cublas == nullptr) {
    return absl::InvalidArgumentError(
        "ReserveDequantScratchCuda: no cuBLAS handle to hold the scratch");
  }
  Scratches& all = AllScratches();
  {
    std::lock_guard<std::mutex> lock(all.mu);
    auto it = all.by_handle.find(exec.cublas);
    if (it != all.by_handle.end() &&
        static_cast<int64_t>(it->second->size()) >= bytes) {
      return absl::OkStatus();
    }
  }
  // On the current device, which must be the stream's: UploadLlamaWeights
  // calls this after the runner's backend made its device current (its
  // copies do). cudaStreamGetDevice would say, but needs CUDA 12.8 where
  // the kit runs on the GPU machine's runtime.
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  // The old one (smaller) may still be read by queued work.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(S(exec)));
  ASSIGN_OR_RETURN(DeviceBuffer buffer,
                   DeviceBuffer::Allocate(static_cast<size_t>(bytes), device));
  std::lock_guard<std::mutex> lock(all.mu);
  all.by_handle[exec.cublas] =
      std::make_shared<DeviceBuffer>(std::move(buffer));
  return absl::OkStatus();
}

Tensor DequantScratchCuda(const CudaExec& exec) {
  Scratches& all = AllScratches();
  std::lock_guard<std::mutex> lock(all.mu);
  auto it = all.by_handle.find(exec.cublas);
  if (exec.cublas == nullptr || it == all.by_handle.end()) return Tensor();
  const std::shared_ptr<DeviceBuffer>& b = it->second;
  absl::StatusOr<Tensor> t =
      Tensor::Owning(DType::kBF16, {static_cast<int64_t>(b->size() / 2)},
                     b->data(), MemoryType::kDevice, b);
  return t.ok() ? *std::move(t) : Tensor();
}

int64_t DequantScratchBytesCuda(const CudaExec& exec) {
  const Tensor t = DequantScratchCuda(exec);
  return static_cast<int64_t>(t.bytes());
}

void ReleaseDequantScratchCuda(void* cublas) {
  if (cublas == nullptr) return;
  Scratches& all = AllScratches();
  std::shared_ptr<DeviceBuffer> gone;  // Freed outside the lock.
  std::lock_guard<std::mutex> lock(all.mu);
  auto it = all.by_handle.find(cublas);
  if (it == all.by_handle.end()) return;
  gone = std::move(it->second);
  all.by_handle.erase(it);
}

}  // namespace shardlm
