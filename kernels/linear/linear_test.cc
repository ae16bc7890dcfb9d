#include "kernels/linear/linear.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/batch_invariance.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_isa_testing.h"
#include "kernels/linear/quant_kernels.h"
#include "kernels/precision.h"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

using testing_util::MaxAbsDiff;
using testing_util::RandomTensor;

std::vector<double> Reference(const Tensor& x, const Tensor& w) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  std::vector<double> y(n * out);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) {
        acc += double{x.f32()[i * in + k]} * w.f32()[o * in + k];
      }
      y[i * out + o] = acc;
    }
  }
  return y;
}

TEST(LinearTest, MatchesDoubleReferenceOnAwkwardShapes) {
  for (int64_t n : {1, 5, 33}) {
    Tensor x = RandomTensor({n, 769}, 1);
    Tensor w = RandomTensor({131, 769}, 2, 0.05f);
    Tensor y = *Tensor::Host(DType::kF32, {n, 131});
    ASSERT_TRUE(Linear(x, w, y).ok());
    const auto want = Reference(x, w);
    EXPECT_LT(MaxAbsDiff(y.f32().data(), want.data(), y.numel()), 1e-4) << n;
  }
}

// A row's sums do not depend on its step: steps of up to kDecodeMaxRows
// rows always, any step batch-invariant. Rows of 769 (a tail past the
// vector lanes), with every kernel, bit for bit against the row alone, and
// against the double reference.
TEST(LinearTest, EachRowOfAStepIsWhatItGetsAlone) {
  const int64_t in = 769, out = 37;
  const Tensor x = RandomTensor({70, in}, 5);
  const Tensor w = RandomTensor({out, in}, 6, 0.05f);
  const auto want = Reference(x, w);
  for (CpuIsa isa : TestIsas()) {
    SetCpuIsa(isa);
    for (bool invariant : {false, true}) {
      SetBatchInvariant(invariant);
      for (int64_t n :
           {int64_t{1}, int64_t{2}, int64_t{7}, kDecodeMaxRows, int64_t{70}}) {
        if (n > kDecodeMaxRows && !invariant) continue;
        SCOPED_TRACE(::testing::Message() << CpuIsaName(isa) << " n " << n
                                          << " invariant " << invariant);
        Tensor xn = *Tensor::Host(DType::kF32, {n, in});
        std::copy_n(x.f32().begin(), n * in, xn.f32().begin());
        Tensor y = *Tensor::Host(DType::kF32, {n, out});
        ASSERT_TRUE(Linear(xn, w, y).ok());
        EXPECT_LT(MaxAbsDiff(y.f32().data(), want.data(), y.numel()), 1e-4);
        for (int64_t r : {int64_t{0}, n - 1}) {
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
  SetCpuIsa(CpuIsa::kAuto);
}

// QuantizeRowsQ8 (Precision::kFast's activations): each run of 32 values
// gets d = max |x| / 127, its largest value the code +-127, every value
// within d / 2 of q d, and an all-zero run d = 0 and zero codes.
TEST(LinearTest, Q8ActivationsRoundEachRunToItsOwnScale) {
  Tensor x = RandomTensor({3, 96}, 5);
  std::fill_n(x.f32().begin() + 32, 32, 0.0f);  // Row 0's second run.
  x.f32()[70] = -9.5f;                          // Row 0's third run's max.
  std::vector<int8_t> q(3 * 96);
  std::vector<float> d(3 * 3);
  quant_kernels::QuantizeRowsQ8(x.f32().data(), 3, 96, q.data(), d.data());
  for (int64_t run = 0; run < 9; ++run) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x.f32()[run * 32 + j]));
    }
    EXPECT_FLOAT_EQ(d[run], amax / 127) << "run " << run;
    int peak = 0;
    for (int j = 0; j < 32; ++j) {
      const int64_t i = run * 32 + j;
      EXPECT_LE(std::fabs(q[i] * d[run] - x.f32()[i]), d[run] / 2 * 1.0001f)
          << "value " << i;
      peak = std::max(peak, std::abs(int{q[i]}));
    }
    EXPECT_EQ(peak, amax > 0 ? 127 : 0) << "run " << run;
  }
  EXPECT_EQ(q[70], -127);
}

// f32 weights have no integer form: Precision::kFast leaves them exact.
TEST(LinearTest, FastPrecisionLeavesF32WeightsExact) {
  const Tensor x = RandomTensor({3, 64}, 1), w = RandomTensor({5, 64}, 2);
  Tensor exact = *Tensor::Host(DType::kF32, {3, 5});
  Tensor fast = *Tensor::Host(DType::kF32, {3, 5});
  ASSERT_TRUE(Linear(x, w, exact).ok());
  SetPrecision(Precision::kFast);
  ASSERT_TRUE(Linear(x, w, fast).ok());
  SetPrecision(Precision::kExact);
  EXPECT_EQ(std::vector<float>(fast.f32().begin(), fast.f32().end()),
            std::vector<float>(exact.f32().begin(), exact.f32().end()));
}

TEST(LinearTest, Accumulates) {
  Tensor x = RandomTensor({2, 10}, 3);
  Tensor w = RandomTensor({4, 10}, 4);
  Tensor y = *Tensor::Host(DType::kF32, {2, 4});
  for (float& v : y.f32()) v = 1.0f;
  ASSERT_TRUE(Linear(x, w, y, /*accumulate=*/true).ok());
  auto want = Reference(x, w);
  for (double& v : want) v += 1.0;
  EXPECT_LT(MaxAbsDiff(y.f32().data(), want.data(), 8), 1e-5);
}

TEST(LinearTest, RejectsMismatchedInnerDimension) {
  Tensor x = RandomTensor({2, 10}, 3);
  Tensor w = RandomTensor({4, 11}, 4);
  Tensor y = *Tensor::Host(DType::kF32, {2, 4});
  EXPECT_EQ(Linear(x, w, y).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardlm
