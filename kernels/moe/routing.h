// Mixture-of-experts routing (Qwen3-MoE, Mixtral): which experts each token
// goes to and with what weight, from the router's logits. Plain CPU code
// (the logits are n x n_experts floats), the same on every backend.
#ifndef SHARDLM_KERNELS_MOE_ROUTING_H_
#define SHARDLM_KERNELS_MOE_ROUTING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace shardlm {

// One token's experts, as both families define them (transformers'
// Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock, llama.cpp's
// build_moe_ffn), in f32: p = softmax(logits); the top_k largest p, ties
// to the lower expert index, in decreasing p; weights p (renormalized to
// sum to 1 when `renormalize`). logits: [experts].
std::vector<std::pair<int32_t, float>> RouteToken(const float* logits,
                                                  int64_t experts,
                                                  int64_t top_k,
                                                  bool renormalize);

// The routing of a step's n tokens, grouped by expert for the grouped
// expert GEMMs: tokens[e] (ascending) go to expert e with weights[e].
struct Routing {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> weights;
};

// logits: [n, experts] row-major. InvalidArgument for top_k outside
// [1, experts] or a non-finite logit (a NaN would pick arbitrary experts).
absl::StatusOr<Routing> RouteTokens(const float* logits, int64_t n,
                                    int64_t experts, int64_t top_k,
                                    bool renormalize);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_MOE_ROUTING_H_
