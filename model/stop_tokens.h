// The token ids that end a model's answer by default.
#ifndef SHARDLM_MODEL_STOP_TOKENS_H_
#define SHARDLM_MODEL_STOP_TOKENS_H_

#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "model/tokenizer.h"

namespace shardlm {

// End of text (the config's and the tokenizer's EOS), and the end of a chat
// turn in the chat formats the vocabulary has: ChatML's <|im_end|> (SmolLM2,
// Qwen2), Llama 3's <|eot_id|> and <|eom_id|>, Gemma's <end_of_turn>,
// harmony's <|return|> and <|call|> (gpt-oss: the answer's end, a tool
// call's; not <|end|>, which ends a reasoning message the answer follows,
// as llama.cpp and gpt-oss's generation_config have it). A Llama 3
// Instruct model
// whose EOS is <|end_of_text|> would otherwise run past the end of its turn
// to max_tokens. Ids outside the config's vocabulary are left out; no id
// twice.
std::vector<int32_t> DefaultStopTokenIds(const ModelConfig& config,
                                         const Tokenizer& tokenizer);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_STOP_TOKENS_H_
