// The host side of a CUDA attention batch (CudaAttentionBatch::Upload in
// kernels/cuda_ops.h): checks an AttentionBatch against the KV pool and
// lays out the int32 arrays the CUDA kernels read, as plain C++ so that the
// index arithmetic is tested without a GPU.
//
// Layout, one int32 buffer: positions[n] | token_seq[n] | slots[n] |
// tables[n_seqs * max_blocks] | tile_begin[n_tiles] | tile_len[n_tiles].
// A slot is block * block_size + offset, or -1 for a token of a padding
// sequence (AttentionBatch::padding), whose K/V the kernels do not write.
// Tables are padded with -1 to max_blocks, a multiple of
// kCudaTableBlocksMultiple, so that the layout (and a CUDA graph captured
// over it) changes only every that many blocks of growth.
#ifndef SHARDLM_KERNELS_ATTENTION_CUDA_ATTENTION_LAYOUT_H_
#define SHARDLM_KERNELS_ATTENTION_CUDA_ATTENTION_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention/paged_attention.h"

namespace shardlm {

inline constexpr int64_t kCudaTableBlocksMultiple = 32;

struct CudaAttentionLayout {
  std::vector<int32_t> host;  // The buffer, as above.
  int64_t n = 0, n_seqs = 0, max_blocks = 0, n_tiles = 0;
  int64_t max_ctx = 0;   // Longest context of a token (position + 1).
  int64_t max_tile = 0;  // Longest run of one sequence's tokens in a tile.
  // Offsets into `host` (positions start at 0).
  int64_t off_token_seq = 0, off_slots = 0, off_tables = 0, off_tile_begin = 0,
          off_tile_len = 0;
};

// InvalidArgument for a batch the kernels cannot take: block ids outside
// [0, num_blocks), a token whose position its table does not reach, an
// inconsistent batch, a padding count outside [0, n_seqs), sizes past
// int32. `tile`: query tokens per prefill tile (cuda::kPrefillTile).
absl::StatusOr<CudaAttentionLayout> MakeCudaAttentionLayout(
    const AttentionBatch& batch, int64_t block_size, int64_t num_blocks,
    int64_t device_blocks, int64_t tile);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ATTENTION_CUDA_ATTENTION_LAYOUT_H_
