#include <cmath>

#include "kernels/check_args.h"
#include "kernels/swiglu/swiglu.h"

namespace shardlm {

absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (gate.rank() != 2) return absl::InvalidArgumentError("SwiGlu: not 2-D");
  const Shape shape = gate.shape();
  if (auto s = CheckHostF32("SwiGlu", "gate", gate, shape); !s.ok()) return s;
  if (auto s = CheckHostF32("SwiGlu", "up", up, shape); !s.ok()) return s;
  if (auto s = CheckHostF32("SwiGlu", "out", out, shape); !s.ok()) return s;
  const int64_t n = gate.numel();
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  return absl::OkStatus();
}

}  // namespace shardlm
