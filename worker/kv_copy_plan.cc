#include "worker/kv_copy_plan.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace shardlm {

absl::StatusOr<std::vector<KvCopyRun>> PlanKvCopies(
    absl::Span<const BlockCopy> copies, int64_t device_blocks,
    int64_t host_blocks) {
  const int64_t total = device_blocks + host_blocks;
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= total || c.dst < 0 || c.dst >= total ||
        c.src == c.dst) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad KV block copy ", c.src, " -> ", c.dst, " over ", device_blocks,
          " device and ", host_blocks, " host blocks"));
    }
  }
  const auto tier = [&](int32_t id) {
    return id < device_blocks ? KvTier::kDevice : KvTier::kHost;
  };
  const auto index = [&](int32_t id) {
    return static_cast<int32_t>(id < device_blocks ? id : id - device_blocks);
  };
  std::vector<KvCopyRun> runs;
  // Block ids the current run reads and writes.
  absl::flat_hash_set<int32_t> reads, writes;
  for (const BlockCopy& c : copies) {
    const KvTier src = tier(c.src), dst = tier(c.dst);
    // A new run when the pools change, or when this copy reads a block the
    // run writes or writes one it reads or writes (its order then
    // matters).
    if (runs.empty() || runs.back().src != src || runs.back().dst != dst ||
        writes.contains(c.src) || reads.contains(c.dst) ||
        writes.contains(c.dst)) {
      runs.push_back({.src = src, .dst = dst});
      reads.clear();
      writes.clear();
    }
    runs.back().src_blocks.push_back(index(c.src));
    runs.back().dst_blocks.push_back(index(c.dst));
    reads.insert(c.src);
    writes.insert(c.dst);
  }
  return runs;
}

}  // namespace shardlm
