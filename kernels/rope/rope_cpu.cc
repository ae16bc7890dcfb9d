#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/check_args.h"
#include "kernels/rope/rope.h"
#include "kernels/threading.h"

namespace shardlm {

absl::Status Rope(Tensor& x, absl::Span<const int32_t> positions, float theta,
                  RopeStyle style) {
  if (x.rank() != 3) {
    return absl::InvalidArgumentError("Rope: x must be [n, heads, head_dim]");
  }
  return Rope(x, positions, MakeRopeTable(style, theta, x.dim(2), {}));
}

absl::Status Rope(Tensor& x, absl::Span<const int32_t> positions,
                  const RopeTable& table) {
  if (x.rank() != 3) {
    return absl::InvalidArgumentError("Rope: x must be [n, heads, head_dim]");
  }
  const int64_t n = x.dim(0), heads = x.dim(1), d = x.dim(2);
  if (auto s = CheckHostF32("Rope", "x", x, {n, heads, d}); !s.ok()) return s;
  if (static_cast<int64_t>(positions.size()) != n || d % 2 != 0) {
    return absl::InvalidArgumentError(
        "Rope: need one position per token and an even head_dim");
  }
  // Pairs rotated: head_dim / 2, or fewer under partial RoPE (the first
  // 2 * half dimensions rotate among themselves, the rest pass).
  const int64_t half = static_cast<int64_t>(table.inv_freq.size());
  if (half < 1 || 2 * half > d) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: the table has ", table.inv_freq.size(),
                     " frequencies; head_dim ", d, " takes 1 to ", d / 2));
  }
  const std::vector<double>& inv_freq = table.inv_freq;
  const RopeStyle style = table.style;
  ParallelForEach(n, n > 4, [&](int64_t i) {
    // Angles in double: positions reach 10^5 and more, where float angles
    // lose the low bits that decide the rotation.
    std::vector<float> cos(half), sin(half);
    for (int64_t k = 0; k < half; ++k) {
      const double a = positions[i] * inv_freq[k];
      cos[k] = static_cast<float>(std::cos(a) * table.mscale);
      sin[k] = static_cast<float>(std::sin(a) * table.mscale);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data<float>() + (i * heads + h) * d;
      for (int64_t k = 0; k < half; ++k) {
        const int64_t a = style == RopeStyle::kAdjacentPairs ? 2 * k : k;
        const int64_t b =
            style == RopeStyle::kAdjacentPairs ? 2 * k + 1 : k + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos[k] - x1 * sin[k];
        v[b] = x0 * sin[k] + x1 * cos[k];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace shardlm
