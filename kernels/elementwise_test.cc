// Embedding, RMSNorm, SwiGLU and softmax against double-precision loops,
// on awkward sizes.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/softmax/softmax.h"
#include "kernels/swiglu/swiglu.h"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

using testing_util::MaxAbsDiff;
using testing_util::RandomTensor;
using testing_util::ZerosLike;

TEST(EmbeddingTest, GathersRowsOfItsVocabShard) {
  // This shard holds vocabulary ids [10, 17).
  Tensor table = RandomTensor({7, 769}, 1);
  const std::vector<int32_t> ids = {10, 16, 3, 12, 17};
  Tensor out = *Tensor::Host(DType::kF32, {5, 769});
  ASSERT_TRUE(Embedding(table, ids, 10, out).ok());
  for (int i = 0; i < 5; ++i) {
    const int row = ids[i] - 10;
    for (int j = 0; j < 769; ++j) {
      const float want =
          row >= 0 && row < 7 ? table.f32()[row * 769 + j] : 0.0f;
      ASSERT_EQ(out.f32()[i * 769 + j], want) << i << "," << j;
    }
  }
}

TEST(EmbeddingTest, RejectsWrongOutputShape) {
  Tensor table = RandomTensor({7, 8}, 1);
  Tensor out = *Tensor::Host(DType::kF32, {2, 9});
  const std::vector<int32_t> ids = {1, 2};
  EXPECT_EQ(Embedding(table, ids, 0, out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RmsNormTest, MatchesDoubleReference) {
  for (int64_t d : {1, 64, 769}) {
    Tensor x = RandomTensor({3, d}, 2, 3.0f);
    Tensor w = RandomTensor({d}, 3);
    Tensor out = ZerosLike(x);
    ASSERT_TRUE(RmsNorm(x, w, 1e-5f, out).ok());
    std::vector<double> want(3 * d);
    for (int i = 0; i < 3; ++i) {
      double ss = 0;
      for (int j = 0; j < d; ++j) ss += std::pow(x.f32()[i * d + j], 2);
      const double inv = 1 / std::sqrt(ss / d + 1e-5);
      for (int j = 0; j < d; ++j) {
        want[i * d + j] = x.f32()[i * d + j] * inv * w.f32()[j];
      }
    }
    EXPECT_LT(MaxAbsDiff(out.f32().data(), want.data(), 3 * d), 1e-5) << d;
    // In place gives the same.
    ASSERT_TRUE(RmsNorm(x, w, 1e-5f, x).ok());
    EXPECT_LT(MaxAbsDiff(x.f32().data(), want.data(), 3 * d), 1e-5);
  }
}

TEST(SwiGluTest, MatchesDoubleReference) {
  Tensor g = RandomTensor({5, 1537}, 4, 4.0f);
  Tensor u = RandomTensor({5, 1537}, 5);
  Tensor out = ZerosLike(g);
  ASSERT_TRUE(SwiGlu(g, u, out).ok());
  std::vector<double> want(g.numel());
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.f32()[i];
    want[i] = x / (1 + std::exp(-x)) * u.f32()[i];
  }
  EXPECT_LT(MaxAbsDiff(out.f32().data(), want.data(), g.numel()), 1e-5);
}

// GELU's tanh form (PyTorch's gelu approximate="tanh"), and GeGLU's
// output, within 1e-5 of the exact GELU (erf) where the two agree to 1e-3.
TEST(GeGluTest, MatchesDoubleReference) {
  Tensor g = RandomTensor({5, 1537}, 6, 6.0f);
  Tensor u = RandomTensor({5, 1537}, 7);
  Tensor out = ZerosLike(g);
  ASSERT_TRUE(GeGlu(g, u, out).ok());
  std::vector<double> want(g.numel());
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.f32()[i];
    const double t =
        std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
    want[i] = 0.5 * x * (1 + t) * u.f32()[i];
    const double exact = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    ASSERT_NEAR(0.5 * x * (1 + t), exact, 1e-3) << x;
  }
  EXPECT_LT(MaxAbsDiff(out.f32().data(), want.data(), g.numel()), 1e-5);
  Tensor bad = RandomTensor({5, 1536}, 8);
  EXPECT_FALSE(GeGlu(g, bad, out).ok());
}

TEST(SoftmaxTest, StableAndNormalized) {
  std::vector<float> x = {1000.0f, 1001.0f, -INFINITY, 999.0f};
  SoftmaxInPlace(x.data(), 4);
  const double z = std::exp(-1.0) + 1 + std::exp(-2.0);
  EXPECT_NEAR(x[0], std::exp(-1.0) / z, 1e-6);
  EXPECT_NEAR(x[1], 1 / z, 1e-6);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_NEAR(x[3], std::exp(-2.0) / z, 1e-6);
}

}  // namespace
}  // namespace shardlm

#include "kernels/add/add.h"

namespace shardlm {
namespace {

TEST(AddTest, AddsInPlaceAndChecksShapes) {
  Tensor x = testing_util::RandomTensor({3, 769}, 1);
  Tensor y = testing_util::RandomTensor({3, 769}, 2);
  std::vector<float> want(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) want[i] = x.f32()[i] + y.f32()[i];
  ASSERT_TRUE(AddInPlace(x, y).ok());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.f32()[i], want[i]);
  Tensor z = testing_util::RandomTensor({3, 768}, 2);
  EXPECT_FALSE(AddInPlace(x, z).ok());
}

TEST(AddTest, AddsBiasToEveryRow) {
  Tensor x = testing_util::RandomTensor({3, 37}, 1);
  Tensor bias = testing_util::RandomTensor({37}, 2);
  std::vector<float> want(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    want[i] = x.f32()[i] + bias.f32()[i % 37];
  }
  ASSERT_TRUE(AddBias(x, bias).ok());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.f32()[i], want[i]);
  Tensor wrong = testing_util::RandomTensor({36}, 2);
  EXPECT_FALSE(AddBias(x, wrong).ok());
  Tensor flat = testing_util::RandomTensor({37}, 3);
  EXPECT_FALSE(AddBias(flat, bias).ok());
}

}  // namespace
}  // namespace shardlm
