#include "kernels/linear/linear.h"

#include <vector>

#include "gtest/gtest.h"
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
