#include "step/batch_limits.h"

#include "absl/strings/str_cat.h"

namespace shardlm {

absl::Status BatchLimits::Validate() const {
  if (max_batched_tokens < 1 || max_batched_tokens > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--max-batched-tokens ",
                                                   max_batched_tokens,
                                                   " is outside [1, 1048576]"));
  }
  if (max_seqs < 1 || max_seqs > (1 << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-seqs ", max_seqs, " is outside [1, 65536]"));
  }
  if (max_queued < 0 || max_queued > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-queued ", max_queued, " is outside [0, 2^24]"));
  }
  return absl::OkStatus();
}

}  // namespace shardlm
