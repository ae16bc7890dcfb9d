#include "model/dequantize.h"

#include <cstring>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

void PutU16(std::vector<uint8_t>& v, uint16_t x) {
  v.push_back(x & 0xff);
  v.push_back(x >> 8);
}

// Values are written by hand from the GGUF block layouts (DESIGN.md §10):
// nibble j of a Q4 block is the low nibble of byte j for j < 16 and the high
// nibble of byte j - 16 otherwise.
TEST(DequantizeTest, Q4_1) {
  std::vector<uint8_t> block;
  PutU16(block, FloatToFp16(0.5f));   // d
  PutU16(block, FloatToFp16(-1.0f));  // m
  for (int j = 0; j < 16; ++j) block.push_back((15 - j) << 4 | j);
  float out[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ4_1, block.data(), 32, out).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[16 + j], 0.5f * (15 - j) - 1.0f);
  }
}

TEST(DequantizeTest, Q4_0) {
  std::vector<uint8_t> block;
  PutU16(block, FloatToFp16(2.0f));
  for (int j = 0; j < 16; ++j) block.push_back(0x80 | j);
  float out[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ4_0, block.data(), 32, out).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8));
    EXPECT_EQ(out[16 + j], 0.0f);
  }
}

TEST(DequantizeTest, Q8_0TwoBlocks) {
  std::vector<uint8_t> data;
  for (float d : {0.25f, -3.0f}) {
    PutU16(data, FloatToFp16(d));
    for (int j = 0; j < 32; ++j) data.push_back(static_cast<uint8_t>(j - 16));
  }
  float out[64];
  ASSERT_TRUE(DequantizeRow(DType::kQ8_0, data.data(), 64, out).ok());
  EXPECT_EQ(out[0], 0.25f * -16);
  EXPECT_EQ(out[31], 0.25f * 15);
  EXPECT_EQ(out[32], -3.0f * -16);
  EXPECT_EQ(out[63], -3.0f * 15);
}

TEST(DequantizeTest, RowsOfA2DTensor) {
  // 3 rows of 2 bf16 values: row r holds (r, -r).
  std::vector<uint8_t> data;
  for (int r = 0; r < 3; ++r) {
    PutU16(data, FloatToBf16(static_cast<float>(r)));
    PutU16(data, FloatToBf16(static_cast<float>(-r)));
  }
  TensorInfo info{.name = "w",
                  .dtype = DType::kBF16,
                  .shape = {3, 2},
                  .bytes = data.size()};
  auto t = DequantizeRows(info, data, 1, 3);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{2, 2}));
  EXPECT_EQ(t->f32()[0], 1.0f);
  EXPECT_EQ(t->f32()[3], -2.0f);
  EXPECT_FALSE(DequantizeRows(info, data, 2, 4).ok());
  EXPECT_FALSE(
      DequantizeRows(info, absl::MakeSpan(data).subspan(1), 0, 1).ok());
}

TEST(DequantizeTest, RejectsPartialBlocks) {
  uint8_t zeros[64] = {};
  float out[64];
  EXPECT_FALSE(DequantizeRow(DType::kQ4_1, zeros, 16, out).ok());
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// A Q8_0 tensor [2, 96] (3 blocks a row) where value (r, c) = r * 100 + c
// exactly (scale 1); a column slice must equal the same part of the whole.
TEST(DequantizeTest, SliceReadsOnlyItsBlocks) {
  std::vector<uint8_t> data;
  for (int r = 0; r < 2; ++r) {
    for (int b = 0; b < 3; ++b) {
      PutU16(data, FloatToFp16(1.0f));
      for (int j = 0; j < 32; ++j) {
        data.push_back(static_cast<uint8_t>((r * 50 + b * 32 + j) % 128));
      }
    }
  }
  TensorInfo info{.name = "w",
                  .dtype = DType::kQ8_0,
                  .shape = {2, 96},
                  .bytes = data.size()};
  auto whole = DequantizeRows(info, data, 0, 2);
  auto slice = DequantizeSlice(info, data, 1, 2, 32, 96);
  ASSERT_TRUE(whole.ok() && slice.ok());
  ASSERT_EQ(slice->shape(), (Shape{1, 64}));
  for (int c = 0; c < 64; ++c) {
    EXPECT_EQ(slice->f32()[c], whole->f32()[96 + 32 + c]);
  }
  EXPECT_FALSE(DequantizeSlice(info, data, 0, 1, 16, 48).ok());  // Mid-block.
  EXPECT_FALSE(DequantizeSlice(info, data, 0, 3, 0, 32).ok());
}

}  // namespace
}  // namespace shardlm
