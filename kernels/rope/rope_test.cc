#include "kernels/rope/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "testing/random_tensors.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

using testing_util::RandomTensor;

// Reference: rotate the pair (a, b) of dimension pair k by pos * theta^(-2k/d)
// in double precision.
std::vector<double> RopeReference(const Tensor& x,
                                  const std::vector<int32_t>& pos, double theta,
                                  RopeStyle style) {
  const int64_t n = x.dim(0), heads = x.dim(1), d = x.dim(2);
  std::vector<double> out(x.f32().begin(), x.f32().end());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = out.data() + (i * heads + h) * d;
      for (int64_t k = 0; k < d / 2; ++k) {
        const double angle = pos[i] * std::pow(theta, -2.0 * k / d);
        const int64_t a = style == RopeStyle::kAdjacentPairs ? 2 * k : k;
        const int64_t b =
            style == RopeStyle::kAdjacentPairs ? 2 * k + 1 : k + d / 2;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * std::cos(angle) - x1 * std::sin(angle);
        v[b] = x0 * std::sin(angle) + x1 * std::cos(angle);
      }
    }
  }
  return out;
}

TEST(RopeTest, BothStylesMatchReference) {
  const std::vector<int32_t> pos = {0, 1, 7, 4096, 100000};
  for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf}) {
    Tensor x = RandomTensor({5, 3, 64}, 7);
    const auto want = RopeReference(x, pos, 100000.0, style);
    ASSERT_TRUE(Rope(x, pos, 100000.0f, style).ok());
    EXPECT_LT(testing_util::MaxAbsDiff(x.f32().data(), want.data(), x.numel()),
              2e-5);
  }
}

// llama.cpp's converter permutes each head's rows so that adjacent-pair RoPE
// on the permuted vector equals rotate-half RoPE on the original: original
// dimension k pairs with k + d/2, permuted they sit at 2k and 2k + 1.
TEST(RopeTest, AdjacentPairsEqualRotateHalfUnderTheConverterPermutation) {
  const int64_t d = 16;
  Tensor x = RandomTensor({2, 1, d}, 9);
  Tensor permuted = *Tensor::Host(DType::kF32, {2, 1, d});
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < d / 2; ++k) {
      permuted.f32()[i * d + 2 * k] = x.f32()[i * d + k];
      permuted.f32()[i * d + 2 * k + 1] = x.f32()[i * d + k + d / 2];
    }
  }
  const std::vector<int32_t> pos = {3, 11};
  ASSERT_TRUE(Rope(x, pos, 10000.0f, RopeStyle::kRotateHalf).ok());
  ASSERT_TRUE(Rope(permuted, pos, 10000.0f, RopeStyle::kAdjacentPairs).ok());
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < d / 2; ++k) {
      EXPECT_FLOAT_EQ(permuted.f32()[i * d + 2 * k], x.f32()[i * d + k]);
      EXPECT_FLOAT_EQ(permuted.f32()[i * d + 2 * k + 1],
                      x.f32()[i * d + k + d / 2]);
    }
  }
}

TEST(RopeTest, RejectsMismatchedPositions) {
  Tensor x = RandomTensor({2, 1, 8}, 1);
  const std::vector<int32_t> pos = {0};
  EXPECT_TRUE(IsError(Rope(x, pos, 10000.0f, RopeStyle::kRotateHalf),
                      absl::StatusCode::kInvalidArgument,
                      "Rope: need one position per token"));
}

}  // namespace
}  // namespace shardlm
