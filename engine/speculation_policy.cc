#include "engine/speculation_policy.h"

#include <algorithm>
#include <cmath>

namespace shardlm {
namespace {

// Weight of the newest observation in the moving averages.
constexpr double kStepWeight = 0.2;
// Decay of the server's acceptance counts per verification: about the last
// hundred count.
constexpr double kServerDecay = 0.99;

}  // namespace

void DraftAcceptance::Observe(int drafted, int kept, double decay) {
  if (drafted <= 0) return;
  accepted = accepted * decay + kept;
  rejected = rejected * decay + (kept < drafted ? 1 : 0);
}

void SpeculationPolicy::ObserveVerification(int drafted, int kept) {
  all_.Observe(drafted, kept, kServerDecay);
}

DraftAcceptance SpeculationPolicy::NewSequence() const {
  // The server's rate, weighing as much as the prior of one of each.
  const double rate = all_.rate();
  return {.accepted = 2 * rate, .rejected = 2 * (1 - rate)};
}

SpeculationPolicy::SpeculationPolicy(SpeculationOptions options)
    : options_(options), seconds_(kMaxRows + 1, 0.0) {}

void SpeculationPolicy::ObserveStep(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds > 0)) return;
  double& s = seconds_[rows];
  s = s == 0 ? seconds : (1 - kStepWeight) * s + kStepWeight * seconds;
}

double SpeculationPolicy::StepSeconds(int64_t rows) const {
  rows = std::clamp<int64_t>(rows, 1, kMaxRows);
  if (seconds_[rows] > 0) return seconds_[rows];
  int64_t below = rows - 1, above = rows + 1;
  while (below >= 1 && seconds_[below] == 0) --below;
  while (above <= kMaxRows && seconds_[above] == 0) ++above;
  if (below >= 1 && above <= kMaxRows) {
    const double f = static_cast<double>(rows - below) / (above - below);
    return seconds_[below] + f * (seconds_[above] - seconds_[below]);
  }
  if (below < 1 && above > kMaxRows) return 0;  // Nothing measured.
  // Below the fewest rows measured: in proportion (so that a step of
  // fewer rows, with fewer drafts, gets tried and measured).
  if (below < 1) return seconds_[above] * rows / above;
  int64_t first = 1;
  while (seconds_[first] == 0) ++first;
  if (first == below) return seconds_[below];  // One measured: optimistic.
  const double per_row =
      std::max(0.0, (seconds_[below] - seconds_[first]) / (below - first));
  return seconds_[below] + per_row * (rows - below);
}

std::vector<int> SpeculationPolicy::Plan(const std::vector<double>& acceptance,
                                         const std::vector<int>& available,
                                         int64_t spare_rows) const {
  const size_t n = acceptance.size();
  std::vector<int> k(n, 0);
  std::vector<int> most(n);
  for (size_t i = 0; i < n; ++i) {
    most[i] = std::min(available[i], options_.max_tokens);
  }
  if (!options_.adaptive) {
    for (size_t i = 0; i < n && spare_rows > 0; ++i) {
      k[i] = static_cast<int>(std::min<int64_t>(most[i], spare_rows));
      spare_rows -= k[i];
    }
    return k;
  }
  int64_t rows = static_cast<int64_t>(n);
  double expected = static_cast<double>(n);  // Tokens the step yields.
  while (spare_rows > 0) {
    // The likeliest next draft.
    size_t best = n;
    double gain = 0;
    for (size_t i = 0; i < n; ++i) {
      if (k[i] >= most[i]) continue;
      const double g = std::pow(acceptance[i], k[i] + 1);
      if (g > gain) best = i, gain = g;
    }
    if (best == n) break;
    // Worth a row while the step's tokens per second grow: (E + g) / T(r
    // + 1) > E / T(r). Unmeasured times are the nearest measured below
    // (StepSeconds), so a new row count is tried once and then judged.
    const double now = StepSeconds(rows), next = StepSeconds(rows + 1);
    if (now > 0 && next > 0 && (expected + gain) * now <= expected * next) {
      break;
    }
    ++k[best];
    ++rows;
    expected += gain;
    --spare_rows;
  }
  return k;
}

}  // namespace shardlm
