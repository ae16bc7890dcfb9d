#include "kernels/attention/cuda_attention_layout.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

std::vector<int32_t> Part(const CudaAttentionLayout& l, int64_t begin,
                          int64_t count) {
  return {l.host.begin() + begin, l.host.begin() + begin + count};
}

// Two sequences (a prefill of 18 tokens after 3 cached, and one decode
// token), by hand: slots, -1-padded tables, tiles of at most 16 tokens.
TEST(CudaAttentionLayoutTest, SlotsTablesAndTilesByHand) {
  std::vector<int32_t> positions, token_seq;
  for (int32_t p = 3; p < 21; ++p) {
    positions.push_back(p);
    token_seq.push_back(0);
  }
  positions.push_back(40);
  token_seq.push_back(1);
  const std::vector<int32_t> t0 = {7, 2}, t1 = {0, 1, 5};
  AttentionBatch batch{.positions = positions, .token_seq = token_seq};
  batch.block_tables = {t0, t1};
  ASSERT_OK_AND_ASSIGN(CudaAttentionLayout l,
                       MakeCudaAttentionLayout(batch, /*block_size=*/16,
                                               /*num_blocks=*/8,
                                               /*device_blocks=*/8,
                                               /*tile=*/16));
  EXPECT_EQ(l.n, 19);
  EXPECT_EQ(l.n_seqs, 2);
  EXPECT_EQ(l.max_blocks, kCudaTableBlocksMultiple);
  EXPECT_EQ(l.max_ctx, 41);
  EXPECT_EQ(l.n_tiles, 3);  // 16 + 2 tokens of sequence 0, 1 of sequence 1.
  EXPECT_EQ(l.max_tile, 16);
  EXPECT_EQ(Part(l, 0, 19), positions);
  EXPECT_EQ(Part(l, l.off_token_seq, 19), token_seq);
  std::vector<int32_t> slots;
  for (int32_t p = 3; p < 16; ++p) slots.push_back(7 * 16 + p);
  for (int32_t p = 16; p < 21; ++p) slots.push_back(2 * 16 + p - 16);
  slots.push_back(5 * 16 + 40 - 32);
  EXPECT_EQ(Part(l, l.off_slots, 19), slots);
  std::vector<int32_t> tables(2 * kCudaTableBlocksMultiple, -1);
  tables[0] = 7;
  tables[1] = 2;
  tables[kCudaTableBlocksMultiple] = 0;
  tables[kCudaTableBlocksMultiple + 1] = 1;
  tables[kCudaTableBlocksMultiple + 2] = 5;
  EXPECT_EQ(Part(l, l.off_tables, tables.size()), tables);
  EXPECT_EQ(Part(l, l.off_tile_begin, 3), (std::vector<int32_t>{0, 16, 18}));
  EXPECT_EQ(Part(l, l.off_tile_len, 3), (std::vector<int32_t>{16, 2, 1}));
  EXPECT_EQ(static_cast<int64_t>(l.host.size()), l.off_tile_len + 3);
}

// The table width grows in steps of kCudaTableBlocksMultiple blocks.
TEST(CudaAttentionLayoutTest, TableWidthIsPadded) {
  for (const int64_t blocks : {1, 31, 32, 33, 64, 65}) {
    std::vector<int32_t> table(blocks, 0);
    const std::vector<int32_t> positions = {0}, token_seq = {0};
    AttentionBatch batch{.positions = positions, .token_seq = token_seq};
    batch.block_tables = {table};
    ASSERT_OK_AND_ASSIGN(CudaAttentionLayout l,
                         MakeCudaAttentionLayout(batch, 16, 4, 4, 16));
    EXPECT_EQ(l.max_blocks, (blocks + 31) / 32 * 32) << blocks;
  }
}

// Padding sequences' tokens have slot -1 (the write kernel skips them) and
// keep their tables (attention reads them).
TEST(CudaAttentionLayoutTest, PaddingTokensHaveNoSlot) {
  const std::vector<int32_t> positions = {9, 0, 0}, token_seq = {0, 1, 2};
  const std::vector<int32_t> real = {3}, pad = {0};
  AttentionBatch batch{
      .positions = positions, .token_seq = token_seq, .padding = 2};
  batch.block_tables = {real, pad, pad};
  ASSERT_OK_AND_ASSIGN(CudaAttentionLayout l,
                       MakeCudaAttentionLayout(batch, 16, 4, 4, 16));
  EXPECT_EQ(Part(l, l.off_slots, 3),
            (std::vector<int32_t>{3 * 16 + 9, -1, -1}));
  EXPECT_EQ(l.host[l.off_tables + kCudaTableBlocksMultiple], 0);
  EXPECT_EQ(l.host[l.off_tables + 2 * kCudaTableBlocksMultiple], 0);
  EXPECT_EQ(l.n_tiles, 3);
  EXPECT_EQ(l.max_tile, 1);
}

TEST(CudaAttentionLayoutTest, RefusesWhatTheKernelsCannotTake) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const std::vector<int32_t> positions = {17}, token_seq = {0};
  const std::vector<int32_t> one = {1}, two = {1, 4}, outside = {1, 8};
  const auto layout = [&](const std::vector<int32_t>& table,
                          int64_t padding = 0, bool remote = false) {
    AttentionBatch batch{.positions = positions,
                         .token_seq = token_seq,
                         .remote_blocks = remote,
                         .padding = padding};
    batch.block_tables = {table};
    return MakeCudaAttentionLayout(batch, 16, 8, 6, 16).status();
  };
  EXPECT_TRUE(layout(two).ok()) << layout(two);
  EXPECT_TRUE(IsError(layout(one), kInvalid,
                      "sequence 0 has 1 blocks, position 17 needs 2"));
  EXPECT_TRUE(IsError(layout(outside), kInvalid,
                      "physical block 8 outside the pool of 8"));
  EXPECT_TRUE(IsError(layout(two, 1), kInvalid,
                      "1 padding sequences of 1 (at least one must be real)"));
  EXPECT_TRUE(IsError(layout(two, -1), kInvalid, "-1 padding sequences"));
  EXPECT_TRUE(IsError(layout(two, 0, true), kInvalid, "no context parallel"));
  const std::vector<int32_t> bad_seq = {1};
  AttentionBatch batch{.positions = positions, .token_seq = bad_seq};
  batch.block_tables = {two};
  EXPECT_TRUE(IsError(MakeCudaAttentionLayout(batch, 16, 8, 8, 16).status(),
                      kInvalid, "token 0 has sequence 1 position 17"));
  EXPECT_TRUE(IsError(MakeCudaAttentionLayout(batch, 16, 8, 9, 16).status(),
                      kInvalid, "KV pool of 8 blocks (9 on the device)"));
}

}  // namespace
}  // namespace shardlm
