// SpeculationPolicy: how many drafted tokens each decoding sequence
// verifies in a step, so that speculation never slows a server down. It
// keeps what drafting has paid so far: each sequence's acceptance (the
// chance that a drafted token is the one the model samples, as an
// estimate of a geometric run: accepted / (accepted + rejections)) and
// the wall time of decode steps by their rows. A step's drafts are added
// one at a time, the likeliest first (the next draft of sequence i counts
// acceptance_i^(k_i + 1) expected tokens), while the step's expected
// tokens per second grow. Where verification rows cost as much as the
// tokens they bring (a busy batch, a compute-bound step), it drafts
// nothing.
#ifndef SHARDLM_ENGINE_SPECULATION_POLICY_H_
#define SHARDLM_ENGINE_SPECULATION_POLICY_H_

#include <cstdint>
#include <vector>

#include "engine/drafter.h"

namespace shardlm {

// A sequence's acceptance so far: decayed counts of accepted drafts and
// of rejections, from a prior of one of each.
struct DraftAcceptance {
  double accepted = 1;
  double rejected = 1;
  double rate() const { return accepted / (accepted + rejected); }
  // A verification of `drafted` tokens kept `kept` of them; the counts so
  // far weigh `decay` each.
  void Observe(int drafted, int kept, double decay = 0.9);
};

class SpeculationPolicy {
 public:
  explicit SpeculationPolicy(SpeculationOptions options);

  // A step that decoded `rows` token rows (and prefilled nothing) took
  // `seconds` of wall time.
  void ObserveStep(int64_t rows, double seconds);
  // Drafted tokens to verify per decoding sequence of a step: at most
  // available[i] (what its drafter proposed) and max_tokens, at most
  // `spare_rows` in all.
  std::vector<int> Plan(const std::vector<double>& acceptance,
                        const std::vector<int>& available,
                        int64_t spare_rows) const;
  // The step time the policy assumes for `rows` rows (seconds; 0 when
  // nothing is measured yet): the measured one; between two measured row
  // counts, the line between them; past the largest, that one plus the
  // mean cost per row between the smallest and the largest measured, or
  // with only one measured, the same as it (so that more rows get tried);
  // below the smallest, in proportion to it (so that fewer get tried). A
  // guess either way is measured the first time it is taken.
  double StepSeconds(int64_t rows) const;
  // Every sequence's verifications so far (decayed more slowly): where a
  // new sequence's acceptance starts (NewSequence).
  void ObserveVerification(int drafted, int kept);
  DraftAcceptance NewSequence() const;

  const SpeculationOptions& options() const { return options_; }

 private:
  SpeculationOptions options_;
  // Per row count (1..kMaxRows): the step time's moving average; 0 when
  // not measured.
  static constexpr int64_t kMaxRows = 256;
  std::vector<double> seconds_;
  DraftAcceptance all_;  // Over every sequence.
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_SPECULATION_POLICY_H_
