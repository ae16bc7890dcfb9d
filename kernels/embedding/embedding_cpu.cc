#include <cstring>

#include "kernels/check_args.h"
#include "kernels/embedding/embedding.h"

namespace shardlm {

absl::Status Embedding(const Tensor& table, absl::Span<const int32_t> ids,
                       int64_t vocab_begin, Tensor& out) {
  if (table.rank() != 2) {
    return absl::InvalidArgumentError("Embedding: table must be 2-D");
  }
  const int64_t rows = table.dim(0), hidden = table.dim(1);
  const int64_t n = static_cast<int64_t>(ids.size());
  if (auto s = CheckHostF32("Embedding", "table", table, {rows, hidden});
      !s.ok()) {
    return s;
  }
  if (auto s = CheckHostF32("Embedding", "out", out, {n, hidden}); !s.ok()) {
    return s;
  }
  const float* src = table.data<float>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids[i] - vocab_begin;
    if (row >= 0 && row < rows) {
      std::memcpy(dst + i * hidden, src + row * hidden, hidden * sizeof(float));
    } else {
      std::memset(dst + i * hidden, 0, hidden * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
