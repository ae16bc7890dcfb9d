// The step contract on the wire: a StepInput as the control plane's
// StepPlan and back. Block tables travel as deltas: the coordinator
// (BlockTableDeltas) sends only the blocks each sequence gained since the
// last plan, and every worker (BlockTableMirror) rebuilds the full tables.
// Decode(Encode(step)) == step, checked by step_codec_test.
#ifndef SHARDLM_STEP_STEP_CODEC_H_
#define SHARDLM_STEP_STEP_CODEC_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardlm/v1/control.pb.h"
#include "step/batch_limits.h"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm {

// Which blocks of each sequence the workers already have. Plain
// bookkeeping; not thread-safe.
class BlockTableDeltas {
 public:
  // Fills `delta` with the blocks of `table` the workers lack, after the
  // first `*keep` blocks of what they hold; *keep is -1 when they keep it
  // all (the table grew). A table shrinks when speculative decoding rolls
  // back rejected drafts (BlockManager::Truncate).
  void Delta(int64_t seq_id, const std::vector<int32_t>& table,
             std::vector<int32_t>* delta, int32_t* keep);
  // Forgets `seq_id`; it goes out in the next TakeReleased() if the
  // workers ever saw it.
  void Release(int64_t seq_id);
  std::vector<int64_t> TakeReleased();
  size_t tracked() const { return sent_.size(); }

 private:
  absl::flat_hash_map<int64_t, std::vector<int32_t>> sent_;
  std::vector<int64_t> released_;
};

// A worker's copy of every live sequence's block table.
using BlockTableMirror = absl::flat_hash_map<int64_t, std::vector<int32_t>>;

// `step` as plan `step_id`, its block tables as deltas against `sent`
// (updated). InvalidArgument when sequence ids and tables (or state
// slots) disagree.
// `blocks_sent`, when set, gets the number of block ids in the deltas.
absl::Status EncodeStepPlan(const StepInput& step, int64_t step_id,
                            BlockTableDeltas& sent, v1::StepPlan* plan,
                            int64_t* blocks_sent = nullptr);

// Applies the plan's releases and deltas to `tables`, then rebuilds the
// StepInput the coordinator encoded.
StepInput DecodeStepPlan(const v1::StepPlan& plan, BlockTableMirror& tables);

// The KV cache's and the step limits' options on the wire. Decoding
// validates (InvalidArgument naming the field): the worker trusts nothing a
// message says. A KV dtype must be set to encode.
void EncodeKvCacheOptions(const KvCacheOptions& kv, v1::KvCacheOptions* out);
absl::StatusOr<KvCacheOptions> DecodeKvCacheOptions(
    const v1::KvCacheOptions& in);
void EncodeBatchLimits(const BatchLimits& limits, v1::BatchLimits* out);
absl::StatusOr<BatchLimits> DecodeBatchLimits(const v1::BatchLimits& in);

}  // namespace shardlm

#endif  // SHARDLM_STEP_STEP_CODEC_H_
