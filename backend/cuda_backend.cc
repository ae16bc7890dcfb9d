#include "backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda_status.h"
#include "core/status.h"

namespace shardlm {

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // Clear it: this is an answer, not a failure.
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
        cudaGetErrorString(e), ")"));
  }
  if (n == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device: cudaGetDeviceCount returned 0");
  }
  return n;
}

absl::StatusOr<std::string> CudaDeviceUuid(int device) {
  cudaDeviceProp prop{};
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device));
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%"
      "02x",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
      b[12], b[13], b[14], b[15]);
}

// DeviceBuffer

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, int device) {
  DeviceBuffer b;
  b.device_ = device;
  b.size_ = bytes;
  if (bytes == 0) return b;
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  const cudaError_t e = cudaMalloc(&b.data_, bytes);
  if (e != cudaSuccess) {
    b.data_ = nullptr;
    cudaGetLastError();
    return CudaStatus(
        e, absl::StrCat("cudaMalloc of ", bytes, " bytes on device ", device)
               .c_str());
  }
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  // cudaFree synchronizes the device; an error here (a dead context) has
  // nobody to report to.
  if (data_ != nullptr) cudaFree(data_);
}

// PinnedBuffer

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  b.size_ = bytes;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMallocHost(&b.data_, bytes);
  if (e != cudaSuccess) {
    b.data_ = nullptr;
    cudaGetLastError();
    return CudaStatus(
        e, absl::StrCat("cudaMallocHost of ", bytes, " bytes").c_str());
  }
  return b;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

// CudaStream

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<CudaStream>(new CudaStream(s, device));
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status CudaStream::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                    "cudaStreamSynchronize");
}

// CudaEvent

absl::StatusOr<std::unique_ptr<CudaEvent>> CudaEvent::Create(int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return std::unique_ptr<CudaEvent>(new CudaEvent(e, device));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

absl::Status CudaEvent::Record(Stream& stream) {
  return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                    static_cast<cudaStream_t>(stream.native())),
                    "cudaEventRecord");
}

absl::Status CudaEvent::Wait(Stream& stream) {
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()),
                          static_cast<cudaEvent_t>(event_), 0),
      "cudaStreamWaitEvent");
}

absl::StatusOr<bool> CudaEvent::Done() {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  return CudaStatus(e, "cudaEventQuery");
}

absl::Status CudaEvent::Synchronize() {
  return CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)),
                    "cudaEventSynchronize");
}

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device)
      : device_(device), name_(absl::StrCat("cuda:", device)) {}

  const std::string& name() const override { return name_; }
  bool Supports(MemoryType) const override { return true; }

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape,
                                  MemoryType memory) override {
    if (memory == MemoryType::kHost) return Tensor::Host(dtype, shape);
    // The shape check (and its byte count) comes from a host view.
    ASSIGN_OR_RETURN(Tensor probe, Tensor::View(dtype, shape, nullptr));
    if (memory == MemoryType::kDevice) {
      ASSIGN_OR_RETURN(DeviceBuffer b,
                       DeviceBuffer::Allocate(probe.bytes(), device_));
      auto owner = std::make_shared<DeviceBuffer>(std::move(b));
      return Tensor::Owning(dtype, shape, owner->data(), memory, owner);
    }
    ASSIGN_OR_RETURN(PinnedBuffer b, PinnedBuffer::Allocate(probe.bytes()));
    auto owner = std::make_shared<PinnedBuffer>(std::move(b));
    return Tensor::Owning(dtype, shape, owner->data(), memory, owner);
  }

  absl::Status Copy(const Tensor& src, Tensor& dst, Stream* stream) override {
    RETURN_IF_ERROR(CheckCopyArgs(src, dst));
    if (src.bytes() == 0) return absl::OkStatus();
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
    // No stream: this thread's own default stream, synchronized below, not
    // the legacy stream (which would wait for every other stream).
    cudaStream_t s = stream == nullptr
                         ? cudaStreamPerThread
                         : static_cast<cudaStream_t>(stream->native());
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(),
                                         cudaMemcpyDefault, s));
    if (stream == nullptr) RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> s,
                     CudaStream::Create(device_));
    return std::unique_ptr<Stream>(std::move(s));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaEvent> e, CudaEvent::Create(device_));
    return std::unique_ptr<Event>(std::move(e));
  }

 private:
  int device_;
  std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  ASSIGN_OR_RETURN(int n, CudaDeviceCount());
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " of ", n));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device));
}

}  // namespace shardlm
