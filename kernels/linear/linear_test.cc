#include "kernels/linear/linear.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/batch_invariance.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_isa_testing.h"
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
