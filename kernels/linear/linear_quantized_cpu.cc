// y = x w^T with w in a GGUF block format (any row of core/dtype.h's table
// with a block size above 1), read in place.
//
// Decode (at most kDecodeMaxRows rows of x): each row of w is read from memory
// once for all of the step's rows of x; each block is unpacked once per
// group of up to the kernel's max_group rows (8; AVX2: 4) and multiplied into
// every row
// of the group in f32 (FMA); no int8 activations, so the numerics are those
// of the f32 weights up to summation order. Each row of x gets exactly the
// sums it would get alone: a token's logits do not depend on what else is
// in the step. The arithmetic on blocks is quant_kernels.h's, one file per
// ISA: a portable reference, AVX2 + FMA + F16C, AVX-512 (F, BW, VL), chosen
// at run time (kernels/cpu_isa.h; SHARDLM_CPU_ISA forces one).
//
// Prefill: tiles of kPrefillTile rows of w are dequantized into a per-thread
// f32 scratch buffer and multiplied by OpenBLAS, so long prompts keep the
// f32 GEMM's speed without an f32 copy of the model. Batch-invariant
// (kernels/batch_invariance.h), every step runs the decode kernels
// instead, in tiles (LinearByRowDots).
//
// Threads: the OpenMP team splits the output rows into equal contiguous
// ranges (rounded to kTileRows), one per thread, on both paths.
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/batch_invariance.h"
#include "kernels/check_args.h"
#include "kernels/cpu_isa.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_kernels.h"
#include "kernels/precision.h"
#include "kernels/threading.h"

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
// Batch-invariant steps of more than kDecodeMaxRows rows: rows of w kept in
// cache (about this many bytes of them) while groups of up to kRowTile
// rows of x pass over them.
constexpr int64_t kRowDotTileBytes = 96 << 10;
constexpr int64_t kRowTile = 64;

// Runs rows(begin, end) over [0, out) in contiguous ranges of whole
// kTileRows tiles, shared among this thread's kernel threads (ParallelFor),
// or all here when `parallel` is false.
template <typename Rows>
void ForOutputRows(int64_t out, bool parallel, Rows rows) {
  if (!parallel) {
    rows(int64_t{0}, out);
    return;
  }
  const int64_t tiles = (out + kTileRows - 1) / kTileRows;
  ParallelFor(tiles, [&](int64_t t0, int64_t t1) {
    rows(t0 * kTileRows, std::min(out, t1 * kTileRows));
  });
}

}  // namespace

namespace quant_kernels {

absl::StatusOr<Kernels> ForActiveIsa(DType t) {
  Kernels k;
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      k = Avx512(t);
      break;
    case CpuIsa::kAvx2:
      k = Avx2(t);
      break;
    default:
      k = Portable(t);
  }
  if (k.max_group == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: no kernel for weights in ", DTypeName(t)));
  }
  return k;
}

void LinearByRowDots(const Kernels& k, const uint8_t* w, int64_t row_bytes,
                     int64_t blocks, const float* x, int64_t n, int64_t in,
                     int64_t out, float* y, bool accumulate,
                     const QuantizedRows* q) {
  // Sums of x per sub-block, for the mins of formats that have them. With
  // quantized x, sums of its quantized values (d x the codes' exact sum):
  // then the row's error is w . (x' - x), where the f32 sums would leave
  // (w - min) . (x' - x), whose terms share the sign of -min and add up
  // (measured on SmolLM2 Q4_1: 4.5x the KL divergence from exact).
  const int64_t sub = q != nullptr ? k.int_xsum_sub : k.xsum_sub;
  const int64_t subs = sub > 0 ? in / sub : 0;
  std::vector<float> xsum(n * subs);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < subs; ++i) {
      const int64_t at = r * in + i * sub;
      if (q != nullptr) {
        int32_t codes = 0;
        for (int64_t j = 0; j < sub; ++j) codes += q->q[at + j];
        xsum[r * subs + i] = q->d[at / 32] * static_cast<float>(codes);
        continue;
      }
      float s = 0;
      for (int64_t j = 0; j < sub; ++j) s += x[at + j];
      xsum[r * subs + i] = s;
    }
  }
  // Rows [r0, r1) of x against row o of w, in groups that share the
  // unpacked blocks.
  const auto dots_of = [&](int64_t o, int64_t r0, int64_t r1) {
    const uint8_t* row = w + o * row_bytes;
    for (int64_t r = r0; r < r1;) {
      float dots[8];
      int g;
      if (q != nullptr) {
        g = static_cast<int>(std::min<int64_t>(r1 - r, k.int_group));
        k.int_by[g - 1](row, q->q + r * in, q->d + r * (in / 32), in,
                        xsum.data() + r * subs, blocks, dots);
      } else {
        g = static_cast<int>(std::min<int64_t>(r1 - r, k.max_group));
        k.by[g - 1](row, x + r * in, in, xsum.data() + r * subs, blocks, dots);
      }
      for (int i = 0; i < g; ++i, ++r) {
        y[r * out + o] = accumulate ? y[r * out + o] + dots[i] : dots[i];
      }
    }
  };
  if (n > kDecodeMaxRows) {
    // Tiles of w rows stay in cache while groups of x rows pass over them.
    const int64_t tile = std::max<int64_t>(1, kRowDotTileBytes / row_bytes);
    ForOutputRows(out, true, [&](int64_t begin, int64_t end) {
      for (int64_t o0 = begin; o0 < end; o0 += tile) {
        const int64_t o1 = std::min(end, o0 + tile);
        for (int64_t r0 = 0; r0 < n; r0 += kRowTile) {
          const int64_t r1 = std::min(n, r0 + kRowTile);
          for (int64_t o = o0; o < o1; ++o) dots_of(o, r0, r1);
        }
      }
    });
    return;
  }
  // Decode: each row of w read once for all rows of x.
  const bool parallel = out * in >= (int64_t{1} << 16);
  ForOutputRows(out, parallel, [&](int64_t begin, int64_t end) {
    // This range's rows end here; nothing past them is prefetched.
    const char* const stop = reinterpret_cast<const char*>(w + end * row_bytes);
    for (int64_t o = begin; o < end; ++o) {
      const char* ahead =
          reinterpret_cast<const char*>(w + o * row_bytes) + kPrefetchBytes;
      for (int64_t b = 0; b < row_bytes && ahead + b < stop; b += 64) {
        _mm_prefetch(ahead + b, _MM_HINT_T0);
      }
      dots_of(o, 0, n);
    }
  });
}

}  // namespace quant_kernels

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
  ASSIGN_OR_RETURN(const quant_kernels::Kernels kernels,
                   quant_kernels::ForActiveIsa(w.dtype()));
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(w.dtype(), in));
  const int64_t blocks = in / block;
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();

  const bool prefill = n > kDecodeMaxRows && !BatchInvariant();
  if (ActivePrecision() == Precision::kFast && kernels.int_group > 0) {
    // x to int8 per run of 32. Decode steps (and every step when batch
    // invariant) then run integer dot products. Prefill runs the BLAS
    // GEMM below on x's rounded values (q x d in f32): the same products
    // as the integer kernels up to f32 summation order, at the GEMM's
    // speed, which the row-dot tiles reach only at about half (no int8
    // GEMM micro-kernel yet).
    thread_local std::vector<int8_t> xq;
    thread_local std::vector<float> xd;
    xq.resize(n * in);
    xd.resize(n * in / 32);
    // Pointers, not the thread_local names: inside a ParallelFor body
    // those name the running worker's own (empty) vectors.
    int8_t* const qp = xq.data();
    float* const dp = xd.data();
    const auto quantize = [&](int64_t r0, int64_t r1) {
      quant_kernels::QuantizeRowsQ8(xp + r0 * in, r1 - r0, in, qp + r0 * in,
                                    dp + r0 * (in / 32));
    };
    if (prefill) {
      ParallelFor(n, quantize);
    } else {
      quantize(0, n);
    }
    if (!prefill) {
      const quant_kernels::QuantizedRows q{.q = qp, .d = dp};
      quant_kernels::LinearByRowDots(kernels, wp, row_bytes, blocks, xp, n, in,
                                     out, yp, accumulate, &q);
      return absl::OkStatus();
    }
    thread_local std::vector<float> rounded;
    rounded.resize(n * in);
    float* const rp = rounded.data();
    ParallelFor(n, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * in; i < r1 * in; ++i) {
        rp[i] = dp[i / 32] * static_cast<float>(qp[i]);
      }
    });
    xp = rp;
  }
  if (prefill) {
    // Prefill: dequantized tiles of w times x through BLAS.
    const float beta = accumulate ? 1.0f : 0.0f;
    ForOutputRows(out, true, [&](int64_t begin, int64_t end) {
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
    });
    return absl::OkStatus();
  }

  quant_kernels::LinearByRowDots(kernels, wp, row_bytes, blocks, xp, n, in, out,
                                 yp, accumulate);
  return absl::OkStatus();
}

}  // namespace shardlm
