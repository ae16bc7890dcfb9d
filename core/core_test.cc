#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/max_abs_diff.h"
#include "core/secret.h"
#include "core/status.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(HalfTest, Fp16RoundTripsExactValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f,
                  5.9604645e-08f /* smallest subnormal */, 0.333251953125f}) {
    EXPECT_EQ(Fp16ToFloat(FloatToFp16(v)), v) << v;
  }
}

TEST(HalfTest, Fp16RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(Fp16ToFloat(FloatToFp16(70000.0f))));
  // Exhaustive: every finite half converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToFp16(Fp16ToFloat(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(HalfTest, Bf16) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.5f)), 1.5f);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: to even.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
}

TEST(DTypeTest, BlockSizes) {
  EXPECT_EQ(*BytesFor(DType::kQ4_1, 64), 40);
  EXPECT_EQ(*BytesFor(DType::kQ8_0, 32), 34);
  EXPECT_EQ(*BytesFor(DType::kQ4_0, 32), 18);
  EXPECT_EQ(*BytesFor(DType::kBF16, 3), 6);
  EXPECT_FALSE(BytesFor(DType::kQ4_0, 33).ok());
  EXPECT_FALSE(BytesFor(DType::kF32, -1).ok());
  EXPECT_FALSE(BytesFor(DType::kQ8_0, INT64_MAX / 32 * 32).ok());
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, HostTensorIsZeroedAndSized) {
  auto t = Tensor::Host(DType::kF32, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->numel(), 15);
  EXPECT_EQ(t->bytes(), 60u);
  for (float v : t->f32()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(t->DebugString(), "F32[3, 5]");
}

TEST(TensorTest, RejectsBadShapes) {
  EXPECT_FALSE(Tensor::Host(DType::kQ4_1, {2, 33}).ok());
  EXPECT_FALSE(Tensor::Host(DType::kF32, {-1}).ok());
  EXPECT_FALSE(Tensor::Host(DType::kF32, {1 << 30, 1 << 30}).ok());
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

TEST(TensorTest, ReshapeAndRowsShareMemory) {
  Tensor t = *Tensor::Host(DType::kF32, {4, 6});
  for (int i = 0; i < 24; ++i) t.f32()[i] = i;
  Tensor r = *t.Reshaped({4, 2, 3});
  EXPECT_EQ(r.raw(), t.raw());
  EXPECT_FALSE(t.Reshaped({5, 5}).ok());
  Tensor rows = *t.Rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.f32()[0], 6.0f);
  EXPECT_EQ(rows.bytes(), 48u);
  EXPECT_FALSE(t.Rows(3, 5).ok());
}

TEST(MaxAbsDiffTest, NanAndInfinityFailEveryBound) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::nanf("");
  const std::vector<float> ref = {1.0f, -2.0f, 3.5f};
  EXPECT_EQ(MaxAbsDiff(ref, ref), 0.0);
  EXPECT_DOUBLE_EQ(MaxAbsDiff(ref, std::vector<double>{1.0, -2.0, 3.0}), 0.5);
  // A NaN anywhere, on either side, even after a large finite difference.
  EXPECT_EQ(MaxAbsDiff(ref, std::vector<float>{1.0f, nan, 3.5f}), inf);
  EXPECT_EQ(MaxAbsDiff(std::vector<float>{nan, nan, nan}, ref), inf);
  EXPECT_EQ(MaxAbsDiff(std::vector<float>{100.0f, -2.0f, nan}, ref), inf);
  // Infinity against a finite value, or against the other infinity.
  EXPECT_EQ(MaxAbsDiff(ref, std::vector<float>{inf, -2.0f, 3.5f}), inf);
  EXPECT_EQ(MaxAbsDiff(std::vector<float>{inf}, std::vector<float>{-inf}), inf);
  // Equal infinities are equal values.
  EXPECT_EQ(
      MaxAbsDiff(std::vector<float>{inf, -inf}, std::vector<float>{inf, -inf}),
      0.0);
  // Different lengths: nothing to compare element-wise.
  EXPECT_EQ(MaxAbsDiff(ref, std::vector<float>{1.0f, -2.0f}), inf);
  // What the old max() loops did with a NaN: kept the earlier error.
  double old = 0;
  for (float v : {nan, nan}) old = std::max<double>(old, std::abs(v - 1.0f));
  EXPECT_EQ(old, 0.0);
}

TEST(SecretTest, ConstantTimeEqualsComparesEveryByte) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "xbc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0c", 3), "a"));
}

TEST(SecretTest, RandomHexTokensAreHexAndDiffer) {
  auto a = RandomHexToken(32), b = RandomHexToken(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos) << *a;
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace shardlm
