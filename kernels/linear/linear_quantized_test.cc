// Linear with weights in GGUF block formats against a double-precision
// reference on the dequantized weights, for the portable, AVX2 and AVX-512
// decode kernels and the tiled prefill path, on awkward shapes: output rows
// not a multiple of the tile, 1 and 4097 blocks per row, a TP shard's
// column slice starting mid-row; and each row of a decode step against the
// same row alone. Also the quantized embedding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/max_abs_diff.h"
#include "gtest/gtest.h"
#include "kernels/batch_invariance.h"
#include "kernels/cpu_isa_testing.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_kernels.h"
#include "kernels/precision.h"
#include "model/dequantize.h"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

using testing_util::RandomQuantized;
using testing_util::RandomTensor;

Tensor Dequantized(const Tensor& w) {
  Tensor f = *Tensor::Host(DType::kF32, w.shape());
  EXPECT_TRUE(DequantizeRow(w.dtype(), static_cast<const uint8_t*>(w.raw()),
                            w.numel(), f.data<float>())
                  .ok());
  return f;
}

// x w^T in double, and the sum of |terms| of each output (what f32
// rounding is relative to), [n, out] each.
struct Expected {
  std::vector<double> y, mag;
};

Expected Reference(const Tensor& x, const Tensor& wf) {
  const int64_t n = x.dim(0), in = x.dim(1), out = wf.dim(0);
  Expected e{std::vector<double>(n * out), std::vector<double>(n * out)};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double term = double{x.f32()[i * in + k]} * wf.f32()[o * in + k];
        acc += term;
        mag += std::abs(term);
      }
      e.y[i * out + o] = acc;
      e.mag[i * out + o] = mag;
    }
  }
  return e;
}

// |y - (reference + offset)| within f32 rounding of the sum of |terms|.
void ExpectClose(const Tensor& y, const Expected& want, double offset = 0) {
  ASSERT_EQ(static_cast<size_t>(y.numel()), want.y.size());
  for (size_t i = 0; i < want.y.size(); ++i) {
    const double got = y.f32()[i], expected = want.y[i] + offset;
    ASSERT_LE(MaxAbsDiff(&got, &expected, 1), 1e-5 * want.mag[i] + 1e-6)
        << "output " << i;
  }
}

// The decode kernels this process runs, the portable reference first (the
// others are named once on the gate's note line: kernels/cpu_isa_testing.h).
const std::vector<CpuIsa>& Kernels() { return TestIsas(); }

class LinearQuantizedTest : public ::testing::TestWithParam<DType> {
 protected:
  void TearDown() override { SetCpuIsa(CpuIsa::kAuto); }
};

TEST_P(LinearQuantizedTest, EveryKernelMatchesTheDequantizedReference) {
  const DType t = GetParam();
  const std::vector<CpuIsa>& kernels = Kernels();
  const int64_t block = BlockElems(t);
  // (rows of w, blocks per row): 37 rows is not a multiple of the tile;
  // 4097 blocks of 32, or 19 super-blocks of 256 (a row of 4864: Qwen2's
  // FFN), is a long row.
  for (const auto& [out, blocks] : std::vector<std::pair<int64_t, int64_t>>{
           {37, 1}, {37, 3}, {5, block == 32 ? 4097 : 19}}) {
    const int64_t in = blocks * block;
    const Tensor w = RandomQuantized(t, out, in, 7);
    const Tensor wf = Dequantized(w);
    // Decode kernels (groups of 1, 3, 7 and 16 rows of x), then the tiled
    // path.
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{7}, kDecodeMaxRows,
                      kDecodeMaxRows + 1}) {
      const Tensor x = RandomTensor({n, in}, 11);
      const auto want = Reference(x, wf);
      std::vector<float> first_tiled;  // The tiled path of the first kernel.
      for (CpuIsa k : kernels) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(t) << " out " << out << " in " << in << " n "
                     << n << " kernel " << static_cast<int>(k));
        SetCpuIsa(k);
        Tensor y = *Tensor::Host(DType::kF32, {n, out});
        ASSERT_TRUE(Linear(x, w, y).ok());
        ExpectClose(y, want);
        if (n > kDecodeMaxRows) {
          // Every kernel's tiles hold DequantizeRow's exact values, so the
          // BLAS products agree bit for bit.
          std::vector<float> got(y.f32().begin(), y.f32().end());
          if (first_tiled.empty()) {
            first_tiled = got;
          } else {
            EXPECT_EQ(got, first_tiled);
          }
        }
        // Accumulating adds onto what is there.
        Tensor acc = *Tensor::Host(DType::kF32, {n, out});
        for (float& v : acc.f32()) v = 1.0f;
        ASSERT_TRUE(Linear(x, w, acc, /*accumulate=*/true).ok());
        ExpectClose(acc, want, 1.0);
      }
    }
  }
}

// A token's result must not depend on what else is in its step: with
// every kernel, each row of a decode step of n rows equals, bit for bit,
// the same row of x multiplied alone.
TEST_P(LinearQuantizedTest, EachRowOfADecodeStepIsWhatItGetsAlone) {
  const DType t = GetParam();
  const int64_t out = 21, in = BlockElems(t) * 5;
  const Tensor w = RandomQuantized(t, out, in, 13);
  const Tensor x = RandomTensor({kDecodeMaxRows, in}, 17);
  for (CpuIsa k : Kernels()) {
    SetCpuIsa(k);
    std::vector<float> alone;  // [kDecodeMaxRows, out]
    for (int64_t r = 0; r < kDecodeMaxRows; ++r) {
      Tensor xr = *Tensor::Host(DType::kF32, {1, in});
      std::copy_n(x.f32().begin() + r * in, in, xr.f32().begin());
      Tensor yr = *Tensor::Host(DType::kF32, {1, out});
      ASSERT_TRUE(Linear(xr, w, yr).ok());
      alone.insert(alone.end(), yr.f32().begin(), yr.f32().end());
    }
    for (int64_t n = 2; n <= kDecodeMaxRows; ++n) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(t) << " kernel " << CpuIsaName(ActiveCpuIsa())
                   << " n " << n);
      Tensor xn = *Tensor::Host(DType::kF32, {n, in});
      std::copy_n(x.f32().begin(), n * in, xn.f32().begin());
      Tensor yn = *Tensor::Host(DType::kF32, {n, out});
      ASSERT_TRUE(Linear(xn, w, yn).ok());
      EXPECT_EQ(std::vector<float>(yn.f32().begin(), yn.f32().end()),
                std::vector<float>(alone.begin(), alone.begin() + n * out));
    }
  }
}

// Batch-invariant (kernels/batch_invariance.h), steps of any size run the
// decode kernels in tiles: still the reference's products, and each row
// bit for bit what it gets alone, with every kernel (70 rows of x are a
// tile of 64 and one of 6).
TEST_P(LinearQuantizedTest, BatchInvariantStepsGiveEachRowWhatItGetsAlone) {
  const DType t = GetParam();
  const int64_t out = 37, in = BlockElems(t) * (BlockElems(t) == 32 ? 9 : 2);
  SetBatchInvariant(true);
  const Tensor w = RandomQuantized(t, out, in, 23);
  const Tensor x = RandomTensor({70, in}, 29);
  const auto want = Reference(x, Dequantized(w));
  for (CpuIsa k : Kernels()) {
    SCOPED_TRACE(::testing::Message()
                 << DTypeName(t) << " kernel " << CpuIsaName(k));
    SetCpuIsa(k);
    Tensor y = *Tensor::Host(DType::kF32, {70, out});
    ASSERT_TRUE(Linear(x, w, y).ok());
    ExpectClose(y, want);
    for (int64_t r : {0, 17, 63, 64, 69}) {
      Tensor xr = *Tensor::Host(DType::kF32, {1, in});
      std::copy_n(x.f32().begin() + r * in, in, xr.f32().begin());
      Tensor yr = *Tensor::Host(DType::kF32, {1, out});
      ASSERT_TRUE(Linear(xr, w, yr).ok());
      EXPECT_EQ(std::vector<float>(yr.f32().begin(), yr.f32().end()),
                std::vector<float>(y.f32().begin() + r * out,
                                   y.f32().begin() + (r + 1) * out))
          << "row " << r;
    }
  }
  SetBatchInvariant(false);
}

// Precision::kFast: x goes to int8 per run of 32 values, so each output
// may move from the exact product by at most sum_k |w_k| d_k / 2 (d_k the
// scale of x_k's run: rounding moves a value by at most half of it), plus
// f32 rounding. Every kernel keeps to that, agrees with the portable
// integer reference to f32 rounding, and gives each row of a step (decode
// groups and the tiled rows alike) bit for bit what it gets alone.
class FastPrecision {
 public:
  FastPrecision() { SetPrecision(Precision::kFast); }
  ~FastPrecision() { SetPrecision(Precision::kExact); }
};

TEST_P(LinearQuantizedTest, FastStaysWithinTheActivationRoundingOfExact) {
  const DType t = GetParam();
  const int64_t out = 37, in = BlockElems(t) * (BlockElems(t) == 32 ? 9 : 2);
  const Tensor w = RandomQuantized(t, out, in, 31);
  const Tensor wf = Dequantized(w);
  FastPrecision fast;
  for (int64_t n : {int64_t{1}, int64_t{5}, kDecodeMaxRows + 54}) {
    const Tensor x = RandomTensor({n, in}, 37);
    const auto want = Reference(x, wf);
    std::vector<int8_t> xq(n * in);
    std::vector<float> xd(n * in / 32);
    quant_kernels::QuantizeRowsQ8(x.f32().data(), n, in, xq.data(), xd.data());
    std::vector<float> portable;
    for (CpuIsa k : Kernels()) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " n " << n
                                        << " kernel " << CpuIsaName(k));
      SetCpuIsa(k);
      Tensor y = *Tensor::Host(DType::kF32, {n, out});
      ASSERT_TRUE(Linear(x, w, y).ok());
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < out; ++o) {
          double bound = 0;
          for (int64_t j = 0; j < in; ++j) {
            bound += std::abs(double{wf.f32()[o * in + j]}) *
                     xd[(r * in + j) / 32] / 2;
          }
          const int64_t i = r * out + o;
          ASSERT_LE(std::abs(y.f32()[i] - want.y[i]),
                    bound + 1e-5 * want.mag[i] + 1e-6)
              << "row " << r << " output " << o;
        }
      }
      std::vector<float> got(y.f32().begin(), y.f32().end());
      if (portable.empty()) {
        portable = got;  // Kernels() lists the portable reference first.
        continue;
      }
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], portable[i], 1e-5 * want.mag[i] + 1e-6)
            << "output " << i;
      }
    }
  }
}

// Decode steps (up to kDecodeMaxRows rows), and steps of any size when
// batch invariant, give each row bit for bit what it gets alone. (A
// prefill step runs the BLAS GEMM on the rounded x: the stay-within test
// above holds it.)
TEST_P(LinearQuantizedTest, FastStepsGiveEachRowWhatItGetsAlone) {
  const DType t = GetParam();
  const int64_t out = 21, in = BlockElems(t) * (BlockElems(t) == 32 ? 5 : 1);
  const Tensor w = RandomQuantized(t, out, in, 41);
  const Tensor x = RandomTensor({70, in}, 43);
  FastPrecision fast;
  for (bool invariant : {false, true}) {
    SetBatchInvariant(invariant);
    for (CpuIsa k : Kernels()) {
      SetCpuIsa(k);
      for (int64_t n : {int64_t{3}, kDecodeMaxRows, int64_t{70}}) {
        if (n > kDecodeMaxRows && !invariant) continue;
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(t) << " kernel " << CpuIsaName(k) << " n "
                     << n << (invariant ? " batch-invariant" : ""));
        Tensor xn = *Tensor::Host(DType::kF32, {n, in});
        std::copy_n(x.f32().begin(), n * in, xn.f32().begin());
        Tensor y = *Tensor::Host(DType::kF32, {n, out});
        ASSERT_TRUE(Linear(xn, w, y).ok());
        for (int64_t r : {int64_t{0}, n / 2, n - 1}) {
          Tensor xr = *Tensor::Host(DType::kF32, {1, in});
          std::copy_n(x.f32().begin() + r * in, in, xr.f32().begin());
          Tensor yr = *Tensor::Host(DType::kF32, {1, out});
          ASSERT_TRUE(Linear(xr, w, yr).ok());
          EXPECT_EQ(std::vector<float>(yr.f32().begin(), yr.f32().end()),
                    std::vector<float>(y.f32().begin() + r * out,
                                       y.f32().begin() + (r + 1) * out))
              << "row " << r;
        }
      }
    }
  }
  SetBatchInvariant(false);
}

TEST_P(LinearQuantizedTest, ATpShardsColumnSliceStartingMidRow) {
  const DType t = GetParam();
  const int64_t b = BlockElems(t), out = 19, in = b * 9;
  const Tensor w = RandomQuantized(t, out, in, 3);
  TensorInfo info{.name = "w",
                  .dtype = t,
                  .shape = {out, in},
                  .bytes = static_cast<uint64_t>(w.bytes())};
  const absl::Span<const uint8_t> bytes(static_cast<const uint8_t*>(w.raw()),
                                        w.bytes());
  // Rows [4, 17) x blocks 3..6 of each row.
  auto slice = CopySlice(info, bytes, 4, 17, 3 * b, 7 * b);
  ASSERT_TRUE(slice.ok()) << slice.status();
  auto slice_f = DequantizeSlice(info, bytes, 4, 17, 3 * b, 7 * b);
  ASSERT_TRUE(slice_f.ok());
  const Tensor x = RandomTensor({2, 4 * b}, 5);
  Tensor y = *Tensor::Host(DType::kF32, {2, 13});
  ASSERT_TRUE(Linear(x, *slice, y).ok());
  ExpectClose(y, Reference(x, *slice_f));
  // Not on a block boundary (a super-block cut by a TP split): refused.
  auto bad = CopySlice(info, bytes, 0, 1, b / 2, 2 * b);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// A row-parallel TP split in Precision::kFast: each rank quantizes its
// slice of x on the runs the whole row has (slices start on block edges),
// so the slices' products sum to the whole product up to f32 rounding.
TEST_P(LinearQuantizedTest, FastColumnSlicesSumToTheWholeProduct) {
  const DType t = GetParam();
  const int64_t b = BlockElems(t), out = 19, in = b * 6;
  const Tensor w = RandomQuantized(t, out, in, 3);
  TensorInfo info{.name = "w",
                  .dtype = t,
                  .shape = {out, in},
                  .bytes = static_cast<uint64_t>(w.bytes())};
  const absl::Span<const uint8_t> bytes(static_cast<const uint8_t*>(w.raw()),
                                        w.bytes());
  const Tensor x = RandomTensor({5, in}, 5);
  FastPrecision fast;
  Tensor whole = *Tensor::Host(DType::kF32, {5, out});
  ASSERT_TRUE(Linear(x, w, whole).ok());
  std::vector<float> sum(5 * out, 0.0f);
  for (int64_t c0 = 0; c0 < in; c0 += 2 * b) {
    auto slice = CopySlice(info, bytes, 0, out, c0, c0 + 2 * b);
    ASSERT_TRUE(slice.ok()) << slice.status();
    Tensor xs = *Tensor::Host(DType::kF32, {5, 2 * b});
    for (int64_t r = 0; r < 5; ++r) {
      std::copy_n(x.f32().begin() + r * in + c0, 2 * b,
                  xs.f32().begin() + r * 2 * b);
    }
    Tensor ys = *Tensor::Host(DType::kF32, {5, out});
    ASSERT_TRUE(Linear(xs, *slice, ys).ok());
    for (int64_t i = 0; i < 5 * out; ++i) sum[i] += ys.f32()[i];
  }
  const auto want = Reference(x, Dequantized(w));
  for (int64_t i = 0; i < 5 * out; ++i) {
    ASSERT_NEAR(sum[i], whole.f32()[i], 1e-5 * want.mag[i] + 1e-6)
        << "output " << i;
  }
}

TEST_P(LinearQuantizedTest, EmbeddingDequantizesItsRows) {
  const DType t = GetParam();
  const int64_t h = 2 * BlockElems(t);
  const Tensor table = RandomQuantized(t, 10, h, 9);
  const Tensor tf = Dequantized(table);
  Tensor out = *Tensor::Host(DType::kF32, {3, h});
  // Vocab slice [100, 110): 105 and 109 are in it, 99 is not.
  ASSERT_TRUE(
      Embedding(table, std::vector<int32_t>{105, 99, 109}, 100, out).ok());
  EXPECT_EQ(MaxAbsDiff(out.f32().data(), tf.f32().data() + 5 * h, h), 0.0);
  for (int j = 0; j < h; ++j) EXPECT_EQ(out.f32()[h + j], 0.0f);
  EXPECT_EQ(MaxAbsDiff(out.f32().data() + 2 * h, tf.f32().data() + 9 * h, h),
            0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, LinearQuantizedTest,
    ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                      DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                      DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL,
                      DType::kIQ4_XS, DType::kMXFP4),
    [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace shardlm
