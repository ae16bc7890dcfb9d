// The step contract: what the engine asks of every rank in one forward
// step (StepInput) and what the last stage answers (StepOutput), plus the
// per-rank accounting executors report. Plain structs, shared by the
// coordinator, the executors, the control plane's codec (step_codec.h)
// and the runners; no worker internals.
#ifndef SHARDLM_STEP_STEP_H_
#define SHARDLM_STEP_STEP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "step/sampling_params.h"

namespace shardlm {

class LateMasks;  // step/late_masks.h

// Copy block `src` to block `dst` in every layer (K and V). Swapping
// between tiers and spilling cached blocks are such copies.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

// One step: tokens of any number of sequences (prefill chunks and single
// decode tokens mixed), each written into its sequence's KV blocks.
struct StepInput {
  std::vector<int32_t> tokens;     // [n]
  std::vector<int32_t> positions;  // [n] position of each token.
  std::vector<int32_t> token_seq;  // [n] index into block_tables.
  std::vector<std::vector<int32_t>> block_tables;  // Per sequence.
  std::vector<int64_t> seq_ids;  // Per sequence: the engine's sequence id.
  // Hybrid models (ModelConfig::is_hybrid), else empty: per sequence, its
  // recurrent-state slot (BlockManager::StateSlot), which every rank's
  // linear-attention layers read and advance. A sequence whose tokens in
  // the step start at position 0 starts from a zeroed state.
  std::vector<int32_t> state_slots;
  // KV block copies (tier swaps, cache spills) run in order before the
  // step's compute, on every rank over its own slice.
  std::vector<BlockCopy> copies;
  // Hybrid models: state slot copies (a preempted sequence's state to a
  // host slot and back: BlockManager::SwapOutState), run in order after
  // the block copies, on every rank over its own share of the state.
  std::vector<BlockCopy> state_copies;
  // Rows whose next token is sampled: token index, sampling parameters,
  // and the index of the token being generated (the sampling draw).
  std::vector<int32_t> logit_rows;
  std::vector<SamplingParams> sampling;
  std::vector<uint64_t> sample_index;
  // Empty, or per logit row: what its penalties and min_tokens need of its
  // sequence (see SampleHistory). Built by the planner for rows whose
  // request uses them, so an empty entry is the common case.
  std::vector<SampleHistory> history;
  bool return_logits = false;  // Also return the logits of logit_rows.
  // Empty, or per logit row: how many most likely alternatives to report
  // with the sampled token's log-probability (0: no log-probabilities for
  // that row; at most kMaxLogprobs).
  std::vector<int32_t> logprobs;
  // Empty, or per logit row: -1 to sample the row's token, or a token id
  // to score instead: the row's output token is that token and its
  // log-probabilities (with `logprobs` alternatives) are reported, nothing
  // drawn. Prompt logprobs: a row per prompt position, scoring the next
  // prompt token, from the same forward pass as the prefill.
  std::vector<int32_t> score_tokens;
  // Null, or the allowed masks of the constrained rows, still being
  // computed when the step was submitted (in-process only; see
  // late_masks.h): whoever reads `history` to sample, or to send the step
  // elsewhere, reads ResolvedHistory(step) instead.
  std::shared_ptr<const LateMasks> late_masks;

  friend bool operator==(const StepInput&, const StepInput&) = default;
};

// Most alternatives a row may ask for (as OpenAI's API).
inline constexpr int32_t kMaxLogprobs = 20;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Log-probabilities of one sampled token under the distribution it was
// sampled from before temperature, top-k and top-p: log_softmax of the
// logits after the row's logit processors (penalties, logit_bias, masked
// tokens; the raw logits when it has none), computed in double.
struct TokenLogprobs {
  float sampled = 0;              // Of the sampled token.
  std::vector<TokenLogprob> top;  // Most likely first (lower id on ties).
};

struct StepOutput {
  std::vector<int32_t> tokens;  // One per logit row.
  // [rows, vocab] when return_logits, else empty: the model's, before any
  // logit processor.
  Tensor logits;
  // One per logit row when any row asked for log-probabilities (rows that
  // did not have an empty entry), else empty.
  std::vector<TokenLogprobs> logprobs;
};

// Where a runner's time went, cumulative.
struct RunnerStats {
  int64_t steps = 0;
  double forward_seconds = 0;  // Inside Forward().
  // Inside communicator calls; includes waiting for peers (a slower TP
  // rank, or the previous stage for PP), which is what it costs a step.
  double comm_seconds = 0;
  int64_t copied_blocks = 0;  // KV block copies run (swaps, spills).
  double copy_seconds = 0;    // Inside them (on GPUs: queueing them; the
                              // copies themselves run on a copy stream).
  int cpu_threads = 0;  // OpenMP threads the last step's kernels could use.
  // Token rows this rank ran through its layers' token-wise work
  // (projections, MLP), once per step whatever the layers: a step's n
  // tokens, or under CP with sequence parallel its slice of about n / C.
  int64_t token_rows = 0;
  // Under CP: bytes this rank sent over its CP group (CommBytes::total of
  // the CP communicator), in steps run sequence parallel (n >= CP tokens:
  // prefill chunks, batched decodes) and in steps run whole on every CP
  // rank (n < CP: a lone sequence's decode), with the steps of each.
  int64_t cp_split_steps = 0;
  int64_t cp_split_bytes = 0;
  int64_t cp_whole_steps = 0;
  int64_t cp_whole_bytes = 0;
  // The KV pool as allocated, read off its tensors rather than its config
  // (so a shard that stores another dtype than it was asked shows): the
  // element type it stores, and its bytes per token of context (K and V,
  // scales included, over this rank's layers and KV heads).
  DType kv_dtype = DType::kF32;
  int64_t kv_bytes_per_token = 0;
  // Mixtures of experts: tokens routed to each expert this rank holds
  // (experts expert_begin, expert_begin + 1, ...), over all its layers.
  int64_t expert_begin = 0;
  std::vector<int64_t> expert_tokens;
};

}  // namespace shardlm

#endif  // SHARDLM_STEP_STEP_H_
