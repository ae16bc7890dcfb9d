// Block manager: the only owner of KV block tables.
//
// Plain bookkeeping with no device or network dependency. Block ids index
// every worker's KV pool identically.
#ifndef SHARDLM_COORDINATOR_BLOCK_MANAGER_H_
#define SHARDLM_COORDINATOR_BLOCK_MANAGER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace shardlm {

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;

  // Grows the table of `seq` (created when new) to hold `tokens` tokens.
  // ResourceExhausted, with nothing allocated, when too few blocks are
  // free. Tables never shrink while the sequence lives.
  absl::Status Reserve(int64_t seq, int64_t tokens);
  // Empty for an unknown sequence.
  const std::vector<int32_t>& Table(int64_t seq) const;
  // Returns all blocks of `seq`; unknown sequences are ignored.
  void Free(int64_t seq);

 private:
  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are warm.
  absl::flat_hash_map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_BLOCK_MANAGER_H_
