#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/moe/routing.h"

namespace shardlm {

std::vector<std::pair<int32_t, float>> RouteToken(const float* logits,
                                                  int64_t experts,
                                                  int64_t top_k,
                                                  bool renormalize) {
  return RouteToken(logits, RouterSpec{.experts = experts,
                                       .top_k = top_k,
                                       .renormalize = renormalize});
}

std::vector<std::pair<int32_t, float>> RouteToken(const float* logits,
                                                  const RouterSpec& spec) {
  const int64_t experts = spec.experts;
  std::vector<float> s(logits, logits + experts);
  if (spec.gating == ExpertGating::kSigmoid) {
    for (float& v : s) v = 1.0f / (1.0f + std::exp(-v));
  } else {  // Softmax in f32, as the references compute it (max first).
    const float max = *std::max_element(s.begin(), s.end());
    float sum = 0;
    for (float& v : s) sum += (v = std::exp(v - max));
    for (float& v : s) v /= sum;
  }
  std::vector<float> c = s;
  if (!spec.score_bias.empty()) {
    for (int64_t e = 0; e < experts; ++e) c[e] += spec.score_bias[e];
  }
  if (spec.groups > 1) {
    // Each group's score: its two best choices (one when a group has one).
    const int64_t per = experts / spec.groups;
    std::vector<float> group_score(spec.groups);
    for (int64_t g = 0; g < spec.groups; ++g) {
      std::vector<float> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      const int64_t top = std::min<int64_t>(2, per);
      std::partial_sort(v.begin(), v.begin() + top, v.end(),
                        std::greater<float>());
      group_score[g] = std::accumulate(v.begin(), v.begin() + top, 0.0f);
    }
    std::vector<int32_t> groups(spec.groups);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int32_t a, int32_t b) {
      return group_score[a] > group_score[b];
    });
    std::vector<bool> kept(spec.groups, false);
    for (int64_t k = 0; k < spec.groups_used; ++k) kept[groups[k]] = true;
    for (int64_t e = 0; e < experts; ++e) {
      if (!kept[e / per]) c[e] = 0.0f;  // As transformers' masked_fill.
    }
  }
  std::vector<int32_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return c[a] > c[b]; });
  std::vector<std::pair<int32_t, float>> out;
  float chosen = 0;
  for (int64_t k = 0; k < spec.top_k; ++k) {
    out.emplace_back(order[k], s[order[k]]);
    chosen += s[order[k]];
  }
  if (spec.renormalize) {
    const float denominator =
        spec.gating == ExpertGating::kSigmoid ? chosen + 1e-20f : chosen;
    for (auto& [e, w] : out) w /= denominator;
  }
  for (auto& [e, w] : out) w *= spec.scale;
  return out;
}

absl::Status ValidateRouterSpec(const RouterSpec& spec) {
  if (spec.experts < 1 || spec.top_k < 1 || spec.top_k > spec.experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouteTokens: top-k ", spec.top_k, " of ", spec.experts, " experts"));
  }
  if (spec.groups < 1 || spec.experts % spec.groups != 0 ||
      spec.groups_used < 1 || spec.groups_used > spec.groups ||
      spec.top_k > spec.groups_used * (spec.experts / spec.groups)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RouteTokens: ", spec.groups_used, " of ", spec.groups,
                     " expert groups cannot hold the top ", spec.top_k, " of ",
                     spec.experts, " experts"));
  }
  if (!spec.score_bias.empty() &&
      static_cast<int64_t>(spec.score_bias.size()) != spec.experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("RouteTokens: score bias of ", spec.score_bias.size(),
                     " values for ", spec.experts, " experts"));
  }
  if (!std::isfinite(spec.scale) || spec.scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RouteTokens: scale ", spec.scale));
  }
  return absl::OkStatus();
}

absl::StatusOr<Routing> RouteTokens(const float* logits, int64_t n,
                                    int64_t experts, int64_t top_k,
                                    bool renormalize) {
  return RouteTokens(
      logits, n,
      RouterSpec{
          .experts = experts, .top_k = top_k, .renormalize = renormalize});
}

absl::StatusOr<Routing> RouteTokens(const float* logits, int64_t n,
                                    const RouterSpec& spec) {
  RETURN_IF_ERROR(ValidateRouterSpec(spec));
  const int64_t experts = spec.experts;
  for (int64_t i = 0; i < n * experts; ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("RouteTokens: router logit ", logits[i], " of token ",
                       i / experts, ", expert ", i % experts));
    }
  }
  Routing r{.tokens = std::vector<std::vector<int32_t>>(experts),
            .weights = std::vector<std::vector<float>>(experts)};
  for (int64_t t = 0; t < n; ++t) {
    for (const auto& [e, w] : RouteToken(logits + t * experts, spec)) {
      r.tokens[e].push_back(static_cast<int32_t>(t));
      r.weights[e].push_back(w);
    }
  }
  return r;
}

}  // namespace shardlm
