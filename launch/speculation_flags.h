// Flags of speculative decoding and batch invariance, shared by the
// commands that schedule steps (generate, serve, coordinator).
#ifndef SHARDLM_LAUNCH_SPECULATION_FLAGS_H_
#define SHARDLM_LAUNCH_SPECULATION_FLAGS_H_

#include <cstdint>
#include <string>

#include "engine/drafter.h"
#include "launch/flags.h"

namespace shardlm {

struct SpeculationFlags {
  std::string speculative = "none";
  int64_t num_speculative_tokens = SpeculationOptions{}.max_tokens;
  bool speculative_adaptive = true;
  int64_t ngram_min = SpeculationOptions{}.ngram_min;
  int64_t ngram_max = SpeculationOptions{}.ngram_max;
  bool batch_invariant = false;

  // Adds --speculative, --num-speculative-tokens, --speculative-adaptive,
  // --ngram-min, --ngram-max and --batch-invariant.
  void Register(FlagSet& flags);
  std::string Problem() const;  // Empty when valid, else the problem.
  SpeculationOptions ToOptions() const;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_SPECULATION_FLAGS_H_
