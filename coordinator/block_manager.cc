#include "coordinator/block_manager.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace shardlm {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  SHARDLM_CHECK(num_blocks >= 0 && block_size > 0, "num_blocks=", num_blocks,
                " block_size=", block_size);
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int64_t BlockManager::BlocksFor(int64_t tokens) const {
  return (tokens + block_size_ - 1) / block_size_;
}

absl::Status BlockManager::Reserve(int64_t seq, int64_t tokens) {
  std::vector<int32_t>& table = tables_[seq];
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return absl::OkStatus();
  if (need > static_cast<int64_t>(free_.size())) {
    if (table.empty()) tables_.erase(seq);
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", tokens, " tokens need ", need,
                     " more blocks of ", block_size_, " but only ",
                     free_.size(), " of ", num_blocks_, " are free"));
  }
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

const std::vector<int32_t>& BlockManager::Table(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmpty : it->second;
}

void BlockManager::Free(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
    free_.push_back(*b);
  }
  tables_.erase(it);
}

}  // namespace shardlm
