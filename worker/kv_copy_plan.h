// A step's KV block copies (worker/step.h BlockCopy: swap out, swap in, a
// spill of an evicted prefix block) as a backend with two memories issues
// them: the device pool holds blocks [0, device_blocks), the host tier
// [device_blocks, device_blocks + host_blocks) in memory of its own (pinned
// host memory on a GPU worker), so each copy goes from one pool to another
// and ids become indices into those pools.
//
// The copies are recorded in an order that matters (a block written by one
// copy may be the source of a later one, or a source later overwritten),
// and a backend issues a run of copies as one call that may merge adjacent
// ids into one transfer and need not keep their order. So the plan cuts
// the list into runs of consecutive copies between the same two pools in
// which no block is both read and written; issuing the runs in order (on
// one stream) gives exactly the copies' sequential result.
#ifndef SHARDLM_WORKER_KV_COPY_PLAN_H_
#define SHARDLM_WORKER_KV_COPY_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "step/step.h"

namespace shardlm {

enum class KvTier : uint8_t { kDevice, kHost };

struct KvCopyRun {
  KvTier src = KvTier::kDevice, dst = KvTier::kDevice;
  // Indices into the src and dst pools (not block ids), copy i being
  // src_blocks[i] -> dst_blocks[i].
  std::vector<int32_t> src_blocks, dst_blocks;
  friend bool operator==(const KvCopyRun&, const KvCopyRun&) = default;
};

// InvalidArgument naming the copy when an id is outside the pools or a copy
// has src == dst; nothing is planned then.
absl::StatusOr<std::vector<KvCopyRun>> PlanKvCopies(
    absl::Span<const BlockCopy> copies, int64_t device_blocks,
    int64_t host_blocks);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_KV_COPY_PLAN_H_
