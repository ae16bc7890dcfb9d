// Backend: where tensors live and how bytes move between memories.
//
// A Backend allocates tensors of the memory types it reaches (host always;
// pinned host and device on CUDA), copies between them, and hands out
// streams and events. Streams and events are move-only owners of the
// native handle (cudaStream_t / cudaEvent_t on CUDA; nothing on CPU, where
// every operation is complete when it returns). Every native error becomes
// a Status; nothing here aborts.
//
// Layering: core <- backend <- kernels. This header is CUDA-free; the CUDA
// implementation lives in cuda_backend.{h,cc} (library
// shardlm_backend_cuda, built only when SHARDLM_WITH_CUDA).
#ifndef SHARDLM_BACKEND_BACKEND_H_
#define SHARDLM_BACKEND_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace shardlm {

// An ordered queue of work on one device. Not thread-safe.
class Stream {
 public:
  virtual ~Stream() = default;
  // The native handle (a cudaStream_t on CUDA), null on CPU.
  virtual void* native() const = 0;
  // Returns when all work queued so far has finished.
  virtual absl::Status Synchronize() = 0;
};

// A marker in a stream, for ordering streams and polling progress.
class Event {
 public:
  virtual ~Event() = default;
  // Marks the current end of `stream`.
  virtual absl::Status Record(Stream& stream) = 0;
  // Makes later work on `stream` wait until the recorded point is reached.
  virtual absl::Status Wait(Stream& stream) = 0;
  // True once the recorded work has finished (true if never recorded).
  virtual absl::StatusOr<bool> Done() = 0;
  virtual absl::Status Synchronize() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:<device>".
  virtual const std::string& name() const = 0;
  // Whether `memory` can be allocated and touched by this backend.
  virtual bool Supports(MemoryType memory) const = 0;

  // A new tensor owning its memory (freed with the last copy of the
  // tensor). Host memory is zero-filled; pinned and device memory are
  // unspecified until written. InvalidArgument for an unsupported memory
  // type or a bad shape, ResourceExhausted when memory runs out.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape,
                                          MemoryType memory) = 0;

  // dst = src, byte for byte (same dtype and byte size; any memory types
  // this backend supports). With a stream the copy is queued on it and may
  // still be running on return (keep both tensors alive until the stream
  // is synchronized); with null it is complete on return.
  virtual absl::Status Copy(const Tensor& src, Tensor& dst,
                            Stream* stream = nullptr) = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
};

// Host memory only; copies are memcpy, streams and events are no-ops.
std::unique_ptr<Backend> NewCpuBackend();

// The argument checks Copy implementations share: same dtype and bytes.
absl::Status CheckCopyArgs(const Tensor& src, const Tensor& dst);

}  // namespace shardlm

#endif  // SHARDLM_BACKEND_BACKEND_H_
