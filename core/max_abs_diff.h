// The largest element-wise |a[i] - b[i]| of two sequences, for tests that
// bound an error. NaN-proof: std::max(err, NaN) keeps err, so a loop of
// max() passes an all-NaN output; here any NaN, an infinity against a
// finite value, or sequences of different lengths make the result +inf,
// which fails every bound. Equal values (equal infinities too) differ by 0.
#ifndef SHARDLM_CORE_MAX_ABS_DIFF_H_
#define SHARDLM_CORE_MAX_ABS_DIFF_H_

#include <cmath>
#include <cstddef>
#include <limits>

namespace shardlm {

template <typename A, typename B>
double MaxAbsDiff(const A* a, const B* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    if (x == y) continue;  // Equal, equal infinities included.
    const double d = std::abs(x - y);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    if (d > worst) worst = d;
  }
  return worst;
}

// Over two containers (std::vector, absl::Span, ...).
template <typename CA, typename CB>
double MaxAbsDiff(const CA& a, const CB& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  return MaxAbsDiff(a.data(), b.data(), a.size());
}

}  // namespace shardlm

#endif  // SHARDLM_CORE_MAX_ABS_DIFF_H_
