// A step of one sequence for the runner tests (cuda_model_runner_test's
// files): sequence id 0 whose blocks are 0, 1, 2, ... of a pool of
// `blocks`; `tokens` at positions from `start`, logits of the last row.
#ifndef SHARDLM_WORKER_SEQ_STEP_TESTING_H_
#define SHARDLM_WORKER_SEQ_STEP_TESTING_H_

#include <cstdint>
#include <vector>

#include "step/step.h"

namespace shardlm {

inline StepInput SeqStep(const std::vector<int32_t>& tokens, int32_t start,
                         int64_t block_size, int64_t blocks) {
  StepInput s;
  s.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) {
    s.positions.push_back(start + static_cast<int32_t>(i));
    s.token_seq.push_back(0);
  }
  const int64_t need = (start + tokens.size() + block_size - 1) / block_size;
  std::vector<int32_t> table;
  for (int64_t b = 0; b < need && b < blocks; ++b) {
    table.push_back(static_cast<int32_t>(b));
  }
  s.block_tables = {table};
  s.seq_ids = {0};
  s.logit_rows = {static_cast<int32_t>(tokens.size() - 1)};
  s.sampling = {SamplingParams{}};
  s.sample_index = {0};
  return s;
}

}  // namespace shardlm

#endif  // SHARDLM_WORKER_SEQ_STEP_TESTING_H_
