// The CUDA backend: device and pinned host memory, streams and events on
// one device, as move-only owners. CUDA-free header (handles are void*);
// link shardlm_backend_cuda (built only when SHARDLM_WITH_CUDA).
#ifndef SHARDLM_BACKEND_CUDA_BACKEND_H_
#define SHARDLM_BACKEND_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/backend.h"

namespace shardlm {

// The number of visible CUDA devices. FailedPrecondition carrying CUDA's
// reason when there are none (no driver, no device), so that tests can
// skip saying why.
absl::StatusOr<int> CudaDeviceCount();

// The UUID of CUDA device `device` as nvidia-smi prints it
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"): the same GPU has the same
// UUID in every process, whatever CUDA_VISIBLE_DEVICES renumbers.
absl::StatusOr<std::string> CudaDeviceUuid(int device);

// Move-only owner of cudaMalloc'd memory on one device.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, int device);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

// Move-only owner of page-locked host memory (cudaMallocHost), which
// asynchronous copies need.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Owns a non-blocking cudaStream_t on one device.
class CudaStream final : public Stream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(int device);
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() override;

  void* native() const override { return stream_; }
  int device() const { return device_; }
  absl::Status Synchronize() override;

 private:
  CudaStream(void* stream, int device) : stream_(stream), device_(device) {}
  void* stream_;
  int device_;
};

// Owns a cudaEvent_t (timing disabled).
class CudaEvent final : public Event {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEvent>> Create(int device);
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() override;

  absl::Status Record(Stream& stream) override;
  absl::Status Wait(Stream& stream) override;
  absl::StatusOr<bool> Done() override;
  absl::Status Synchronize() override;

 private:
  CudaEvent(void* event, int device) : event_(event), device_(device) {}
  void* event_;
  int device_;
};

// Allocates kHost, kHostPinned and kDevice tensors on `device` and copies
// between any of them (cudaMemcpyAsync; pageable host memory makes a copy
// synchronous, as CUDA does). Thread-compatible.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device);

}  // namespace shardlm

#endif  // SHARDLM_BACKEND_CUDA_BACKEND_H_
