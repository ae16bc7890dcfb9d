#include "model/dequantize.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

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

// OCP FP8 e4m3fn by hand: 1.0 (0x38), the largest normal 448 (0x7e), the
// smallest subnormal 2^-9 (0x01), a subnormal 7 x 2^-9 (0x07), -1.5
// (0xbc), the smallest normal 2^-6 (0x08), NaN (0x7f, 0xff), zeros. The
// numpy reference's table equals torch.float8_e4m3fn's for all 256 codes
// (docs/testing.md).
TEST(DequantizeTest, F8E4M3) {
  const std::vector<uint8_t> codes = {0x38, 0x7e, 0x01, 0x07, 0xbc,
                                      0x08, 0x7f, 0xff, 0x00, 0x80};
  float out[10];
  ASSERT_TRUE(
      DequantizeRow(DType::kF8E4M3, codes.data(), codes.size(), out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 448.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -9));
  EXPECT_EQ(out[3], std::ldexp(7.0f, -9));
  EXPECT_EQ(out[4], -1.5f);
  EXPECT_EQ(out[5], std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(out[6]) && std::isnan(out[7]));
  EXPECT_EQ(out[8], 0.0f);
  EXPECT_TRUE(out[9] == 0.0f && std::signbit(out[9]));
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
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(IsError(DequantizeRows(info, data, 2, 4), kInvalid,
                      "rows [2, 4) of tensor 'w' with 3 rows"));
  EXPECT_TRUE(
      IsError(DequantizeRows(info, absl::MakeSpan(data).subspan(1), 0, 1),
              kInvalid, "tensor 'w' has 11 bytes, expected 12"));
}

TEST(DequantizeTest, RejectsPartialBlocks) {
  uint8_t zeros[64] = {};
  float out[64];
  EXPECT_TRUE(IsError(DequantizeRow(DType::kQ4_1, zeros, 16, out),
                      absl::StatusCode::kInvalidArgument,
                      "16 values are not whole"));
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// The f32 bits of `t` (comparing bits: NaNs in random data compare equal).
std::vector<uint32_t> Bits(const Tensor& t) {
  std::vector<uint32_t> bits(t.numel());
  std::memcpy(bits.data(), t.raw(), bits.size() * sizeof(uint32_t));
  return bits;
}

// Every dtype, a [4, 160] tensor (5 blocks of 32 a row) of random bytes
// (finite scales), sliced to rows [1, 3) x blocks [1, 3): the slice must be
// that part of the whole, and stay so when every byte outside it is
// flipped (a value read from outside would change).
TEST(DequantizeTest, SliceReadsOnlyItsBlocks) {
  constexpr int64_t kRows = 4, kCols = 160;
  constexpr int64_t kRow0 = 1, kRow1 = 3, kCol0 = 32, kCol1 = 96;
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kF16,
                      DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t row_bytes = *BytesFor(dtype, kCols);
    const int64_t skip = *BytesFor(dtype, kCol0);
    const int64_t width = *BytesFor(dtype, kCol1 - kCol0);
    std::mt19937 rng(static_cast<int>(dtype));
    std::vector<uint8_t> data(kRows * row_bytes);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    // Every scale (and Q4_1 minimum) 0.5: finite, and the same in every
    // block, so that only the poisoned bytes show a scale read from
    // another block.
    if (IsQuantized(dtype)) {
      const int64_t block = BlockBytes(dtype);
      const int scales = dtype == DType::kQ4_1 ? 2 : 1;
      for (int64_t b = 0; b < static_cast<int64_t>(data.size()); b += block) {
        for (int h = 0; h < scales; ++h) {
          const uint16_t d = FloatToFp16(0.5f);
          std::memcpy(&data[b + 2 * h], &d, 2);
        }
      }
    }
    const TensorInfo info{.name = "w",
                          .dtype = dtype,
                          .shape = {kRows, kCols},
                          .bytes = data.size()};
    std::vector<uint8_t> poisoned = data;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t i = 0; i < row_bytes; ++i) {
        const bool inside =
            r >= kRow0 && r < kRow1 && i >= skip && i < skip + width;
        if (!inside) poisoned[r * row_bytes + i] ^= 0xFF;
      }
    }
    auto whole = DequantizeRows(info, data, 0, kRows);
    ASSERT_TRUE(whole.ok()) << whole.status();
    std::vector<uint32_t> want;
    const std::vector<uint32_t> all = Bits(*whole);
    for (int64_t r = kRow0; r < kRow1; ++r) {
      want.insert(want.end(), all.begin() + r * kCols + kCol0,
                  all.begin() + r * kCols + kCol1);
    }
    for (const auto* bytes : {&data, &poisoned}) {
      SCOPED_TRACE(bytes == &data ? "clean" : "poisoned outside the slice");
      auto slice = DequantizeSlice(info, *bytes, kRow0, kRow1, kCol0, kCol1);
      ASSERT_TRUE(slice.ok()) << slice.status();
      ASSERT_EQ(slice->shape(), (Shape{kRow1 - kRow0, kCol1 - kCol0}));
      EXPECT_EQ(Bits(*slice), want);
      auto copy = CopySlice(info, *bytes, kRow0, kRow1, kCol0, kCol1);
      ASSERT_TRUE(copy.ok()) << copy.status();
      ASSERT_EQ(copy->dtype(), dtype);
      ASSERT_EQ(copy->shape(), (Shape{kRow1 - kRow0, kCol1 - kCol0}));
      for (int64_t r = kRow0; r < kRow1; ++r) {
        EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(copy->raw()) +
                                  (r - kRow0) * width,
                              data.data() + r * row_bytes + skip, width),
                  0)
            << "row " << r;
      }
    }
  }
  const TensorInfo q8{.name = "w",
                      .dtype = DType::kQ8_0,
                      .shape = {2, 96},
                      .bytes = 2 * 3 * 34};
  std::vector<uint8_t> zeros(q8.bytes);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(IsError(DequantizeSlice(q8, zeros, 0, 1, 16, 48), kInvalid,
                      "slice rows [0, 1) cols [16, 48)"));  // Mid-block.
  EXPECT_TRUE(IsError(DequantizeSlice(q8, zeros, 0, 3, 0, 32), kInvalid,
                      "slice rows [0, 3) cols [0, 32)"));  // Row 3 of 2.
}

// Pages of memory of which some can be made unreadable: a read there is
// a crash, so a function that returns normally read none of them.
class GuardedBytes {
 public:
  explicit GuardedBytes(size_t pages)
      : size_(pages * PageSize()),
        base_(static_cast<uint8_t*>(mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {
    EXPECT_NE(base_, MAP_FAILED);
  }
  ~GuardedBytes() { munmap(base_, size_); }
  static size_t PageSize() { return sysconf(_SC_PAGESIZE); }
  absl::Span<uint8_t> bytes() { return {base_, size_}; }
  // [offset, offset + n): whole pages.
  void Forbid(size_t offset, size_t n) {
    ASSERT_EQ(offset % PageSize(), 0u);
    ASSERT_EQ(n % PageSize(), 0u);
    ASSERT_EQ(mprotect(base_ + offset, n, PROT_NONE), 0);
  }

 private:
  size_t size_;
  uint8_t* base_;
};

// A Q8_0 tensor [3, 3 parts] whose parts are each a whole number of pages
// (2048 blocks of 34 bytes are 17 pages of 4 KiB): every byte outside the
// slice rows [1, 3) x part 1, or outside the rows of DequantizeRows, is
// unreadable. Value (r, c) is 0.5 * ((r * 7 + c) % 255 - 127).
TEST(DequantizeTest, SliceAndRowsReadNothingOutsideThem) {
  const size_t page = GuardedBytes::PageSize();
  const int64_t blocks = static_cast<int64_t>(page / std::gcd(page, 34));
  const int64_t part = blocks * 32, part_bytes = blocks * 34;
  const int64_t cols = 3 * part, row_bytes = 3 * part_bytes;
  GuardedBytes mem(3 * row_bytes / page);
  absl::Span<uint8_t> data = mem.bytes();
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      uint8_t* block = data.data() + r * row_bytes + b * 34;
      const uint16_t d = FloatToFp16(0.5f);
      std::memcpy(block, &d, 2);
      for (int j = 0; j < 32; ++j) {
        block[2 + j] = static_cast<uint8_t>((r * 7 + b * 32 + j) % 255 - 127);
      }
    }
  }
  const auto value = [](int64_t r, int64_t c) {
    return 0.5f * static_cast<float>((r * 7 + c) % 255 - 127);
  };
  const TensorInfo info{.name = "w",
                        .dtype = DType::kQ8_0,
                        .shape = {3, cols},
                        .bytes = data.size()};
  // Row 0 whole, and parts 0 and 2 of rows 1 and 2.
  mem.Forbid(0, row_bytes);
  for (int64_t r = 1; r < 3; ++r) {
    mem.Forbid(r * row_bytes, part_bytes);
    mem.Forbid(r * row_bytes + 2 * part_bytes, part_bytes);
  }
  auto slice = DequantizeSlice(info, data, 1, 3, part, 2 * part);
  ASSERT_TRUE(slice.ok()) << slice.status();
  auto copy = CopySlice(info, data, 1, 3, part, 2 * part);
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (int64_t r = 1; r < 3; ++r) {
    for (int64_t c = 0; c < part; ++c) {
      ASSERT_EQ(slice->f32()[(r - 1) * part + c], value(r, part + c))
          << r << ", " << c;
    }
    EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(copy->raw()) +
                              (r - 1) * part_bytes,
                          data.data() + r * row_bytes + part_bytes, part_bytes),
              0);
  }
  // Rows: everything of rows 0 and 2 unreadable, row 1 readable.
  ASSERT_EQ(mprotect(data.data() + row_bytes, row_bytes, PROT_READ), 0);
  mem.Forbid(2 * row_bytes, row_bytes);
  auto row = DequantizeRows(info, data, 1, 2);
  ASSERT_TRUE(row.ok()) << row.status();
  for (int64_t c = 0; c < cols; ++c) {
    ASSERT_EQ(row->f32()[c], value(1, c)) << c;
  }
}

}  // namespace
}  // namespace shardlm
