// Tensor: a typed, shaped view of memory, optionally owning it.
//
// Shapes are row-major, outermost dimension first (numpy order): a weight
// [out, in] is `out` rows of `in` contiguous values. Quantized dtypes are
// blocked along the innermost dimension.
#ifndef SHARDLM_CORE_TENSOR_H_
#define SHARDLM_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/dtype.h"

namespace shardlm {

// Where a buffer lives. Every buffer carries one, so that no kernel can be
// handed memory of the wrong kind without the launcher noticing.
enum class MemoryType : uint8_t { kHost, kHostPinned, kDevice };

using Shape = std::vector<int64_t>;
std::string ShapeString(const Shape& shape);
int64_t NumElements(const Shape& shape);

// Move-only owner of 64-byte aligned host memory.
class HostBuffer {
 public:
  HostBuffer() = default;
  // Zero-filled unless `zero` is false (for memory that is always written
  // before it is read, such as KV pools, so that untouched pages stay
  // unallocated). Throws std::bad_alloc when memory runs out.
  explicit HostBuffer(size_t bytes, bool zero = true);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled host tensor.
  static absl::StatusOr<Tensor> Host(DType dtype, Shape shape);
  // A new host tensor whose contents are unspecified until written.
  static absl::StatusOr<Tensor> HostUninitialized(DType dtype, Shape shape);
  // A non-owning view; `data` must outlive the tensor and its copies.
  static absl::StatusOr<Tensor> View(DType dtype, Shape shape, void* data,
                                     MemoryType memory = MemoryType::kHost);
  // A tensor over `data`, which `owner` keeps alive: every copy of the
  // tensor shares `owner`, and the last one releases it. Backends use this
  // for device and pinned allocations (backend/backend.h).
  static absl::StatusOr<Tensor> Owning(DType dtype, Shape shape, void* data,
                                       MemoryType memory,
                                       std::shared_ptr<void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return bytes_; }
  MemoryType memory() const { return memory_; }
  bool empty() const { return data_ == nullptr; }

  // The same memory under another shape with as many elements (shares
  // ownership). InvalidArgument when the element counts differ.
  absl::StatusOr<Tensor> Reshaped(Shape shape) const;
  // Rows [begin, end) of the outermost dimension, sharing memory.
  absl::StatusOr<Tensor> Rows(int64_t begin, int64_t end) const;

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  // Host f32 contents; CHECK-fails on another dtype (a programmer error).
  absl::Span<float> f32() const;

  std::string DebugString() const;

 private:
  static absl::StatusOr<Tensor> NewHost(DType dtype, Shape shape, bool zero);

  DType dtype_ = DType::kF32;
  Shape shape_;
  MemoryType memory_ = MemoryType::kHost;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<void> owner_;  // Null for views.
};

}  // namespace shardlm

#endif  // SHARDLM_CORE_TENSOR_H_
