#include <cstring>

#include "core/status.h"
#include "kernels/check_args.h"
#include "kernels/embedding/embedding.h"
#include "model/dequantize.h"

namespace shardlm {

absl::Status Embedding(const Tensor& table, absl::Span<const int32_t> ids,
                       int64_t vocab_begin, Tensor& out) {
  if (table.rank() != 2) {
    return absl::InvalidArgumentError("Embedding: table must be 2-D");
  }
  const int64_t rows = table.dim(0), hidden = table.dim(1);
  const int64_t n = static_cast<int64_t>(ids.size());
  // A quantized table (GGUF blocks) is dequantized row by row.
  const bool quantized = IsQuantized(table.dtype());
  if (quantized) {
    if (table.memory() != MemoryType::kHost ||
        hidden % BlockElems(table.dtype()) != 0) {
      return absl::InvalidArgumentError(
          "Embedding: a quantized table must be on the host, rows of whole "
          "blocks");
    }
  } else if (auto s = CheckHostF32("Embedding", "table", table, {rows, hidden});
             !s.ok()) {
    return s;
  }
  if (auto s = CheckHostF32("Embedding", "out", out, {n, hidden}); !s.ok()) {
    return s;
  }
  float* dst = out.data<float>();
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(table.dtype(), hidden));
  const auto* src = static_cast<const uint8_t*>(table.raw());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids[i] - vocab_begin;
    if (row >= 0 && row < rows && quantized) {
      RETURN_IF_ERROR(DequantizeRow(table.dtype(), src + row * row_bytes,
                                    hidden, dst + i * hidden));
    } else if (row >= 0 && row < rows) {
      std::memcpy(dst + i * hidden, src + row * row_bytes,
                  hidden * sizeof(float));
    } else {
      std::memset(dst + i * hidden, 0, hidden * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
