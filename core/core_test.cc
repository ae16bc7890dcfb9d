#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/log.h"
#include "core/max_abs_diff.h"
#include "core/secret.h"
#include "core/status.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

TEST(LogTest, OneLineWithThePrefixAndOneNewline) {
  ::testing::internal::CaptureStderr();
  Log("rank %d: %s", 3, "ready");
  LogLine("already ends\n");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "[shardlm] rank 3: ready\n[shardlm] already ends\n");
}

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

// The table's rows against ggml's block sizes (ggml-common.h, as the gguf
// package lists them in GGML_QUANT_SIZES).
TEST(DTypeTest, GgufBlockLayouts) {
  struct Row {
    uint32_t ggml;
    const char* name;
    int64_t elems, bytes;
  };
  for (const Row& r :
       {Row{2, "Q4_0", 32, 18}, Row{3, "Q4_1", 32, 20}, Row{6, "Q5_0", 32, 22},
        Row{7, "Q5_1", 32, 24}, Row{8, "Q8_0", 32, 34},
        Row{10, "Q2_K", 256, 84}, Row{11, "Q3_K", 256, 110},
        Row{12, "Q4_K", 256, 144}, Row{13, "Q5_K", 256, 176},
        Row{14, "Q6_K", 256, 210}, Row{20, "IQ4_NL", 32, 18},
        Row{23, "IQ4_XS", 256, 136}, Row{39, "MXFP4", 32, 17},
        Row{0, "F32", 1, 4}, Row{1, "F16", 1, 2}, Row{30, "BF16", 1, 2}}) {
    SCOPED_TRACE(r.name);
    absl::StatusOr<DType> t = DTypeFromGgml(r.ggml);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_STREQ(DTypeName(*t), r.name);
    EXPECT_EQ(BlockElems(*t), r.elems);
    EXPECT_EQ(BlockBytes(*t), r.bytes);
    EXPECT_EQ(Traits(*t).ggml_type, static_cast<int>(r.ggml));
    EXPECT_NE(Traits(*t).to_f32, nullptr);
  }
  EXPECT_EQ(*BytesFor(DType::kQ4_K, 512), 288);
  EXPECT_FALSE(BytesFor(DType::kQ6_K, 128).ok());  // Half a super-block.
}

TEST(DTypeTest, UnsupportedGgmlTypesAreNamed) {
  for (const auto& [t, name] :
       std::vector<std::pair<uint32_t, std::string>>{{16, "IQ2_XXS"},
                                                     {29, "IQ1_M"},
                                                     {34, "TQ1_0"},
                                                     {40, "NVFP4"},
                                                     {9, "Q8_1"},
                                                     {4, "unknown"},
                                                     {1000, "unknown"}}) {
    absl::StatusOr<DType> d = DTypeFromGgml(t);
    EXPECT_TRUE(
        testing_util::IsError(d, absl::StatusCode::kUnimplemented, name));
    EXPECT_NE(d.status().message().find(SupportedGgmlTypes()),
              std::string_view::npos);
  }
  EXPECT_NE(SupportedGgmlTypes().find("Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                                      "Q5_K, Q6_K, IQ4_NL, IQ4_XS"),
            std::string::npos);
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

// CRC-32C against its standard check value and a bit-at-a-time
// reference, on both paths, and continued over pieces.
TEST(Crc32cTest, MatchesTheReferenceOnBothPaths) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(check.data(), check.size()), 0xE3069283u);
  const auto bitwise = [](const std::string& s) {
    uint32_t c = ~0u;
    for (unsigned char b : s) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
    }
    return ~c;
  };
  std::string data;
  for (int i = 0; i < 1000; ++i) data += static_cast<char>((i * 131 + 7) % 251);
  for (size_t n : {0, 1, 7, 8, 9, 63, 1000}) {
    const std::string s = data.substr(0, n);
    EXPECT_EQ(Crc32c(s.data(), s.size()), bitwise(s)) << n;
    EXPECT_EQ(Crc32cPortable(s.data(), s.size()), bitwise(s)) << n;
    for (size_t cut = 0; cut <= n; cut += 5) {
      EXPECT_EQ(Crc32c(s.data() + cut, n - cut, Crc32c(s.data(), cut)),
                bitwise(s))
          << n << " cut at " << cut;
    }
  }
}

}  // namespace
}  // namespace shardlm
