// Sampling a step's tokens from its logits on the host, with the step's
// per-row parameters and log-probabilities: what every runner does with
// logits it has on the host (the CPU's always; a GPU's when the logits or
// log-probabilities are wanted, or after a TP gather).
#ifndef SHARDLM_WORKER_SAMPLE_STEP_H_
#define SHARDLM_WORKER_SAMPLE_STEP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "step/step.h"

namespace shardlm {

// The log-probabilities of `sampled` and of the `top_n` most likely tokens
// under one row of logits ([vocab]).
TokenLogprobs Logprobs(absl::Span<const float> logits, int32_t sampled,
                       int32_t top_n);

// Samples one token per logit row of `logits` ([rows, vocab]) with the
// step's per-row parameters, after the row's logit processors
// (ProcessLogits: penalties, logit_bias, masked tokens), and computes the
// log-probabilities asked for, of the processed logits.
absl::StatusOr<StepOutput> SampleStep(const StepInput& step, Tensor logits);

// What SampleStep checks of a step (one sampling parameter set, sample
// index and logprobs count per logit row, each in range, and no or one
// history per row; the token ids against the vocabulary are checked by
// SampleStep, which knows it), on its own: for
// ranks that must refuse a bad step alike before any collective, whichever
// of them samples.
absl::Status ValidateStepSampling(const StepInput& step);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_SAMPLE_STEP_H_
