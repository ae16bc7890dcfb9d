// y = x w^T with w in a GGUF block format (Q8_0, Q4_0, Q4_1), read in place.
//
// Decode (at most kDecodeMaxRows rows of x): each row of w is read from memory
// once for all of the step's rows of x; each block is dequantized in
// registers once per group of rows (up to kMaxGroup) and multiplied into
// every row of the group in f32 (FMA); no int8 activations, so the
// numerics are those of the f32 weights up to summation order. Each row of
// x gets exactly the sums it would get alone: a token's logits do not
// depend on what else is in the step. A portable kernel is the reference;
// the AVX-512 (F, BW, VL) or else AVX2+FMA+F16C one is chosen at run time.
//
// Prefill: tiles of kPrefillTile rows of w are dequantized into a per-thread
// f32 scratch buffer and multiplied by OpenBLAS, so long prompts keep the
// f32 GEMM's speed without an f32 copy of the model.
//
// Threads: the OpenMP team splits the output rows into equal contiguous
// ranges (rounded to kTileRows), one per thread, on both paths.
#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/status.h"
#include "kernels/check_args.h"
#include "kernels/linear/linear.h"
#include "model/dequantize.h"

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

uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Dot products of one row of w (`blocks` blocks at `row`) with kRows rows
// of x: dots[r] = row . x_r, where row r of x starts at x + r * in and
// xsum[r * blocks + b] is the sum of its values in block b (the Q4 offsets
// multiply it). Each row's sums are formed in the same order whatever
// kRows is, so a row's dot product is the same alone or in a group.
using RowDots = void (*)(const uint8_t* row, const float* x, int64_t in,
                         const float* xsum, int64_t blocks, float* dots);

template <DType kFormat>
float RowDotPortable(const uint8_t* row, const float* x, const float* xsum,
                     int64_t blocks) {
  float acc = 0;
  for (int64_t b = 0; b < blocks; ++b, x += 32) {
    float s = 0;
    if constexpr (kFormat == DType::kQ8_0) {
      const float d = Fp16ToFloat(U16(row));
      const auto* q = reinterpret_cast<const int8_t*>(row + 2);
      for (int j = 0; j < 32; ++j) s += q[j] * x[j];
      acc += d * s;
      row += 34;
    } else {
      const float d = Fp16ToFloat(U16(row));
      const uint8_t* q = row + (kFormat == DType::kQ4_1 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        s += (q[j] & 0xf) * x[j] + (q[j] >> 4) * x[j + 16];
      }
      if constexpr (kFormat == DType::kQ4_1) {
        acc += d * s + Fp16ToFloat(U16(row + 2)) * xsum[b];
        row += 20;
      } else {
        acc += d * (s - 8 * xsum[b]);
        row += 18;
      }
    }
  }
  return acc;
}

// The reference: one row of x at a time.
template <DType kFormat, int kRows>
void RowDotsPortable(const uint8_t* row, const float* x, int64_t in,
                     const float* xsum, int64_t blocks, float* dots) {
  for (int r = 0; r < kRows; ++r) {
    dots[r] =
        RowDotPortable<kFormat>(row, x + r * in, xsum + r * blocks, blocks);
  }
}

// f16 -> f32 with F16C (exact, as Fp16ToFloat).
__attribute__((target("avx2,fma,f16c"))) inline float Half(const uint8_t* p) {
  return _cvtsh_ss(U16(p));
}

__attribute__((target("avx2,fma"))) inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) inline __m256 Bytes8(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

// The low 8 signed bytes of v as floats. A function of its own, not a
// lambda: a lambda does not take its caller's target attribute, and builds
// without -march=native then fail to inline the intrinsics.
__attribute__((target("avx2,fma"))) inline __m256 Int8x8(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// AVX2: a block is four vectors of 8 weights (Q4: values 0..7, 8..15 from
// the low nibbles, 16..23, 24..31 from the high ones), converted once per
// block and multiplied into each row's partial sum s, which the block
// scale then adds to the row's accumulator. kRows <= 4 keeps the 16 ymm
// registers enough.
template <DType kFormat, int kRows>
__attribute__((target("avx2,fma,f16c"))) void RowDotsAvx2(
    const uint8_t* row, const float* x, int64_t in, const float* xsum,
    int64_t blocks, float* dots) {
  __m256 acc[kRows];
  float offsets[kRows];  // Q4: the offset terms, m * sum(x) or -8 d sum(x).
  for (int r = 0; r < kRows; ++r) {
    acc[r] = _mm256_setzero_ps();
    offsets[r] = 0;
  }
  const __m128i low = _mm_set1_epi8(0xf);
  for (int64_t b = 0; b < blocks; ++b) {
    const float df = Half(row);
    const __m256 d = _mm256_set1_ps(df);
    __m256 w[4];
    if constexpr (kFormat == DType::kQ8_0) {
      const __m256i q =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
      const __m128i q0 = _mm256_castsi256_si128(q);
      const __m128i q1 = _mm256_extracti128_si256(q, 1);
      w[0] = Int8x8(q0);
      w[1] = Int8x8(_mm_srli_si128(q0, 8));
      w[2] = Int8x8(q1);
      w[3] = Int8x8(_mm_srli_si128(q1, 8));
    } else {
      const uint8_t* qp = row + (kFormat == DType::kQ4_1 ? 4 : 2);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qp));
      const __m128i lo = _mm_and_si128(v, low);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      w[0] = Bytes8(lo);
      w[1] = Bytes8(_mm_srli_si128(lo, 8));
      w[2] = Bytes8(hi);
      w[3] = Bytes8(_mm_srli_si128(hi, 8));
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const float* xr = x + r * in + b * 32;
      __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xr));
      s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), s);
      s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), s);
      s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), s);
      acc[r] = _mm256_fmadd_ps(d, s, acc[r]);
      if constexpr (kFormat == DType::kQ4_1) {
        offsets[r] += Half(row + 2) * xsum[r * blocks + b];
      } else if constexpr (kFormat == DType::kQ4_0) {
        offsets[r] -= 8 * df * xsum[r * blocks + b];
      }
    }
    row += kFormat == DType::kQ8_0 ? 34 : kFormat == DType::kQ4_1 ? 20 : 18;
  }
  for (int r = 0; r < kRows; ++r) dots[r] = HSum(acc[r]) + offsets[r];
}

// 16 int8 values as f32. The maskz forms: GCC 12's plain
// _mm512_cvtepi8_epi32 and _mm512_cvtepi32_ps pass an undefined register
// through, which -O3 reports as maybe-uninitialized.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 I8ToF32x16(
    __m128i v) {
  return _mm512_maskz_cvtepi32_ps(0xffff,
                                  _mm512_maskz_cvtepi8_epi32(0xffff, v));
}

// The sum of 16 lanes, through memory: GCC 12's _mm512_reduce_add_ps and
// even _mm512_castps512_ps256 go through an undefined register, which -O3
// reports as uninitialized. Once per row, so the store costs nothing.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline float HSum16(
    __m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float pairs[8];
  for (int i = 0; i < 8; ++i) pairs[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) pairs[i] += pairs[i + 4];
  return (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]);
}

// AVX-512: one block is two vectors of 16 weights (Q4: the low nibbles are
// values 0..15, the high ones 16..31; Q8_0: bytes 0..15 and 16..31), made
// once per block and multiplied into each of the kRows rows.
//
// Q4 blocks are dequantized by table lookup: the 16 values a nibble stands
// for in this block (d * (q - 8), or d * q + m) are one vector, and vpermps
// picks each lane's value by the low 4 bits of its index, so the
// zero-extended bytes index the low nibbles as they are and the high ones
// after a shift: no masking, no integer-to-float conversion, and the block
// scale is applied once to the table instead of to the products. Each
// weight is the f32 value DequantizeRow gives (Q4_0 exactly, d * (q - 8)
// having at most 15 significant bits; Q4_1's d * q + m in one rounding
// instead of two), multiplied by FMA into f32 accumulators (two per row:
// the low and high halves). (The maskz forms, as above: GCC 12's plain
// ones read an undefined register.) On this project's Zen 4 machine this
// is ~10% faster than converting the nibbles; four rows of w at a time
// against one x (sharing its loads) was slower when the weights come from
// DRAM.
template <DType kFormat, int kRows>
__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) void
RowDotsAvx512(const uint8_t* row, const float* x, int64_t in, const float* xsum,
              int64_t blocks, float* dots) {
  (void)xsum;  // Q4: the offsets are in the table.
  if constexpr (kFormat != DType::kQ8_0) {
    const __m512 levels =
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 centered = _mm512_sub_ps(levels, _mm512_set1_ps(8.0f));
    __m512 acc0[kRows], acc1[kRows];
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = acc1[r] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(U16(row)));
      __m512 table;
      if constexpr (kFormat == DType::kQ4_0) {
        table = _mm512_mul_ps(d, centered);
        row += 2;
      } else {
        table =
            _mm512_fmadd_ps(d, levels, _mm512_set1_ps(_cvtsh_ss(U16(row + 2))));
        row += 4;
      }
      const __m512i idx = _mm512_maskz_cvtepu8_epi32(
          0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
      const __m512 w0 = _mm512_maskz_permutexvar_ps(0xffff, idx, table);
      const __m512 w1 = _mm512_maskz_permutexvar_ps(
          0xffff, _mm512_maskz_srli_epi32(0xffff, idx, 4), table);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const float* xr = x + r * in + b * 32;
        acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc0[r]);
        acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc1[r]);
      }
      row += 16;
    }
    for (int r = 0; r < kRows; ++r) {
      dots[r] = HSum16(_mm512_add_ps(acc0[r], acc1[r]));
    }
  } else {
    __m512 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(U16(row)));
      // One 32-byte load, not two of 16: with two, the lm_head's shape
      // (576 x 49152, from DRAM) ran at 7 GB/s instead of 19 (gemv_bench).
      const __m256i q =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
      const __m512 w0 = I8ToF32x16(_mm256_castsi256_si128(q));
      const __m512 w1 = I8ToF32x16(_mm256_extracti128_si256(q, 1));
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const float* xr = x + r * in + b * 32;
        __m512 s = _mm512_mul_ps(w0, _mm512_loadu_ps(xr));
        s = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), s);
        acc[r] = _mm512_fmadd_ps(d, s, acc[r]);
      }
      row += 34;
    }
    for (int r = 0; r < kRows; ++r) dots[r] = HSum16(acc[r]);
  }
}

// One row of blocks to f32 for the prefill tiles: the values DequantizeRow
// gives (the same products and sums, no fused multiply-add), 8 at a time.
template <DType kFormat>
__attribute__((target("avx2,fma,f16c"))) void DequantRowAvx2(const uint8_t* row,
                                                             int64_t blocks,
                                                             float* dst) {
  const __m128i low = _mm_set1_epi8(0xf);
  for (int64_t b = 0; b < blocks; ++b, dst += 32) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(U16(row)));
    if constexpr (kFormat == DType::kQ8_0) {
      for (int k = 0; k < 4; ++k) {
        const __m128i q =
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 2 + 8 * k));
        _mm256_storeu_ps(
            dst + 8 * k,
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
      }
      row += 34;
    } else {
      const uint8_t* qp = row + (kFormat == DType::kQ4_1 ? 4 : 2);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qp));
      const __m128i nibbles[2] = {_mm_and_si128(v, low),
                                  _mm_and_si128(_mm_srli_epi16(v, 4), low)};
      const __m256 m = kFormat == DType::kQ4_1
                           ? _mm256_set1_ps(_cvtsh_ss(U16(row + 2)))
                           : _mm256_setzero_ps();
      for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 2; ++k) {
          __m256 q =
              Bytes8(k == 0 ? nibbles[h] : _mm_srli_si128(nibbles[h], 8));
          if constexpr (kFormat == DType::kQ4_1) {
            q = _mm256_add_ps(_mm256_mul_ps(d, q), m);
          } else {
            q = _mm256_mul_ps(d, _mm256_sub_ps(q, _mm256_set1_ps(8.0f)));
          }
          _mm256_storeu_ps(dst + 16 * h + 8 * k, q);
        }
      }
      row += kFormat == DType::kQ4_1 ? 20 : 18;
    }
  }
}

QuantKernel g_kernel = QuantKernel::kAuto;

// F16C from CPUID leaf 1 (ECX bit 29): clang 14 knows no "f16c" for
// __builtin_cpu_supports.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma") && HasF16c();
  return has;
}

bool HasAvx512() {
  static const bool has = HasAvx2() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

// The kernel in use: the one asked for, or the CPU's best.
QuantKernel Resolved() {
  if (g_kernel != QuantKernel::kAuto) return g_kernel;
  if (HasAvx512()) return QuantKernel::kAvx512;
  if (HasAvx2()) return QuantKernel::kAvx2;
  return QuantKernel::kPortable;
}

// A decode kernel for groups of 1, 2, 4 and 8 rows of x (by[k] takes 2^k
// rows); max_group is the largest its registers hold.
struct GroupKernels {
  RowDots by[4];
  int max_group;
};

template <DType kFormat>
GroupKernels PickKernels() {
  switch (Resolved()) {
    case QuantKernel::kAvx512:
      return {{RowDotsAvx512<kFormat, 1>, RowDotsAvx512<kFormat, 2>,
               RowDotsAvx512<kFormat, 4>, RowDotsAvx512<kFormat, 8>},
              8};
    case QuantKernel::kAvx2:
      return {{RowDotsAvx2<kFormat, 1>, RowDotsAvx2<kFormat, 2>,
               RowDotsAvx2<kFormat, 4>, nullptr},
              4};
    default:
      return {{RowDotsPortable<kFormat, 1>, RowDotsPortable<kFormat, 2>,
               RowDotsPortable<kFormat, 4>, RowDotsPortable<kFormat, 8>},
              8};
  }
}

absl::StatusOr<GroupKernels> KernelsFor(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return PickKernels<DType::kQ8_0>();
    case DType::kQ4_0:
      return PickKernels<DType::kQ4_0>();
    case DType::kQ4_1:
      return PickKernels<DType::kQ4_1>();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Linear: no kernel for weights in ", DTypeName(t)));
  }
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

void SetQuantKernel(QuantKernel k) { g_kernel = k; }

bool QuantKernelSupported(QuantKernel k) {
  switch (k) {
    case QuantKernel::kAvx512:
      return HasAvx512();
    case QuantKernel::kAvx2:
      return HasAvx2();
    default:
      return true;
  }
}

const char* QuantKernelName() {
  switch (Resolved()) {
    case QuantKernel::kAvx512:
      return "avx512";
    case QuantKernel::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

absl::Status LinearQuantized(const Tensor& x, const Tensor& w, Tensor& y,
                             bool accumulate) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (w.memory() != MemoryType::kHost || w.dim(1) != in || in % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear: quantized w must be host [", out, ", ", in,
                     "] with whole blocks of 32 columns"));
  }
  if (auto s = CheckHostF32("Linear", "x", x, {n, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "y", y, {n, out}); !s.ok()) return s;
  ASSIGN_OR_RETURN(const GroupKernels kernels, KernelsFor(w.dtype()));
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(w.dtype(), in));
  const int64_t blocks = in / 32;
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();

  if (n > kDecodeMaxRows) {
    // Prefill: dequantized tiles of w times x through BLAS.
    void (*dequant)(const uint8_t*, int64_t, float*) = nullptr;
    if (Resolved() != QuantKernel::kPortable) {
      dequant = w.dtype() == DType::kQ8_0   ? DequantRowAvx2<DType::kQ8_0>
                : w.dtype() == DType::kQ4_0 ? DequantRowAvx2<DType::kQ4_0>
                                            : DequantRowAvx2<DType::kQ4_1>;
    }
    const float beta = accumulate ? 1.0f : 0.0f;
    absl::Status status;
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
          const uint8_t* src = wp + (r0 + r) * row_bytes;
          float* dst = scratch.data() + r * in;
          if (dequant != nullptr) {
            dequant(src, blocks, dst);
            continue;
          }
          absl::Status s = DequantizeRow(w.dtype(), src, in, dst);
          if (!s.ok()) {
#pragma omp critical
            status = s;
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, in, 1.0f,
                    xp, in, scratch.data(), in, beta, yp + r0, out);
      }
    }
    return status;
  }

  // Decode: sums of x per block, then each output row's dot products with
  // the rows of x, in groups of up to max_group (8, 4, 2, 1: n = 7 is a
  // group of 4, one of 2 and one of 1) that share the dequantized blocks.
  std::vector<float> xsum(n * blocks);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      float s = 0;
      for (int j = 0; j < 32; ++j) s += xp[r * in + b * 32 + j];
      xsum[r * blocks + b] = s;
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
        kernels.by[k](row, xp + r * in, in, xsum.data() + r * blocks, blocks,
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
