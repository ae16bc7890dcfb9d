#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/check_args.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/threading.h"

namespace shardlm {

namespace {

// out = act(gate) * up over [n, f] host f32 tensors, `op` naming the
// kernel in errors.
template <typename Act>
absl::Status Gated(const char* op, const Tensor& gate, const Tensor& up,
                   Tensor& out, Act act) {
  if (gate.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": not 2-D"));
  }
  const Shape shape = gate.shape();
  if (auto s = CheckHostF32(op, "gate", gate, shape); !s.ok()) return s;
  if (auto s = CheckHostF32(op, "up", up, shape); !s.ok()) return s;
  if (auto s = CheckHostF32(op, "out", out, shape); !s.ok()) return s;
  const int64_t n = gate.numel();
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  ParallelForEach(n, n > 65536, [&](int64_t i) { o[i] = act(g[i]) * u[i]; });
  return absl::OkStatus();
}

}  // namespace

absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& out) {
  return Gated("SwiGlu", gate, up, out,
               [](float g) { return g / (1.0f + std::exp(-g)); });
}

absl::Status GeGlu(const Tensor& gate, const Tensor& up, Tensor& out) {
  return Gated("GeGlu", gate, up, out, [](float g) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g *
           (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
  });
}

}  // namespace shardlm
