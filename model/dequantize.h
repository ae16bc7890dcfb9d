// Conversion of stored weights (any DType) to f32.
#ifndef SHARDLM_MODEL_DEQUANTIZE_H_
#define SHARDLM_MODEL_DEQUANTIZE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "model/weight_source.h"

namespace shardlm {

// Converts `n` consecutive values stored as `dtype` at `src` into `dst`
// (f32). `n` must be a whole number of blocks; `src` must hold
// BytesFor(dtype, n) bytes.
absl::Status DequantizeRow(DType dtype, const uint8_t* src, int64_t n,
                           float* dst);

// Rows [row_begin, row_end) of a 2-D (or 1-D, as one row) stored tensor as
// a new f32 host tensor of shape [row_end - row_begin, cols] (or [cols] for
// 1-D). Used to load a whole tensor or one rank's slice of it.
absl::StatusOr<Tensor> DequantizeRows(const TensorInfo& info,
                                      absl::Span<const uint8_t> data,
                                      int64_t row_begin, int64_t row_end);

// The block rows [row_begin, row_end) x columns [col_begin, col_end) of a
// 2-D stored tensor as a new f32 tensor [rows, cols], reading only the
// bytes of those columns. Column bounds must fall on block boundaries of
// the dtype (multiples of 32 for quantized types).
absl::StatusOr<Tensor> DequantizeSlice(const TensorInfo& info,
                                       absl::Span<const uint8_t> data,
                                       int64_t row_begin, int64_t row_end,
                                       int64_t col_begin, int64_t col_end);

// The same slice kept in its stored format (blocks copied byte for byte):
// a new host tensor of info.dtype [rows, cols]. Same bounds rules.
absl::StatusOr<Tensor> CopySlice(const TensorInfo& info,
                                 absl::Span<const uint8_t> data,
                                 int64_t row_begin, int64_t row_end,
                                 int64_t col_begin, int64_t col_end);

// The whole tensor as f32.
absl::StatusOr<Tensor> DequantizeTensor(const WeightSource& source,
                                        const TensorInfo& info);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_DEQUANTIZE_H_
