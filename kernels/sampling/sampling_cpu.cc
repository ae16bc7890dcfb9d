#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/sampling.h"

namespace shardlm {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace

double SampleUniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(~step));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void ProcessLogits(absl::Span<float> logits, const SamplingParams& p,
                   const SampleHistory& h) {
  for (const LogitBias& b : p.logit_bias) logits[b.token] += b.bias;
  for (int32_t t : h.masked) logits[t] = -INFINITY;
  if (!h.allowed.empty()) {
    for (size_t w = 0; w < h.allowed.size(); ++w) {
      const uint64_t word = h.allowed[w];
      if (word == ~0ull) continue;
      const size_t end = std::min(logits.size(), (w + 1) * 64);
      for (size_t t = w * 64; t < end; ++t) {
        if (((word >> (t & 63)) & 1) == 0) logits[t] = -INFINITY;
      }
    }
  }
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : h.tokens) {
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (size_t i = 0; i < h.tokens.size(); ++i) {
      const int32_t c = h.counts[i];
      if (c == 0) continue;  // In the prompt only.
      logits[h.tokens[i]] -=
          p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
  }
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& p,
                    uint64_t step) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (p.temperature == 0.0f || p.top_k == 1) return Argmax(logits);

  // Candidates in descending logit order (ties: lower id first) when a
  // filter needs the order; otherwise in id order.
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t n = vocab;
  bool sorted = true;
  if (p.top_k > 0 && p.top_k < vocab) {
    n = p.top_k;
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), by_logit);
  } else if (p.top_p < 1.0f) {
    std::sort(ids.begin(), ids.end(), by_logit);
  } else {
    sorted = false;  // top_k off or >= vocab: ids stay in id order.
  }

  const float max = logits[sorted ? ids[0] : Argmax(logits)];
  std::vector<double> probs(n);
  double total = 0;
  for (int32_t i = 0; i < n; ++i) {
    probs[i] =
        std::exp((static_cast<double>(logits[ids[i]]) - max) / p.temperature);
    total += probs[i];
  }
  if (p.top_p < 1.0f) {
    double mass = 0;
    int32_t keep = 0;
    while (keep < n) {
      mass += probs[keep++];
      if (mass >= p.top_p * total) break;
    }
    n = keep;
    total = mass;
  }
  const double target = SampleUniform(p.seed, step) * total;
  double cum = 0;
  for (int32_t i = 0; i < n; ++i) {
    cum += probs[i];
    if (target < cum) return ids[i];
  }
  return ids[n - 1];  // Rounding left target at the very top.
}

}  // namespace shardlm
