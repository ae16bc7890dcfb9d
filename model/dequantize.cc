#include "model/dequantize.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
absl::Status DequantizeRow(DType dtype, const uint8_t* src, int64_t n,
                           float* dst) {
  const DTypeTraits& traits = Traits(dtype);
  if (n % traits.block_elems != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values are not whole ", traits.name, " blocks"));
  }
  if (traits.to_f32 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot dequantize ", traits.name, " to f32"));
  }
  traits.to_f32(src, n / traits.block_elems, dst);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> DequantizeRows(const TensorInfo& info,
                                      absl::Span<const uint8_t> data,
                                      int64_t row_begin, int64_t row_end) {
  if (info.shape.empty() || info.shape.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "' of shape ",
                     ShapeString(info.shape), " is not 1-D or 2-D"));
  }
  const int64_t cols = info.shape.back();
  const int64_t rows = info.shape.size() == 2 ? info.shape[0] : 1;
  if (row_begin < 0 || row_begin > row_end || row_end > rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", row_begin, ", ", row_end, ") of tensor '",
                     info.name, "' with ", rows, " rows"));
  }
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(info.dtype, cols));
  if (static_cast<uint64_t>(rows * row_bytes) != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "' has ", data.size(),
                     " bytes, expected ", rows * row_bytes));
  }
  Shape shape =
      info.shape.size() == 2 ? Shape{row_end - row_begin, cols} : Shape{cols};
  ASSIGN_OR_RETURN(Tensor out, Tensor::Host(DType::kF32, std::move(shape)));
  float* dst = out.data<float>();
  for (int64_t r = row_begin; r < row_end; ++r) {
    RETURN_IF_ERROR(DequantizeRow(info.dtype, data.data() + r * row_bytes, cols,
                                  dst + (r - row_begin) * cols));
  }
  return out;
}

namespace {

// Checks a 2-D slice of a stored tensor; returns (bytes per row, bytes
// before col_begin).
absl::StatusOr<std::pair<int64_t, int64_t>> CheckSlice(
    const TensorInfo& info, absl::Span<const uint8_t> data, int64_t row_begin,
    int64_t row_end, int64_t col_begin, int64_t col_end) {
  if (info.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "' of shape ",
                     ShapeString(info.shape), " is not 2-D"));
  }
  const int64_t rows = info.shape[0], cols = info.shape[1];
  const int64_t block = BlockElems(info.dtype);
  if (row_begin < 0 || row_begin > row_end || row_end > rows || col_begin < 0 ||
      col_begin >= col_end || col_end > cols || col_begin % block != 0 ||
      col_end % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice rows [", row_begin, ", ", row_end, ") cols [", col_begin, ", ",
        col_end, ") of tensor '", info.name, "' ", ShapeString(info.shape),
        " (", DTypeName(info.dtype), " blocks of ", block, ")"));
  }
  ASSIGN_OR_RETURN(const int64_t row_bytes, BytesFor(info.dtype, cols));
  if (static_cast<uint64_t>(rows * row_bytes) != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name, "' has ", data.size(),
                     " bytes, expected ", rows * row_bytes));
  }
  ASSIGN_OR_RETURN(const int64_t skip, BytesFor(info.dtype, col_begin));
  return std::make_pair(row_bytes, skip);
}

}  // namespace

absl::StatusOr<Tensor> DequantizeSlice(const TensorInfo& info,
                                       absl::Span<const uint8_t> data,
                                       int64_t row_begin, int64_t row_end,
                                       int64_t col_begin, int64_t col_end) {
  ASSIGN_OR_RETURN(const auto layout, CheckSlice(info, data, row_begin, row_end,
                                                 col_begin, col_end));
  const auto [row_bytes, skip] = layout;
  const int64_t width = col_end - col_begin;
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::Host(DType::kF32, {row_end - row_begin, width}));
  float* dst = out.data<float>();
  for (int64_t r = row_begin; r < row_end; ++r) {
    RETURN_IF_ERROR(DequantizeRow(info.dtype,
                                  data.data() + r * row_bytes + skip, width,
                                  dst + (r - row_begin) * width));
  }
  return out;
}

absl::StatusOr<Tensor> CopySlice(const TensorInfo& info,
                                 absl::Span<const uint8_t> data,
                                 int64_t row_begin, int64_t row_end,
                                 int64_t col_begin, int64_t col_end) {
  ASSIGN_OR_RETURN(const auto layout, CheckSlice(info, data, row_begin, row_end,
                                                 col_begin, col_end));
  const auto [row_bytes, skip] = layout;
  const int64_t width = col_end - col_begin;
  ASSIGN_OR_RETURN(const int64_t out_row, BytesFor(info.dtype, width));
  ASSIGN_OR_RETURN(Tensor out, Tensor::HostUninitialized(
                                   info.dtype, {row_end - row_begin, width}));
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t r = row_begin; r < row_end; ++r) {
    std::memcpy(dst + (r - row_begin) * out_row,
                data.data() + r * row_bytes + skip, out_row);
  }
  return out;
}

absl::StatusOr<Tensor> DequantizeTensor(const WeightSource& source,
                                        const TensorInfo& info) {
  const int64_t rows = info.shape.size() == 2 ? info.shape[0] : 1;
  return DequantizeRows(info, source.Data(info), 0, rows);
}

}  // namespace shardlm
