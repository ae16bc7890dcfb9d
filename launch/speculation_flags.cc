#include "launch/speculation_flags.h"

namespace shardlm {

void SpeculationFlags::Register(FlagSet& flags) {
  flags.Add("speculative", &speculative,
            "speculative decoding: none, or ngram (prompt lookup: drafts "
            "the tokens that followed the latest earlier occurrence of the "
            "last few tokens); the output does not change (it turns on "
            "--batch-invariant)");
  flags.Add("num-speculative-tokens", &num_speculative_tokens,
            "most tokens drafted per sequence and step, in [1, 16]");
  flags.Add("speculative-adaptive", &speculative_adaptive,
            "draft only as far as the measured acceptance and step times "
            "say it pays (fewer, down to none, in a busy batch); false: "
            "always --num-speculative-tokens when the drafter has them");
  flags.Add("ngram-min", &ngram_min,
            "--speculative ngram: shortest n-gram looked up");
  flags.Add("ngram-max", &ngram_max,
            "--speculative ngram: longest n-gram looked up (tried first)");
  flags.Add("batch-invariant", &batch_invariant,
            "a token's logits do not depend on the other sequences of its "
            "step: every step runs the decode kernels (prefill costs more); "
            "on with --speculative");
}

std::string SpeculationFlags::Problem() const {
  absl::StatusOr<SpeculationOptions::Method> m =
      ParseSpeculationMethod(speculative);
  if (!m.ok()) return std::string(m.status().message());
  if (num_speculative_tokens < 1 || num_speculative_tokens > 16) {
    return "--num-speculative-tokens must be in [1, 16]";
  }
  if (ngram_min < 1 || ngram_max > 16 || ngram_min > ngram_max) {
    return "--ngram-min and --ngram-max must satisfy 1 <= min <= max <= 16";
  }
  if (absl::Status s = ToOptions().Validate(); !s.ok()) {
    return std::string(s.message());
  }
  return "";
}

SpeculationOptions SpeculationFlags::ToOptions() const {
  return {.method = ParseSpeculationMethod(speculative)
                        .value_or(SpeculationOptions::Method::kNone),
          .max_tokens = static_cast<int>(num_speculative_tokens),
          .adaptive = speculative_adaptive,
          .ngram_min = static_cast<int>(ngram_min),
          .ngram_max = static_cast<int>(ngram_max)};
}

}  // namespace shardlm
