// Drafters for speculative decoding: what a sequence is likely to say
// next, proposed cheaply and checked by the model in one step (the
// planner's verification rows, batch_planner.h). A draft only saves time:
// a wrong one costs its rows and nothing else, since every token the
// sequence keeps is the one the model samples.
#ifndef SHARDLM_ENGINE_DRAFTER_H_
#define SHARDLM_ENGINE_DRAFTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardlm {

struct GenerateRequest;  // engine/request.h

// One sequence's drafter, owned by its sequence (state may grow with it).
class SequenceDrafter {
 public:
  virtual ~SequenceDrafter() = default;
  // Up to `max_tokens` tokens likely to follow `tokens` (the sequence's
  // prompt and generated tokens so far, a prefix of later calls' tokens);
  // empty when it has no guess.
  virtual std::vector<int32_t> Draft(absl::Span<const int32_t> tokens,
                                     int max_tokens) = 0;
};

// Prompt lookup (n-gram): proposes the tokens that followed the most recent
// earlier occurrence of the sequence's last n tokens, for the longest n in
// [min_n, max_n] that occurred before. No second model; strong where the
// answer repeats the context (code edits, retrieval, agent loops). Each
// call indexes the tokens added since the last one, so a step costs
// O(new tokens x n), not a pass over the context.
class NgramDrafter : public SequenceDrafter {
 public:
  NgramDrafter(int min_n, int max_n);
  std::vector<int32_t> Draft(absl::Span<const int32_t> tokens,
                             int max_tokens) override;

 private:
  int min_n_, max_n_;
  // Per n - min_n: hash of the n tokens ending before position e -> the
  // largest such e indexed.
  std::vector<absl::flat_hash_map<uint64_t, int64_t>> last_end_;
  int64_t indexed_ = 0;  // Ends up to this one are in last_end_.
};

// How a server drafts (--speculative).
struct SpeculationOptions {
  // kCustom: `make_drafter` (in-process users, tests).
  enum class Method { kNone, kNgram, kCustom };
  Method method = Method::kNone;
  std::function<std::unique_ptr<SequenceDrafter>(const GenerateRequest&)>
      make_drafter;
  // Most tokens drafted per sequence and step (--num-speculative-tokens).
  int max_tokens = 4;
  // With `adaptive`, the planner drafts fewer (down to none) where the
  // measured acceptance and step times say they do not pay
  // (SpeculationPolicy); without, always up to max_tokens.
  bool adaptive = true;
  int ngram_min = 2;  // Prompt lookup's n-gram lengths.
  int ngram_max = 4;

  bool enabled() const { return method != Method::kNone; }
  // InvalidArgument naming the flag when out of range.
  absl::Status Validate() const;
  // A drafter for a new sequence (null when speculation is off).
  std::unique_ptr<SequenceDrafter> NewDrafter(
      const GenerateRequest& request) const;
};

// "none", "ngram" to a method; InvalidArgument naming the choices.
absl::StatusOr<SpeculationOptions::Method> ParseSpeculationMethod(
    const std::string& name);
const char* SpeculationMethodName(SpeculationOptions::Method method);

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_DRAFTER_H_
