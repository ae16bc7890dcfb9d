// Validation and dispatch of the CUDA ops (kernels/cuda_ops.h): checks
// tensors, then calls the raw launchers of kernels/cuda_launch.h, or
// cuBLAS for LinearCuda.
#include "kernels/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cuda_status.h"
#include "core/status.h"
#include "kernels/attention/cuda_attention_layout.h"
#include "kernels/attention/cuda_decode_plan.h"
#include "kernels/check_args.h"
#include "kernels/cuda_launch.h"

namespace shardlm {

using cuda::Dt;

namespace {

cudaStream_t S(const CudaExec& exec) {
  return static_cast<cudaStream_t>(exec.stream);
}

absl::Status Launched(cudaError_t e, const char* op) {
  return CudaStatus(e, op);
}

Dt ToDt(DType d) { return d == DType::kBF16 ? Dt::kBF16 : Dt::kF32; }

const char* CublasName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", CublasName(s));
  return s == CUBLAS_STATUS_ALLOC_FAILED ? absl::ResourceExhaustedError(msg)
                                         : absl::InternalError(msg);
}

}  // namespace

// CublasHandle

absl::StatusOr<CublasHandle> CublasHandle::Create(void* stream) {
  cublasHandle_t h = nullptr;
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&h), "cublasCreate"));
  CublasHandle out;
  out.handle_ = h;
  RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(h, static_cast<cudaStream_t>(stream)),
                   "cublasSetStream"));
  // A workspace of its own (set after the stream: cublasSetStream resets
  // it), so that GEMMs captured into a CUDA graph never allocate.
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  ASSIGN_OR_RETURN(DeviceBuffer ws,
                   DeviceBuffer::Allocate(kCublasWorkspaceBytes, device));
  out.workspace_ = std::make_shared<DeviceBuffer>(std::move(ws));
  RETURN_IF_ERROR(CublasStatus(
      cublasSetWorkspace(h, out.workspace_->data(), kCublasWorkspaceBytes),
      "cublasSetWorkspace"));
  return out;
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::move(other.workspace_)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      cublasDestroy(static_cast<cublasHandle_t>(handle_));
      ReleaseDequantScratchCuda(handle_);
    }
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::move(other.workspace_);
  }
  return *this;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) {
    cublasDestroy(static_cast<cublasHandle_t>(handle_));
    ReleaseDequantScratchCuda(handle_);  // linear_quant_cuda_ops.cc
  }
}

// Elementwise and row ops

absl::Status EmbeddingCuda(const Tensor& table, const Tensor& ids,
                           int64_t vocab_begin, Tensor& out,
                           const CudaExec& exec) {
  if (table.rank() != 2 || ids.rank() != 1) {
    return absl::InvalidArgumentError(
        "EmbeddingCuda: table must be 2-D and ids 1-D");
  }
  const int64_t rows = table.dim(0), hidden = table.dim(1), n = ids.dim(0);
  RETURN_IF_ERROR(CheckDevice("EmbeddingCuda", "table", table, {rows, hidden},
                              {DType::kF32, DType::kBF16}));
  RETURN_IF_ERROR(CheckDevice("EmbeddingCuda", "ids", ids, {n}, {DType::kI32}));
  RETURN_IF_ERROR(
      CheckDevice("EmbeddingCuda", "out", out, {n, hidden}, {DType::kF32}));
  return Launched(
      cuda::Embedding(table.raw(), ToDt(table.dtype()), ids.data<int32_t>(), n,
                      rows, hidden, vocab_begin, out.data<float>(), S(exec)),
      "EmbeddingCuda");
}

absl::Status RmsNormCuda(const Tensor& x, const Tensor& weight, float eps,
                         Tensor& out, const CudaExec& exec) {
  if (x.rank() != 2)
    return absl::InvalidArgumentError("RmsNormCuda: x not 2-D");
  const int64_t n = x.dim(0), d = x.dim(1);
  RETURN_IF_ERROR(CheckDevice("RmsNormCuda", "x", x, {n, d}, {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice("RmsNormCuda", "weight", weight, {d}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("RmsNormCuda", "out", out, {n, d},
                              {DType::kF32, DType::kBF16}));
  return Launched(cuda::RmsNorm(x.data<float>(), weight.data<float>(), eps, n,
                                d, out.raw(), ToDt(out.dtype()), S(exec)),
                  "RmsNormCuda");
}

namespace {

// The checks both RopeCuda forms share: x [n, heads, even head_dim] f32 and
// one i32 position per token, on the device.
absl::Status CheckRopeArgs(const Tensor& x, const Tensor& positions) {
  if (x.rank() != 3) {
    return absl::InvalidArgumentError(
        "RopeCuda: x must be [n, heads, head_dim]");
  }
  const int64_t n = x.dim(0), heads = x.dim(1), d = x.dim(2);
  RETURN_IF_ERROR(
      CheckDevice("RopeCuda", "x", x, {n, heads, d}, {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice("RopeCuda", "positions", positions, {n}, {DType::kI32}));
  if (d % 2 != 0) {
    return absl::InvalidArgumentError("RopeCuda: head_dim must be even");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RopeCuda(Tensor& x, const Tensor& positions, float theta,
                      RopeStyle style, const CudaExec& exec) {
  RETURN_IF_ERROR(CheckRopeArgs(x, positions));
  return Launched(
      cuda::Rope(x.data<float>(), positions.data<int32_t>(), x.dim(0), x.dim(1),
                 x.dim(2), theta, /*inv_freq=*/nullptr,
                 /*mscale=*/1.0, style == RopeStyle::kAdjacentPairs, S(exec)),
      "RopeCuda");
}

absl::StatusOr<CudaRopeTable> UploadRopeTable(const RopeTable& table,
                                              int device) {
  const size_t pairs = table.inv_freq.size();
  if (pairs == 0) return absl::InvalidArgumentError("RoPE table is empty");
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  ASSIGN_OR_RETURN(DeviceBuffer buffer,
                   DeviceBuffer::Allocate(pairs * sizeof(double), device));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(buffer.data(), table.inv_freq.data(),
                                  pairs * sizeof(double),
                                  cudaMemcpyHostToDevice));
  return CudaRopeTable{
      .style = table.style,
      .inv_freq = std::make_shared<DeviceBuffer>(std::move(buffer)),
      .pairs = static_cast<int64_t>(pairs),
      .mscale = table.mscale};
}

absl::Status RopeCuda(Tensor& x, const Tensor& positions,
                      const CudaRopeTable& table, const CudaExec& exec) {
  RETURN_IF_ERROR(CheckRopeArgs(x, positions));
  const int64_t n = x.dim(0), heads = x.dim(1), d = x.dim(2);
  if (table.inv_freq == nullptr || table.pairs != d / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeCuda: the table has ", table.pairs,
                     " frequencies; head_dim ", d, " needs ", d / 2));
  }
  return Launched(
      cuda::Rope(
          x.data<float>(), positions.data<int32_t>(), n, heads, d,
          /*theta=*/1.0f, static_cast<const double*>(table.inv_freq->data()),
          table.mscale, table.style == RopeStyle::kAdjacentPairs, S(exec)),
      "RopeCuda");
}

absl::Status SwiGluCuda(const Tensor& gate, const Tensor& up, Tensor& out,
                        const CudaExec& exec) {
  if (gate.rank() != 2)
    return absl::InvalidArgumentError("SwiGluCuda: not 2-D");
  const Shape shape = gate.shape();
  RETURN_IF_ERROR(
      CheckDevice("SwiGluCuda", "gate", gate, shape, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SwiGluCuda", "up", up, shape, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SwiGluCuda", "out", out, shape,
                              {DType::kF32, DType::kBF16}));
  return Launched(
      cuda::SwiGlu(gate.data<float>(), up.data<float>(), gate.numel(),
                   out.raw(), ToDt(out.dtype()), S(exec)),
      "SwiGluCuda");
}

absl::Status SwiGluFusedCuda(const Tensor& gate_up, Tensor& out,
                             const CudaExec& exec) {
  if (gate_up.rank() != 2 || gate_up.dim(1) % 2 != 0) {
    return absl::InvalidArgumentError(
        "SwiGluFusedCuda: gate_up must be [n, 2 f]");
  }
  const int64_t n = gate_up.dim(0), f = gate_up.dim(1) / 2;
  RETURN_IF_ERROR(CheckDevice("SwiGluFusedCuda", "gate_up", gate_up, {n, 2 * f},
                              {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SwiGluFusedCuda", "out", out, {n, f},
                              {DType::kF32, DType::kBF16}));
  return Launched(cuda::SwiGluFused(gate_up.data<float>(), n, f, out.raw(),
                                    ToDt(out.dtype()), S(exec)),
                  "SwiGluFusedCuda");
}

absl::Status SplitQkvCuda(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v,
                          const CudaExec& exec) {
  if (qkv.rank() != 2 || q.rank() != 2 || k.rank() != 2) {
    return absl::InvalidArgumentError("SplitQkvCuda: tensors must be 2-D");
  }
  const int64_t n = qkv.dim(0), qd = q.dim(1), kd = k.dim(1);
  RETURN_IF_ERROR(
      CheckDevice("SplitQkvCuda", "qkv", qkv, {n, qd + 2 * kd}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SplitQkvCuda", "q", q, {n, qd}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SplitQkvCuda", "k", k, {n, kd}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SplitQkvCuda", "v", v, {n, kd}, {DType::kF32}));
  return Launched(cuda::SplitQkv(qkv.data<float>(), n, qd, kd, q.data<float>(),
                                 k.data<float>(), v.data<float>(), S(exec)),
                  "SplitQkvCuda");
}

absl::Status AddInPlaceCuda(Tensor& x, const Tensor& y, const CudaExec& exec) {
  RETURN_IF_ERROR(
      CheckDevice("AddInPlaceCuda", "x", x, x.shape(), {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice("AddInPlaceCuda", "y", y, x.shape(), {DType::kF32}));
  return Launched(
      cuda::Add(x.data<float>(), y.data<float>(), x.numel(), S(exec)),
      "AddInPlaceCuda");
}

absl::Status AddBiasCuda(Tensor& x, const Tensor& bias, const CudaExec& exec) {
  if (x.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AddBiasCuda: x is ", x.DebugString(), "; expected [n, c]"));
  }
  const int64_t n = x.dim(0), c = x.dim(1);
  RETURN_IF_ERROR(CheckDevice("AddBiasCuda", "x", x, {n, c}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("AddBiasCuda", "bias", bias, {c}, {DType::kF32}));
  return Launched(
      cuda::AddBias(x.data<float>(), bias.data<float>(), n, c, S(exec)),
      "AddBiasCuda");
}

namespace {

// Every row in [0, n) and, when `distinct`, none twice.
absl::Status CheckRows(std::string_view op, absl::Span<const int32_t> rows,
                       int64_t n, bool distinct) {
  std::vector<bool> seen(distinct ? n : 0, false);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t r = rows[i];
    if (r < 0 || r >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          Sv(op), ": row ", r, " (entry ", i, ") of a tensor of ", n, " rows"));
    }
    if (distinct && seen[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(op), ": row ", r, " is listed twice"));
    }
    if (distinct) seen[r] = true;
  }
  return absl::OkStatus();
}

// Launches `launch` for each run of at most kExpertRowsPerLaunch of `rows`
// (and `weights`, if any), with the run's first index.
template <typename Launch>
absl::Status ForEachRowRun(absl::Span<const int32_t> rows,
                           absl::Span<const float> weights, const char* op,
                           Launch launch) {
  for (size_t begin = 0; begin < rows.size();
       begin += cuda::kExpertRowsPerLaunch) {
    cuda::ExpertRows run;
    run.count = static_cast<int32_t>(
        std::min<size_t>(cuda::kExpertRowsPerLaunch, rows.size() - begin));
    for (int32_t i = 0; i < run.count; ++i) {
      run.row[i] = rows[begin + i];
      run.weight[i] = weights.empty() ? 0.0f : weights[begin + i];
    }
    RETURN_IF_ERROR(Launched(launch(static_cast<int64_t>(begin), run), op));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GatherRowsCuda(const Tensor& x, absl::Span<const int32_t> rows,
                            Tensor& out, const CudaExec& exec) {
  if (x.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatherRowsCuda: x is ", x.DebugString(), "; expected [n, c]"));
  }
  const int64_t n = x.dim(0), c = x.dim(1),
                m = static_cast<int64_t>(rows.size());
  RETURN_IF_ERROR(CheckDevice("GatherRowsCuda", "x", x, {n, c},
                              {DType::kF32, DType::kBF16}));
  RETURN_IF_ERROR(
      CheckDevice("GatherRowsCuda", "out", out, {m, c}, {x.dtype()}));
  RETURN_IF_ERROR(CheckRows("GatherRowsCuda", rows, n, /*distinct=*/false));
  const int64_t row_bytes = c * BlockBytes(x.dtype());
  return ForEachRowRun(rows, {}, "GatherRowsCuda",
                       [&](int64_t begin, const cuda::ExpertRows& r) {
                         return cuda::GatherRows(
                             x.raw(), ToDt(x.dtype()), c, r,
                             static_cast<char*>(out.raw()) + begin * row_bytes,
                             S(exec));
                       });
}

absl::Status ScatterAddRowsCuda(const Tensor& y, absl::Span<const int32_t> rows,
                                absl::Span<const float> weights, Tensor& out,
                                const CudaExec& exec) {
  if (out.rank() != 2 || weights.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ScatterAddRowsCuda: out is ", out.DebugString(),
                     " (expected [n, c]), ", rows.size(), " rows and ",
                     weights.size(), " weights"));
  }
  const int64_t n = out.dim(0), c = out.dim(1),
                m = static_cast<int64_t>(rows.size());
  RETURN_IF_ERROR(
      CheckDevice("ScatterAddRowsCuda", "y", y, {m, c}, {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice("ScatterAddRowsCuda", "out", out, {n, c}, {DType::kF32}));
  RETURN_IF_ERROR(CheckRows("ScatterAddRowsCuda", rows, n, /*distinct=*/true));
  return ForEachRowRun(rows, weights, "ScatterAddRowsCuda",
                       [&](int64_t begin, const cuda::ExpertRows& r) {
                         return cuda::ScatterAddRows(
                             y.data<float>() + begin * c, c, r,
                             out.data<float>(), S(exec));
                       });
}

absl::Status CastCuda(const Tensor& src, Tensor& dst, const CudaExec& exec) {
  RETURN_IF_ERROR(CheckDevice("CastCuda", "src", src, src.shape(),
                              {DType::kF32, DType::kBF16}));
  RETURN_IF_ERROR(CheckDevice("CastCuda", "dst", dst, src.shape(),
                              {DType::kF32, DType::kBF16}));
  return Launched(cuda::Cast(src.raw(), ToDt(src.dtype()), dst.raw(),
                             ToDt(dst.dtype()), src.numel(), S(exec)),
                  "CastCuda");
}

absl::Status FillRandomCuda(Tensor& t, uint64_t seed, float scale,
                            const CudaExec& exec) {
  RETURN_IF_ERROR(CheckDevice("FillRandomCuda", "t", t, t.shape(),
                              {DType::kF32, DType::kBF16}));
  return Launched(cuda::FillRandom(t.raw(), ToDt(t.dtype()), t.numel(), seed,
                                   scale, S(exec)),
                  "FillRandomCuda");
}

// Linear

namespace {

// Rows of x up to which LinearCuda runs the GEMV kernel: kGemvDefaultRows,
// or SHARDLM_CUDA_GEMV_ROWS (0 to kGemvMaxRows; 0: cuBLAS always), which
// the GPU session sets to measure where the GEMV stops paying.
int64_t GemvMaxRows() {
  static const int64_t rows = [] {
    const char* env = std::getenv("SHARDLM_CUDA_GEMV_ROWS");
    int64_t v = cuda::kGemvDefaultRows;
    if (env != nullptr && *env != '\0') {
      char* end = nullptr;
      const long parsed = std::strtol(env, &end, 10);
      if (*end == '\0' && parsed >= 0 && parsed <= cuda::kGemvMaxRows) {
        v = parsed;
      } else {
        std::fprintf(stderr,
                     "shardlm: ignoring SHARDLM_CUDA_GEMV_ROWS=%s (0 to %d)\n",
                     env, cuda::kGemvMaxRows);
      }
    }
    return v;
  }();
  return rows;
}

}  // namespace

absl::Status LinearCuda(const Tensor& x, const Tensor& w, Tensor& y,
                        bool accumulate, const CudaExec& exec) {
  if (x.rank() != 2 || w.rank() != 2) {
    return absl::InvalidArgumentError("LinearCuda: x and w must be 2-D");
  }
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  RETURN_IF_ERROR(CheckDevice("LinearCuda", "x", x, {n, in}, {DType::kBF16}));
  RETURN_IF_ERROR(CheckDevice("LinearCuda", "w", w, {out, in}, {DType::kBF16}));
  RETURN_IF_ERROR(
      CheckDevice("LinearCuda", "y", y, {n, out}, {DType::kF32, DType::kBF16}));
  if (exec.cublas == nullptr) {
    return absl::InvalidArgumentError("LinearCuda: no cuBLAS handle");
  }
  constexpr int64_t kMax = 0x7fffffff;
  if (n > kMax || in > kMax || out > kMax) {
    return absl::InvalidArgumentError("LinearCuda: dimension beyond int32");
  }
  if (n == 0 || out == 0) return absl::OkStatus();
  // Decode batches: our GEMV streams the weight at nearly full bandwidth
  // where cuBLAS's GEMM kernels do not (kernels/linear/linear_cuda.cu).
  const auto aligned = [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  if (n <= GemvMaxRows() && in % 8 == 0 && aligned(x.raw()) &&
      aligned(w.raw())) {
    return Launched(
        cuda::GemvBf16(x.raw(), w.raw(), y.raw(), ToDt(y.dtype()),
                       static_cast<int>(n), in, out, accumulate, S(exec)),
        "LinearCuda (GEMV)");
  }
  // Column-major view: y^T [out, n] = w [out, in] (stored as w^T [in, out],
  // so op T) * x^T [in, n].
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  auto h = static_cast<cublasHandle_t>(exec.cublas);
  // Rebind only when needed: cublasSetStream also drops the workspace.
  cudaStream_t bound = nullptr;
  RETURN_IF_ERROR(CublasStatus(cublasGetStream(h, &bound), "cublasGetStream"));
  if (bound != S(exec)) {
    return absl::InvalidArgumentError(
        "LinearCuda: the cuBLAS handle is bound to another stream");
  }
  return CublasStatus(
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                   static_cast<int>(n), static_cast<int>(in), &alpha, w.raw(),
                   CUDA_R_16BF, static_cast<int>(in), x.raw(), CUDA_R_16BF,
                   static_cast<int>(in), &beta, y.raw(),
                   y.dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F,
                   static_cast<int>(out), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT),
      "LinearCuda: cublasGemmEx");
}

// Attention

// Turns a CudaAttentionBatch into the launchers' AttnMeta.
class CudaAttentionAccess {
 public:
  static cuda::AttnMeta Meta(const CudaAttentionBatch& b) {
    const int32_t* base = static_cast<const int32_t*>(b.buffer_->data());
    return {.positions = base,
            .token_seq = base + b.off_token_seq_,
            .slots = base + b.off_slots_,
            .block_tables = base + b.off_tables_,
            .tile_begin = base + b.off_tile_begin_,
            .tile_len = base + b.off_tile_len_,
            .n = static_cast<int>(b.n_),
            .n_seqs = static_cast<int>(b.n_seqs_),
            .max_blocks = static_cast<int>(b.max_blocks_),
            .max_ctx = static_cast<int>(b.max_ctx_),
            .n_tiles = static_cast<int>(b.n_tiles_),
            .block_size = static_cast<int>(b.block_size_),
            .window = static_cast<int>(b.window_)};
  }
  static int64_t BlockSize(const CudaAttentionBatch& b) {
    return b.block_size_;
  }
  static int64_t DeviceBlocks(const CudaAttentionBatch& b) {
    return b.device_blocks_;
  }
  static int64_t HostBlocks(const CudaAttentionBatch& b) {
    return b.num_blocks_ - b.device_blocks_;
  }
};

absl::Status CudaAttentionBatch::Upload(const AttentionBatch& batch,
                                        int64_t block_size, int64_t num_blocks,
                                        int device, const CudaExec& exec,
                                        int64_t device_blocks) {
  if (device_blocks < 0) device_blocks = num_blocks;
  ASSIGN_OR_RETURN(const CudaAttentionLayout l,
                   MakeCudaAttentionLayout(batch, block_size, num_blocks,
                                           device_blocks, cuda::kPrefillTile));
  const std::vector<int32_t>& host = l.host;
  const size_t bytes = std::max<size_t>(host.size(), 1) * sizeof(int32_t);
  if (buffer_ == nullptr || buffer_->size() < bytes) {
    ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes * 2, device));
    buffer_ = std::make_shared<DeviceBuffer>(std::move(b));
    ++reallocations_;
  }
  // From pageable memory: returns once `host` has been staged.
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(buffer_->data(), host.data(),
                                       host.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, S(exec)));
  n_ = l.n;
  max_tile_ = l.max_tile;
  n_seqs_ = l.n_seqs;
  max_blocks_ = l.max_blocks;
  max_ctx_ = l.max_ctx;
  n_tiles_ = l.n_tiles;
  block_size_ = block_size;
  window_ = batch.window;
  num_blocks_ = num_blocks;
  device_blocks_ = device_blocks;
  off_token_seq_ = l.off_token_seq;
  off_slots_ = l.off_slots;
  off_tables_ = l.off_tables;
  off_tile_begin_ = l.off_tile_begin;
  off_tile_len_ = l.off_tile_len;
  ASSIGN_OR_RETURN(positions_,
                   Tensor::Owning(DType::kI32, {l.n}, buffer_->data(),
                                  MemoryType::kDevice, buffer_));
  return absl::OkStatus();
}

namespace {

// Checks one layer's caches against the batch and returns the kernels'
// view of them: the device pool [blocks, bs, kv_heads, d] bf16 holding the
// batch's device blocks and, when the batch has host blocks, the host tier
// in pinned memory holding those.
absl::StatusOr<cuda::KvCaches> CheckCache(
    std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
    const CudaAttentionBatch& batch, int64_t kv_heads, int64_t d,
    const Tensor* k_host, const Tensor* v_host) {
  if (k_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(op), ": cache must be [blocks, bs, kv_heads, d]"));
  }
  const Shape shape = {k_cache.dim(0), k_cache.dim(1), kv_heads, d};
  RETURN_IF_ERROR(CheckDevice(op, "k_cache", k_cache, shape, {DType::kBF16}));
  RETURN_IF_ERROR(CheckDevice(op, "v_cache", v_cache, shape, {DType::kBF16}));
  const int64_t bs = CudaAttentionAccess::BlockSize(batch);
  if (k_cache.dim(1) != bs) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(op), ": cache blocks of ", k_cache.dim(1),
                     " tokens, batch uploaded for ", bs));
  }
  const int64_t device_blocks = CudaAttentionAccess::DeviceBlocks(batch);
  const int64_t host_blocks = CudaAttentionAccess::HostBlocks(batch);
  if (k_cache.dim(0) < device_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(op), ": device cache of ", k_cache.dim(0),
                     " blocks, batch uploaded for ", device_blocks));
  }
  cuda::KvCaches c{.k = k_cache.raw(),
                   .v = v_cache.raw(),
                   .k_host = nullptr,
                   .v_host = nullptr,
                   .device_slots = device_blocks * bs};
  if (host_blocks > 0) {
    for (const Tensor* t : {k_host, v_host}) {
      if (t == nullptr || t->memory() != MemoryType::kHostPinned ||
          t->dtype() != DType::kBF16 || t->rank() != 4 ||
          t->dim(0) < host_blocks || t->dim(1) != bs || t->dim(2) != kv_heads ||
          t->dim(3) != d) {
        return absl::InvalidArgumentError(absl::StrCat(
            Sv(op), ": the batch was uploaded for a pool with a host tier of ",
            host_blocks, " blocks; its caches must be pinned bf16 [>= ",
            host_blocks, ", ", bs, ", ", kv_heads, ", ", d, "], not ",
            t == nullptr ? "missing" : t->DebugString()));
      }
    }
    c.k_host = k_host->raw();
    c.v_host = v_host->raw();
  }
  return c;
}

}  // namespace

absl::Status WriteKvCuda(const Tensor& k, const Tensor& v,
                         const CudaAttentionBatch& batch, Tensor& k_cache,
                         Tensor& v_cache, const CudaExec& exec, Tensor* k_host,
                         Tensor* v_host) {
  if (k.rank() != 3) {
    return absl::InvalidArgumentError(
        "WriteKvCuda: k must be [n, kv_heads, d]");
  }
  const int64_t n = k.dim(0), kv_heads = k.dim(1), d = k.dim(2);
  RETURN_IF_ERROR(
      CheckDevice("WriteKvCuda", "k", k, {n, kv_heads, d}, {DType::kF32}));
  RETURN_IF_ERROR(
      CheckDevice("WriteKvCuda", "v", v, {n, kv_heads, d}, {DType::kF32}));
  if (n != batch.tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKvCuda: ", n, " tokens, batch of ", batch.tokens()));
  }
  ASSIGN_OR_RETURN(const cuda::KvCaches caches,
                   CheckCache("WriteKvCuda", k_cache, v_cache, batch, kv_heads,
                              d, k_host, v_host));
  return Launched(cuda::WriteKv(k.data<float>(), v.data<float>(),
                                CudaAttentionAccess::Meta(batch),
                                static_cast<int>(kv_heads), static_cast<int>(d),
                                caches, S(exec)),
                  "WriteKvCuda");
}

absl::Status QkvRopeWriteKvCuda(const Tensor& qkv,
                                const CudaAttentionBatch& batch,
                                const CudaRopeTable& rope, Tensor& q,
                                Tensor& k_cache, Tensor& v_cache,
                                const CudaExec& exec, Tensor* k_host,
                                Tensor* v_host) {
  constexpr std::string_view kOp = "QkvRopeWriteKvCuda";
  if (q.rank() != 3 || qkv.rank() != 2 || k_cache.rank() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(kOp),
        ": q must be [n, heads, d], qkv [n, (heads + 2 kv_heads) d], "
        "the caches 4-D"));
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = k_cache.dim(2);
  RETURN_IF_ERROR(CheckDevice(kOp, "q", q, {n, heads, d}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice(kOp, "qkv", qkv, {n, (heads + 2 * kv_heads) * d},
                              {DType::kF32}));
  if (n != batch.tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(kOp), ": ", n, " tokens, batch of ", batch.tokens()));
  }
  if (d % 2 != 0 || rope.inv_freq == nullptr || rope.pairs != d / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(kOp), ": the RoPE table has ", rope.pairs,
                     " frequencies; head_dim ", d, " needs ", d / 2));
  }
  ASSIGN_OR_RETURN(
      const cuda::KvCaches caches,
      CheckCache(kOp, k_cache, v_cache, batch, kv_heads, d, k_host, v_host));
  return Launched(
      cuda::QkvRopeWriteKv(qkv.data<float>(), CudaAttentionAccess::Meta(batch),
                           static_cast<int>(heads), static_cast<int>(kv_heads),
                           static_cast<int>(d),
                           static_cast<const double*>(rope.inv_freq->data()),
                           rope.mscale, rope.style == RopeStyle::kAdjacentPairs,
                           q.data<float>(), caches, S(exec)),
      "QkvRopeWriteKvCuda");
}

namespace {

// The current device's multiprocessor count, asked once per device.
int Multiprocessors() {
  constexpr int kDevices = 64;
  static std::atomic<int> counts[kDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (device < 0 || device >= kDevices) return 1;
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        n < 1) {
      n = 1;
    }
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

int CudaDecodeSplitsFor(const CudaAttentionBatch& batch, int64_t heads,
                        int64_t kv_heads, int64_t window) {
  const cuda::AttnMeta meta = CudaAttentionAccess::Meta(batch);
  if (window < 0) window = meta.window;
  // A window bounds the keys each token reads.
  // From the padded table width, not the longest context: the split count
  // is then part of the layout (a CUDA graph's key) and changes only every
  // kCudaTableBlocksMultiple blocks; shorter splits stay empty, which the
  // merge skips.
  const int64_t width = batch.padded_blocks() * meta.block_size;
  const int64_t keys = window > 0 ? std::min<int64_t>(width, window) : width;
  return CudaDecodeSplits(keys, batch.tokens(), heads, kv_heads,
                          Multiprocessors());
}

absl::Status PagedAttentionCuda(const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache,
                                const CudaAttentionBatch& batch, float scale,
                                Tensor& out, const CudaExec& exec,
                                AttentionKernel kernel, int splits,
                                const Tensor* k_host, const Tensor* v_host,
                                int64_t window, Tensor* workspace) {
  if (q.rank() != 3 || k_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        "PagedAttentionCuda: q must be [n, heads, d], caches 4-D");
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = k_cache.dim(2);
  RETURN_IF_ERROR(
      CheckDevice("PagedAttentionCuda", "q", q, {n, heads, d}, {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("PagedAttentionCuda", "out", out, {n, heads, d},
                              {DType::kF32, DType::kBF16}));
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: ", heads, " query heads over ",
                     kv_heads, " KV heads"));
  }
  if (d % 32 != 0 || d > 32 * cuda::kMaxDimsPerLane) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda: head_dim ", d,
        " must be a multiple of 32 and at most ", 32 * cuda::kMaxDimsPerLane));
  }
  if (n != batch.tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda: ", n, " tokens, batch of ", batch.tokens()));
  }
  ASSIGN_OR_RETURN(const cuda::KvCaches caches,
                   CheckCache("PagedAttentionCuda", k_cache, v_cache, batch,
                              kv_heads, d, k_host, v_host));
  if (n == 0) return absl::OkStatus();
  cuda::AttnMeta meta = CudaAttentionAccess::Meta(batch);
  if (window > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: sliding window of ", window));
  }
  if (window >= 0) meta.window = static_cast<int>(window);
  if (kernel == AttentionKernel::kAuto) {
    kernel = batch.max_tile() == 1 ? AttentionKernel::kDecode
                                   : AttentionKernel::kPrefill;
  }
  if (kernel == AttentionKernel::kPrefill) {
    return Launched(cuda::AttentionPrefill(
                        q.data<float>(), caches, meta, static_cast<int>(heads),
                        static_cast<int>(kv_heads), static_cast<int>(d), scale,
                        out.raw(), ToDt(out.dtype()), S(exec)),
                    "PagedAttentionCuda (prefill)");
  }
  if (splits <= 0)
    splits = CudaDecodeSplitsFor(batch, heads, kv_heads, meta.window);
  const int64_t ws_floats = CudaDecodeWorkspaceFloats(n, heads, d, splits);
  float* ws = nullptr;
  bool pooled = false;
  if (ws_floats > 0 && workspace != nullptr &&
      workspace->memory() == MemoryType::kDevice &&
      workspace->dtype() == DType::kF32 && workspace->numel() >= ws_floats) {
    ws = workspace->data<float>();
  } else if (ws_floats > 0) {
    // Stream-ordered: the pool makes this cheap after the first step.
    RETURN_IF_CUDA_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&ws),
                                         ws_floats * sizeof(float), S(exec)));
    pooled = true;
  }
  const absl::Status launched =
      Launched(cuda::AttentionDecode(
                   q.data<float>(), caches, meta, static_cast<int>(heads),
                   static_cast<int>(kv_heads), static_cast<int>(d), scale,
                   out.raw(), ToDt(out.dtype()), ws, splits, S(exec)),
               "PagedAttentionCuda (decode)");
  if (pooled) RETURN_IF_CUDA_ERROR(cudaFreeAsync(ws, S(exec)));
  return launched;
}

absl::Status CopyKvBlocksCuda(const Tensor& src, Tensor& dst,
                              absl::Span<const int32_t> src_blocks,
                              absl::Span<const int32_t> dst_blocks,
                              void* stream) {
  if (src.rank() != 4 || dst.rank() != 4 || src.dtype() != dst.dtype() ||
      src.dim(1) != dst.dim(1) || src.dim(2) != dst.dim(2) ||
      src.dim(3) != dst.dim(3) || src.empty() || dst.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyKvBlocksCuda: caches ", src.DebugString(), " and ",
        dst.DebugString(), " must be [blocks, bs, kv_heads, d] alike"));
  }
  const auto reach = [](const Tensor& t) {
    return t.memory() == MemoryType::kDevice ||
           t.memory() == MemoryType::kHostPinned;
  };
  if (!reach(src) || !reach(dst) ||
      (src.memory() != MemoryType::kDevice &&
       dst.memory() != MemoryType::kDevice)) {
    return absl::InvalidArgumentError(
        "CopyKvBlocksCuda: needs device <-> pinned host or device <-> device "
        "(pageable host memory would make the copy synchronous)");
  }
  if (src_blocks.size() != dst_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyKvBlocksCuda: ", src_blocks.size(), " source blocks but ",
        dst_blocks.size(), " destinations"));
  }
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    if (src_blocks[i] < 0 || src_blocks[i] >= src.dim(0) || dst_blocks[i] < 0 ||
        dst_blocks[i] >= dst.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CopyKvBlocksCuda: block ", src_blocks[i], " -> ", dst_blocks[i],
          " outside pools of ", src.dim(0), " and ", dst.dim(0)));
    }
  }
  const size_t block_bytes = src.bytes() / src.dim(0);
  auto* s = static_cast<cudaStream_t>(stream);
  for (size_t i = 0; i < src_blocks.size();) {
    size_t run = 1;
    while (i + run < src_blocks.size() &&
           src_blocks[i + run] == src_blocks[i] + static_cast<int32_t>(run) &&
           dst_blocks[i + run] == dst_blocks[i] + static_cast<int32_t>(run)) {
      ++run;
    }
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
        static_cast<char*>(dst.raw()) + dst_blocks[i] * block_bytes,
        static_cast<const char*>(src.raw()) + src_blocks[i] * block_bytes,
        run * block_bytes, cudaMemcpyDefault, s));
    i += run;
  }
  return absl::OkStatus();
}

absl::Status ArgmaxCuda(const Tensor& logits, Tensor& out,
                        const CudaExec& exec) {
  if (logits.rank() != 2) {
    return absl::InvalidArgumentError("ArgmaxCuda: logits must be 2-D");
  }
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  RETURN_IF_ERROR(CheckDevice("ArgmaxCuda", "logits", logits, {rows, vocab},
                              {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("ArgmaxCuda", "out", out, {rows}, {DType::kI32}));
  if (vocab == 0)
    return absl::InvalidArgumentError("ArgmaxCuda: no vocabulary");
  return Launched(cuda::Argmax(logits.data<float>(), rows, vocab,
                               out.data<int32_t>(), S(exec)),
                  "ArgmaxCuda");
}

absl::Status SampleCuda(const Tensor& logits,
                        absl::Span<const SamplingParams> params,
                        absl::Span<const uint64_t> steps, Tensor& out,
                        const CudaExec& exec) {
  if (logits.rank() != 2) {
    return absl::InvalidArgumentError("SampleCuda: logits must be 2-D");
  }
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  RETURN_IF_ERROR(CheckDevice("SampleCuda", "logits", logits, {rows, vocab},
                              {DType::kF32}));
  RETURN_IF_ERROR(CheckDevice("SampleCuda", "out", out, {rows}, {DType::kI32}));
  if (static_cast<int64_t>(params.size()) != rows ||
      static_cast<int64_t>(steps.size()) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleCuda: ", rows, " rows but ", params.size(),
                     " parameters and ", steps.size(), " steps"));
  }
  if (vocab == 0 || vocab > 0x7fffffff) {
    return absl::InvalidArgumentError("SampleCuda: bad vocabulary size");
  }
  if (rows == 0) return absl::OkStatus();
  std::vector<cuda::SampleRow> host(rows);
  for (int64_t r = 0; r < rows; ++r) {
    RETURN_IF_ERROR(ValidateSamplingParams(params[r]));
    if (params[r].HasLogitProcessors()) {
      return absl::InvalidArgumentError(
          "SampleCuda: penalties and logit_bias are applied on the host "
          "(ProcessLogits, then SampleToken)");
    }
    host[r] = {.temperature = params[r].temperature,
               .top_k = params[r].top_k,
               .top_p = params[r].top_p,
               .unused = 0,
               .u = SampleUniform(params[r].seed, steps[r])};
  }
  void* dev = nullptr;
  const size_t bytes = rows * sizeof(cuda::SampleRow);
  RETURN_IF_CUDA_ERROR(cudaMallocAsync(&dev, bytes, S(exec)));
  // From pageable memory: returns once `host` has been staged.
  absl::Status s = CudaStatus(
      cudaMemcpyAsync(dev, host.data(), bytes, cudaMemcpyHostToDevice, S(exec)),
      "SampleCuda: upload");
  if (s.ok()) {
    s = Launched(cuda::Sample(logits.data<float>(), rows, vocab,
                              static_cast<const cuda::SampleRow*>(dev),
                              out.data<int32_t>(), S(exec)),
                 "SampleCuda");
  }
  RETURN_IF_CUDA_ERROR(cudaFreeAsync(dev, S(exec)));
  return s;
}

}  // namespace shardlm
