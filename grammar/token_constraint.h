// TokenConstraint: what the scheduler asks of a request whose output is
// constrained (structured outputs): which tokens may come next, and the
// token that came. The planner holds one per constrained sequence and
// ships its mask in the row's SampleHistory (step/sampling_params.h).
#ifndef SHARDLM_GRAMMAR_TOKEN_CONSTRAINT_H_
#define SHARDLM_GRAMMAR_TOKEN_CONSTRAINT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace shardlm {

// Not thread-safe: one owner (the scheduler's loop thread) uses it. Its
// state is a function of the tokens accepted so far, so a sequence that is
// preempted and recomputed keeps it as it is.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens that may be generated next, into `mask` (resized to
  // (vocab + 63) / 64 words; bit t % 64 of word t / 64 set: token t
  // allowed). Never empty of allowed tokens while the request may go on:
  // when the output is complete, the request's stop tokens are allowed.
  virtual void Allowed(int64_t vocab, std::vector<uint64_t>& mask) = 0;
  // Takes the token generated; FailedPrecondition when it was not allowed
  // (the state is then unchanged).
  virtual absl::Status Accept(int32_t token) = 0;
  // Seconds spent in Allowed() so far (for metrics and benchmarks).
  virtual double mask_seconds() const = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_GRAMMAR_TOKEN_CONSTRAINT_H_
