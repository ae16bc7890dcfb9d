// Mixture-of-experts routing (Qwen3-MoE, Mixtral; GLM-4.5 and DeepSeek V3's
// sigmoid routing): which experts each token goes to and with what weight,
// from the router's logits. Plain CPU code (the logits are n x n_experts
// floats), the same on every backend.
#ifndef SHARDLM_KERNELS_MOE_ROUTING_H_
#define SHARDLM_KERNELS_MOE_ROUTING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/model_config.h"

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

// How a router turns a token's logits into experts and weights.
struct RouterSpec {
  int64_t experts = 0;
  int64_t top_k = 0;
  ExpertGating gating = ExpertGating::kSoftmax;
  // Added to the scores for choosing only (DeepSeek V3's and GLM-4.5's
  // e_score_correction_bias, [experts]); empty: none.
  absl::Span<const float> score_bias;
  // Group-limited choice (DeepSeek V3's n_group, topk_group): the experts
  // form `groups` equal contiguous groups, each scored by the sum of its
  // two best (biased) scores; only the `groups_used` best groups' experts
  // may be chosen. 1, 1: no limit.
  int64_t groups = 1;
  int64_t groups_used = 1;
  bool renormalize = true;  // Chosen weights divided by their sum.
  float scale = 1.0f;       // Then multiplied (routed_scaling_factor).
};

// One token's experts under `spec`, as transformers computes them
// (Glm4MoeTopkRouter, DeepseekV3TopkRouter): scores s = sigmoid(logits)
// (or the softmax); choice c = s + score_bias; groups ranked by their top
// two c, the rest masked to 0; the top_k largest masked c, ties to the
// lower index, in decreasing c; weights s at those experts, renormalized
// (sum + 1e-20 for sigmoid scores), times scale. With softmax gating and no
// bias, groups or scale this is RouteToken above.
std::vector<std::pair<int32_t, float>> RouteToken(const float* logits,
                                                  const RouterSpec& spec);

// InvalidArgument naming the field when `spec` is inconsistent (top_k
// beyond the experts its groups allow, groups not dividing the experts, a
// bias of another length).
absl::Status ValidateRouterSpec(const RouterSpec& spec);

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
// The same under `spec` (ValidateRouterSpec first).
absl::StatusOr<Routing> RouteTokens(const float* logits, int64_t n,
                                    const RouterSpec& spec);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_MOE_ROUTING_H_
