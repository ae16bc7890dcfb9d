// y = x w^T with w in a GGUF block format (any row of core/dtype.h's table
// with a block size above 1), read in place.
//
// Decode (at most kDecodeMaxRows rows of x): each row of w is read from memory
// once for all of the step's rows of x; each block is unpacked once per
// group of rows (up to the kernel's max_group) and multiplied into every row
// of the group in f32 (FMA); no int8 activations, so the numerics are those
// of the f32 weights up to summation order. Each row of x gets exactly the
// sums it would get alone: a token's logits do not depend on what else is
// in the step. The arithmetic on blocks is quant_kernels.h's, one file per
// ISA: a portable reference, AVX2 + FMA + F16C, AVX-512 (F, BW, VL), chosen
// at run time (kernels/cpu_isa.h; SHARDLM_CPU_ISA forces one).
//
// Prefill: tiles of kPrefillTile rows of w are dequantized into a per-thread
// f32 scratch buffer and multiplied by OpenBLAS, so long prompts keep the
// f32 GEMM's speed without an f32 copy of the model.
//
// Threads: the OpenMP team splits the output rows into equal contiguous
// ranges (rounded to kTileRows), one per thread, on both paths.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/check_args.h"
#include "kernels/cpu_isa.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_kernels.h"

namespace shardlm {
namespace {

// Decode prefetches the weight row this many bytes ahead of the one it
// multiplies. On the 2-core Intel Xeon VM the hardware prefetchers alone
// left decode at a fifth of the bandwidth floor (each matrix is cold and a
// few hundred KB); 4 KiB ahead took SmolLM2 decode 2.3-2.6x faster for
// Q4_0, Q4_1 and Q8_0 at one and two threads (engine_bench; 1, 2, 8 and 16
// KiB ahead were no faster). Numerics are unchanged: a prefetch only warms
// the cache.
constexpr int64_t kPrefetchBytes = 4096;
constexpr int64_t kTileRows = 16;      // Partition granule of output rows.
constexpr int64_t kPrefillTile = 256;  // Rows dequantized per BLAS call.

absl::StatusOr<quant_kernels::Kernels> KernelsFor(DType t) {
  quant_kernels::Kernels k;
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      k = quant_kernels::Avx512(t);
      break;
    case CpuIsa::kAvx2:
      k = quant_kernels::Avx2(t);
      break;
    default:
      k = quant_kernels::Portable(t);
  }
  if (k.max_group == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: no kernel for weights in ", DTypeName(t)));
  }
  return k;
}

// This OpenMP thread's output rows: equal contiguous ranges, in multiples
// of kTileRows, one per thread of the team.
std::pair<int64_t, int64_t> ThreadRows(int64_t out) {
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  const int64_t tiles = (out + kTileRows - 1) / kTileRows;
  return {std::min(out, tiles * t / nt * kTileRows),
          std::min(out, tiles * (t + 1) / nt * kTileRows)};
}

}  // namespace

absl::Status LinearQuantized(const Tensor& x, const Tensor& w, Tensor& y,
                             bool accumulate) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  const int64_t block = BlockElems(w.dtype());
  if (w.memory() != MemoryType::kHost || w.dim(1) != in || in % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: quantized w must be host [", out, ", ", in,
                     "] with whole blocks of ", block, " columns (",
                     DTypeName(w.dtype()), ")"));
  }
  if (auto s = CheckHostF32("Linear", "x", x, {n, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "y", y, {n, out}); !s.ok()) return s;
  ASSIGN_OR_RETURN(const quant_kernels::Kernels kernels, KernelsFor(w.dtype()));
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(w.dtype(), in));
  const int64_t blocks = in / block;
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();

  if (n > kDecodeMaxRows) {
    // Prefill: dequantized tiles of w times x through BLAS.
    const float beta = accumulate ? 1.0f : 0.0f;
#pragma omp parallel
    {
      const auto [begin, end] = ThreadRows(out);
      // Reused across calls: a fresh (zeroed) tile per call and thread
      // cost a memset of up to a few MB on every prefill GEMM.
      thread_local std::vector<float> scratch;
      if (scratch.size() < static_cast<size_t>(kPrefillTile * in)) {
        scratch.resize(kPrefillTile * in);
      }
      for (int64_t r0 = begin; r0 < end; r0 += kPrefillTile) {
        const int64_t rows = std::min(kPrefillTile, end - r0);
        for (int64_t r = 0; r < rows; ++r) {
          kernels.dequant(wp + (r0 + r) * row_bytes, blocks,
                          scratch.data() + r * in);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, in, 1.0f,
                    xp, in, scratch.data(), in, beta, yp + r0, out);
      }
    }
    return absl::OkStatus();
  }

  // Decode: sums of x per sub-block (for the mins of formats that have
  // them), then each output row's dot products with the rows of x, in
  // groups of up to max_group (8, 4, 2, 1: n = 7 is a group of 4, one of 2
  // and one of 1) that share the unpacked blocks.
  const int64_t sub = kernels.xsum_sub, subs = sub > 0 ? in / sub : 0;
  std::vector<float> xsum(n * subs);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < subs; ++i) {
      float s = 0;
      for (int64_t j = 0; j < sub; ++j) s += xp[r * in + i * sub + j];
      xsum[r * subs + i] = s;
    }
  }
  const bool parallel = out * in >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    const auto [begin, end] = ThreadRows(out);
    // This thread's rows end here; nothing past them is prefetched.
    const char* const stop =
        reinterpret_cast<const char*>(wp + end * row_bytes);
    for (int64_t o = begin; o < end; ++o) {
      const uint8_t* row = wp + o * row_bytes;
      const char* ahead = reinterpret_cast<const char*>(row) + kPrefetchBytes;
      for (int64_t k = 0; k < row_bytes && ahead + k < stop; k += 64) {
        _mm_prefetch(ahead + k, _MM_HINT_T0);
      }
      for (int64_t r = 0; r < n;) {
        int k = 0;  // The group takes 2^k rows.
        while (k < 3 &&
               int64_t{2} << k <= std::min<int64_t>(n - r, kernels.max_group)) {
          ++k;
        }
        float dots[8];
        kernels.by[k](row, xp + r * in, in, xsum.data() + r * subs, blocks,
                      dots);
        for (int g = 0; g < 1 << k; ++g, ++r) {
          yp[r * out + o] = accumulate ? yp[r * out + o] + dots[g] : dots[g];
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
