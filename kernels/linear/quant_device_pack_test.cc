// The device layout of Q8_0 / Q4_0 weights (quant_device_layout.h) on the
// CPU: repacked random GGUF matrices dequantize exactly as the GGUF
// dequantizer (model/dequantize.h) does, sizes and offsets by hand,
// alignment, awkward shapes, and the CUDA entry points' argument checks
// (device tensors here are views of host memory marked kDevice: only the
// checks run, nothing is launched).
#include "kernels/linear/quant_device_pack.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "model/dequantize.h"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

namespace ql = quant_layout;
using testing_util::RandomQuantized;

class PackedLayoutTest : public ::testing::TestWithParam<DType> {};

TEST_P(PackedLayoutTest, DequantizesExactlyAsTheGgufDequantizer) {
  const DType t = GetParam();
  uint32_t seed = 1;
  for (const int64_t out : {1, 3, 7, 16, 33}) {
    for (const int64_t in : {32, 96, 4096}) {
      const Tensor gguf = RandomQuantized(t, out, in, seed++);
      absl::StatusOr<Tensor> packed = PackQuantized(gguf);
      ASSERT_TRUE(packed.ok()) << packed.status();
      EXPECT_EQ(packed->dtype(), t);
      EXPECT_EQ(packed->shape(), gguf.shape());
      ASSERT_EQ(packed->bytes(), gguf.bytes());
      const int64_t row_bytes = gguf.bytes() / out;
      std::vector<float> want(in), got(in);
      for (int64_t r = 0; r < out; ++r) {
        ASSERT_TRUE(DequantizeRow(
                        t,
                        static_cast<const uint8_t*>(gguf.raw()) + r * row_bytes,
                        in, want.data())
                        .ok());
        std::fill(got.begin(), got.end(), -999.0f);
        ASSERT_TRUE(DequantizePacked(t,
                                     static_cast<const uint8_t*>(packed->raw()),
                                     out, in, r, got.data())
                        .ok());
        for (int64_t i = 0; i < in; ++i) {
          ASSERT_EQ(got[i], want[i]) << DTypeName(t) << " [" << out << ", "
                                     << in << "] row " << r << " value " << i;
        }
      }
    }
  }
}

TEST_P(PackedLayoutTest, SizesAndOffsetsByHand) {
  const DType t = GetParam();
  const ql::QuantFormat f = *DeviceQuantFormat(t);
  const bool q8 = t == DType::kQ8_0;
  // [3, 96]: 3 blocks a row; codes 32 (Q8_0) or 16 (Q4_0) bytes a block.
  const int64_t code = q8 ? 32 : 16;
  EXPECT_EQ(ql::QuantRowBytes(f, 96), 3 * code);
  EXPECT_EQ(ql::UnitsPerRow(f, 96), 3 * code / 16);
  EXPECT_EQ(ql::ScalesOffset(f, 3, 96), 9 * code);
  EXPECT_EQ(ql::PackedBytes(f, 3, 96), 9 * code + 9 * 2);
  EXPECT_EQ(*PackedQuantBytes(t, 3, 96), 9 * (q8 ? 34 : 18));  // GGUF's.
  EXPECT_EQ(ql::QuantOffset(f, 96, 2, 1), 2 * 3 * code + code);
  EXPECT_EQ(ql::ScaleOffset(f, 3, 96, 2, 1), 9 * code + (2 * 3 + 1) * 2);
  // Units: Q8_0 two per block, Q4_0 one.
  EXPECT_EQ(ql::UnitBlock(f, 5), q8 ? 2 : 5);
  EXPECT_EQ(ql::UnitFirstElem(f, 5), q8 ? 80 : 160);
  // Bytes per weight: 1.0625 and 0.5625 for a 4096 x 4096 matrix.
  EXPECT_EQ(*PackedQuantBytes(t, 4096, 4096),
            4096 * 4096 / 32 * (q8 ? 34 : 18));
}

TEST_P(PackedLayoutTest, RowsAndScalesAre16ByteAligned) {
  const ql::QuantFormat f = *DeviceQuantFormat(GetParam());
  for (const int64_t out : {1, 3, 7, 4097}) {
    for (const int64_t in : {32, 64, 96, 4096, 14336}) {
      for (const int64_t r : {int64_t{0}, out / 2, out - 1}) {
        EXPECT_EQ(ql::QuantOffset(f, in, r, 0) % ql::kRowAlign, 0)
            << out << " x " << in << " row " << r;
      }
      EXPECT_EQ(ql::ScalesOffset(f, out, in) % ql::kRowAlign, 0);
      EXPECT_EQ(ql::QuantRowBytes(f, in) % ql::kUnitBytes, 0);
    }
  }
  // The packed host tensor itself (what is copied up) is aligned.
  const Tensor packed = *PackQuantized(RandomQuantized(GetParam(), 3, 96, 9));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(packed.raw()) % 16, 0u);
}

TEST_P(PackedLayoutTest, RefusesRowsThatAreNotWholeBlocks) {
  const DType t = GetParam();
  // 48 values a row: 3 blocks in all for [2, 48], but not whole per row
  // (no Tensor of that shape can be made either).
  EXPECT_FALSE(Tensor::Host(t, {2, 48}).ok());
  const absl::Status s = PackedQuantBytes(t, 2, 48).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("in = 48"), std::string::npos) << s;
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s;
  EXPECT_FALSE(PackedQuantBytes(t, 0, 32).ok());
  EXPECT_FALSE(PackedQuantBytes(t, 1, 0).ok());
  std::vector<float> row(32);
  const Tensor one = *PackQuantized(RandomQuantized(t, 1, 32, 3));
  EXPECT_FALSE(DequantizePacked(t, static_cast<const uint8_t*>(one.raw()), 1,
                                32, 1, row.data())
                   .ok());
}

// The kernels' conversion-free decoding (DecodeUnit) against UnitCode for
// every byte value in every position of a unit (the host build of the same
// arithmetic; the GPU's __byte_perm is checked by the cross-backend test).
TEST_P(PackedLayoutTest, DecodeUnitIsExactForEveryByte) {
  const ql::QuantFormat f = *DeviceQuantFormat(GetParam());
  for (int v = 0; v < 256; ++v) {
    for (int pos = 0; pos < 16; ++pos) {
      uint8_t codes[16];
      for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(v + 37 * i);
      codes[pos] = static_cast<uint8_t>(v);
      uint32_t words[4];
      std::memcpy(words, codes, sizeof words);
      float got[32];
      ql::DecodeUnit(f, words[0], words[1], words[2], words[3], got);
      for (int e = 0; e < ql::UnitElems(f); ++e) {
        ASSERT_EQ(got[e], static_cast<float>(ql::UnitCode(f, codes, e)))
            << "byte " << v << " at " << pos << ", value " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PackedLayoutTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(DeviceQuantFormatTest, OtherFormatsHaveNoDeviceLayout) {
  for (const DType t :
       {DType::kQ4_1, DType::kQ4_K, DType::kQ6_K, DType::kF32, DType::kBF16}) {
    EXPECT_FALSE(HasDeviceQuantLayout(t)) << DTypeName(t);
    const absl::Status s = DeviceQuantFormat(t).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(DTypeName(t)), std::string::npos) << s;
  }
  EXPECT_FALSE(PackQuantized(RandomQuantized(DType::kQ4_1, 2, 64, 1)).ok());
}

TEST(DequantScratchTest, CappedAndChunked) {
  EXPECT_EQ(DequantScratchBytes(0), 0);
  EXPECT_EQ(DequantScratchBytes(96 * 3), 2 * 96 * 3);
  // Llama-8B's LM head (128256 x 4096) fits 64 MiB of bf16 in chunks.
  EXPECT_EQ(DequantScratchBytes(int64_t{128256} * 4096), int64_t{64} << 20);
  EXPECT_EQ(DequantChunkRows(128256, 4096, kDequantScratchMaxElems), 8192);
  EXPECT_EQ(DequantChunkRows(3, 96, 96 * 3), 3);
  EXPECT_EQ(DequantChunkRows(3, 96, 10), 1);  // At least one row.
}

// Device-marked views over host memory: the checks only.
struct Args {
  std::vector<uint8_t> wmem, xmem, ymem;
  Tensor w, x, y;
};

Args MakeArgs(DType wt, int64_t out, int64_t in, int64_t n, DType yt,
              int64_t x_offset = 0) {
  Args a;
  a.wmem.resize(*BytesFor(wt, out * in) + 16);
  a.xmem.resize(n * in * 2 + 32);
  a.ymem.resize(n * out * 4 + 16);
  const auto align = [](std::vector<uint8_t>& v) {
    uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<uint8_t*>((p + 15) / 16 * 16);
  };
  a.w = *Tensor::View(wt, {out, in}, align(a.wmem), MemoryType::kDevice);
  a.x = *Tensor::View(DType::kBF16, {n, in}, align(a.xmem) + x_offset,
                      MemoryType::kDevice);
  a.y = *Tensor::View(yt, {n, out}, align(a.ymem), MemoryType::kDevice);
  return a;
}

TEST(QuantGemvArgsTest, AcceptsOneToEightRowsOfBf16) {
  for (const DType wt : {DType::kQ8_0, DType::kQ4_0}) {
    for (const DType yt : {DType::kF32, DType::kBF16}) {
      for (int64_t n = 1; n <= kQuantGemvMaxRows; ++n) {
        Args a = MakeArgs(wt, 3, 96, n, yt);
        EXPECT_TRUE(CheckQuantGemvArgs(a.x, a.w, a.y).ok()) << n;
      }
    }
  }
}

TEST(QuantGemvArgsTest, RefusesWhatTheKernelCannotTake) {
  const auto message = [](const Args& a) {
    const absl::Status s = CheckQuantGemvArgs(a.x, a.w, a.y);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  // Nine rows: the GEMV's limit, named.
  EXPECT_NE(
      message(MakeArgs(DType::kQ8_0, 3, 96, 9, DType::kF32)).find("9 rows"),
      std::string::npos);
  // A weight type without a device layout.
  EXPECT_NE(message(MakeArgs(DType::kQ4_1, 3, 96, 1, DType::kF32))
                .find("Q8_0 or Q4_0"),
            std::string::npos);
  // y of the wrong width and of i32.
  {
    Args a = MakeArgs(DType::kQ8_0, 3, 96, 2, DType::kF32);
    a.y = *Tensor::View(DType::kF32, {2, 4}, a.y.raw(), MemoryType::kDevice);
    EXPECT_NE(message(a).find("y is"), std::string::npos);
    a.y = *Tensor::View(DType::kI32, {2, 3}, a.y.raw(), MemoryType::kDevice);
    EXPECT_NE(message(a).find("y is"), std::string::npos);
  }
  // x of f32, of another width, in host memory, misaligned.
  {
    Args a = MakeArgs(DType::kQ4_0, 3, 96, 2, DType::kF32);
    a.x = *Tensor::View(DType::kF32, {2, 96}, a.x.raw(), MemoryType::kDevice);
    EXPECT_NE(message(a).find("x is"), std::string::npos);
    a.x = *Tensor::View(DType::kBF16, {2, 64}, a.x.raw(), MemoryType::kDevice);
    EXPECT_NE(message(a).find("x is"), std::string::npos);
    a.x = *Tensor::View(DType::kBF16, {2, 96}, a.x.raw(), MemoryType::kHost);
    EXPECT_NE(message(a).find("host memory"), std::string::npos);
  }
  EXPECT_NE(
      message(MakeArgs(DType::kQ8_0, 3, 96, 1, DType::kF32, 2)).find("aligned"),
      std::string::npos);
  // w in host memory; w whose bytes are not its layout's (a view cut to
  // other rows than it holds cannot be told apart; the tensor's own size
  // can).
  {
    Args a = MakeArgs(DType::kQ8_0, 3, 96, 1, DType::kF32);
    a.w = *Tensor::View(DType::kQ8_0, {3, 96}, a.w.raw(), MemoryType::kHost);
    EXPECT_NE(message(a).find("host memory"), std::string::npos);
  }
}

TEST(DequantizePackedArgsTest, RowsAndDestination) {
  Args a = MakeArgs(DType::kQ4_0, 7, 64, 1, DType::kF32);
  std::vector<uint8_t> mem(7 * 64 * 2 + 16);
  auto* base = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(mem.data()) + 15) / 16 * 16);
  const Tensor dst3 =
      *Tensor::View(DType::kBF16, {3, 64}, base, MemoryType::kDevice);
  EXPECT_TRUE(CheckDequantizePackedArgs(a.w, 2, 5, dst3).ok());
  EXPECT_FALSE(CheckDequantizePackedArgs(a.w, 5, 8, dst3).ok());  // Past out.
  EXPECT_FALSE(CheckDequantizePackedArgs(a.w, 3, 2, dst3).ok());
  EXPECT_FALSE(CheckDequantizePackedArgs(a.w, 0, 2, dst3).ok());  // 2 != 3.
  const Tensor f32 =
      *Tensor::View(DType::kF32, {3, 64}, base, MemoryType::kDevice);
  EXPECT_FALSE(CheckDequantizePackedArgs(a.w, 2, 5, f32).ok());
  const Tensor odd =
      *Tensor::View(DType::kBF16, {3, 64}, base + 2, MemoryType::kDevice);
  EXPECT_FALSE(CheckDequantizePackedArgs(a.w, 2, 5, odd).ok());
}

}  // namespace
}  // namespace shardlm
