#include "kernels/attention/cuda_attention_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardlm {

absl::StatusOr<CudaAttentionLayout> MakeCudaAttentionLayout(
    const AttentionBatch& batch, int64_t block_size, int64_t num_blocks,
    int64_t device_blocks, int64_t tile) {
  const int64_t n = static_cast<int64_t>(batch.positions.size());
  const int64_t n_seqs = static_cast<int64_t>(batch.block_tables.size());
  if (block_size <= 0 || num_blocks <= 0 || device_blocks < 0 ||
      device_blocks > num_blocks || tile <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: KV pool of ", num_blocks, " blocks (", device_blocks,
        " on the device) of ", block_size, " tokens, tiles of ", tile));
  }
  if (static_cast<int64_t>(batch.token_seq.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: ", n, " positions but ",
                     batch.token_seq.size(), " seq ids"));
  }
  if (batch.window < 0 || batch.window > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: sliding window of ", batch.window));
  }
  if (batch.padding < 0 || (batch.padding > 0 && batch.padding >= n_seqs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: ", batch.padding, " padding sequences of ",
                     n_seqs, " (at least one must be real)"));
  }
  if (batch.remote_blocks) {
    return absl::InvalidArgumentError(
        "attention: the CUDA kernels hold every block of a sequence (no "
        "context parallel)");
  }
  if (num_blocks * block_size > 0x7fffffff) {
    return absl::InvalidArgumentError("attention: KV pool beyond int32 slots");
  }
  int64_t max_blocks = 1, max_ctx = 0;
  for (const auto& table : batch.block_tables) {
    max_blocks = std::max<int64_t>(max_blocks, table.size());
    for (int32_t b : table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("attention: physical block ", b,
                         " outside the pool of ", num_blocks));
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = batch.token_seq[i], pos = batch.positions[i];
    if (s < 0 || s >= n_seqs || pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: token ", i, " has sequence ", s, " position ", pos));
    }
    if (static_cast<int64_t>(batch.block_tables[s].size()) <=
        pos / block_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: sequence ", s, " has ", batch.block_tables[s].size(),
          " blocks, position ", pos, " needs ", pos / block_size + 1));
    }
    max_ctx = std::max<int64_t>(max_ctx, pos + 1);
  }
  max_blocks = (max_blocks + kCudaTableBlocksMultiple - 1) /
               kCudaTableBlocksMultiple * kCudaTableBlocksMultiple;
  if (n_seqs * max_blocks > 0x7fffffff || n > 0x7fffffff / 4) {
    return absl::InvalidArgumentError("attention: batch too large");
  }
  // Tiles: runs of at most `tile` consecutive tokens of one sequence.
  std::vector<int32_t> tile_begin, tile_len;
  int64_t max_tile = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (tile_begin.empty() || tile_len.back() == tile ||
        batch.token_seq[i] != batch.token_seq[tile_begin.back()]) {
      tile_begin.push_back(static_cast<int32_t>(i));
      tile_len.push_back(0);
    }
    ++tile_len.back();
    max_tile = std::max<int64_t>(max_tile, tile_len.back());
  }

  CudaAttentionLayout l;
  l.n = n;
  l.n_seqs = n_seqs;
  l.max_blocks = max_blocks;
  l.max_ctx = max_ctx;
  l.max_tile = max_tile;
  l.n_tiles = static_cast<int64_t>(tile_begin.size());
  l.off_token_seq = n;
  l.off_slots = 2 * n;
  l.off_tables = 3 * n;
  l.off_tile_begin = 3 * n + n_seqs * max_blocks;
  l.off_tile_len = l.off_tile_begin + l.n_tiles;
  std::vector<int32_t>& host = l.host;
  host.reserve(l.off_tile_len + l.n_tiles);
  host.insert(host.end(), batch.positions.begin(), batch.positions.end());
  host.insert(host.end(), batch.token_seq.begin(), batch.token_seq.end());
  const int64_t first_padding = n_seqs - batch.padding;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = batch.positions[i], s = batch.token_seq[i];
    host.push_back(
        s >= first_padding
            ? -1
            : static_cast<int32_t>(batch.block_tables[s][pos / block_size] *
                                       block_size +
                                   pos % block_size));
  }
  for (const auto& table : batch.block_tables) {
    host.insert(host.end(), table.begin(), table.end());
    host.insert(host.end(), max_blocks - table.size(), -1);
  }
  host.insert(host.end(), tile_begin.begin(), tile_begin.end());
  host.insert(host.end(), tile_len.begin(), tile_len.end());
  return l;
}

}  // namespace shardlm
