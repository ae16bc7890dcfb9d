#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/moe/routing.h"

namespace shardlm {

std::vector<std::pair<int32_t, float>> RouteToken(const float* logits,
                                                  int64_t experts,
                                                  int64_t top_k,
                                                  bool renormalize) {
  // Softmax in f32, as both references compute it (max subtracted).
  float max = logits[0];
  for (int64_t e = 1; e < experts; ++e) max = std::max(max, logits[e]);
  std::vector<float> p(experts);
  float sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    p[e] = std::exp(logits[e] - max);
    sum += p[e];
  }
  for (float& v : p) v /= sum;
  // The top_k, decreasing, ties to the lower index (stable order).
  std::vector<int32_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  std::vector<std::pair<int32_t, float>> out;
  float chosen = 0;
  for (int64_t k = 0; k < top_k; ++k) {
    out.emplace_back(order[k], p[order[k]]);
    chosen += p[order[k]];
  }
  if (renormalize) {
    for (auto& [e, w] : out) w /= chosen;
  }
  return out;
}

absl::StatusOr<Routing> RouteTokens(const float* logits, int64_t n,
                                    int64_t experts, int64_t top_k,
                                    bool renormalize) {
  if (experts < 1 || top_k < 1 || top_k > experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouteTokens: top-k ", top_k, " of ", experts, " experts"));
  }
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
    for (const auto& [e, w] :
         RouteToken(logits + t * experts, experts, top_k, renormalize)) {
      r.tokens[e].push_back(static_cast<int32_t>(t));
      r.weights[e].push_back(w);
    }
  }
  return r;
}

}  // namespace shardlm
