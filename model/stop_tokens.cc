#include "model/stop_tokens.h"

#include <algorithm>
#include <optional>

namespace shardlm {

std::vector<int32_t> DefaultStopTokenIds(const ModelConfig& config,
                                         const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  const auto add = [&](int32_t id) {
    if (id >= 0 && id < config.vocab_size &&
        std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ids.push_back(id);
    }
  };
  add(config.eos_id);
  add(tokenizer.eos_id());
  for (const char* turn_end : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                               "<end_of_turn>", "<|return|>", "<|call|>"}) {
    if (std::optional<int32_t> id = tokenizer.TokenId(turn_end)) add(*id);
  }
  return ids;
}

}  // namespace shardlm
