#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/status.h"

namespace shardlm {

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostBuffer::HostBuffer(size_t bytes, bool zero) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  if (data_ == nullptr) throw std::bad_alloc();
  if (zero) std::memset(data_, 0, rounded);
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

HostBuffer::~HostBuffer() { std::free(data_); }

namespace {

absl::StatusOr<size_t> CheckedBytes(DType dtype, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 48) / d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor shape ", ShapeString(shape)));
    }
    n *= d;
  }
  if (!shape.empty() && shape.back() % BlockElems(dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape),
                                                   " is not blocked for ",
                                                   DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(int64_t bytes, BytesFor(dtype, n));
  return static_cast<size_t>(bytes);
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Host(DType dtype, Shape shape) {
  return NewHost(dtype, std::move(shape), /*zero=*/true);
}

absl::StatusOr<Tensor> Tensor::HostUninitialized(DType dtype, Shape shape) {
  return NewHost(dtype, std::move(shape), /*zero=*/false);
}

absl::StatusOr<Tensor> Tensor::NewHost(DType dtype, Shape shape, bool zero) {
  ASSIGN_OR_RETURN(size_t bytes, CheckedBytes(dtype, shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.bytes_ = bytes;
  auto buffer = std::make_shared<HostBuffer>(bytes, zero);
  t.data_ = buffer->data();
  t.owner_ = std::move(buffer);
  return t;
}

absl::StatusOr<Tensor> Tensor::View(DType dtype, Shape shape, void* data,
                                    MemoryType memory) {
  ASSIGN_OR_RETURN(size_t bytes, CheckedBytes(dtype, shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.bytes_ = bytes;
  t.memory_ = memory;
  t.data_ = data;
  return t;
}

absl::StatusOr<Tensor> Tensor::Owning(DType dtype, Shape shape, void* data,
                                      MemoryType memory,
                                      std::shared_ptr<void> owner) {
  ASSIGN_OR_RETURN(Tensor t, View(dtype, std::move(shape), data, memory));
  t.owner_ = std::move(owner);
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshaped(Shape shape) const {
  if (NumElements(shape) != numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot reshape ", DebugString(), " to ", ShapeString(shape)));
  }
  ASSIGN_OR_RETURN(size_t bytes, CheckedBytes(dtype_, shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.bytes_ = bytes;
  return t;
}

absl::StatusOr<Tensor> Tensor::Rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || begin > end || end > shape_[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", begin, ", ", end, ") of ", DebugString()));
  }
  const size_t row_bytes = shape_[0] == 0 ? 0 : bytes_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.bytes_ = row_bytes * (end - begin);
  t.data_ = static_cast<char*>(data_) + row_bytes * begin;
  return t;
}

absl::Span<float> Tensor::f32() const {
  SHARDLM_CHECK(dtype_ == DType::kF32, "f32() on a ", DTypeName(dtype_),
                " tensor");
  SHARDLM_CHECK(memory_ != MemoryType::kDevice, "f32() on device memory");
  return absl::Span<float>(static_cast<float*>(data_),
                           static_cast<size_t>(numel()));
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeString(shape_));
}

}  // namespace shardlm
