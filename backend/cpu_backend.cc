#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "backend/backend.h"
#include "core/status.h"

namespace shardlm {
namespace {

const char* MemoryName(MemoryType m) {
  switch (m) {
    case MemoryType::kHost:
      return "host";
    case MemoryType::kHostPinned:
      return "pinned host";
    case MemoryType::kDevice:
      return "device";
  }
  return "?";
}

class CpuStream final : public Stream {
 public:
  void* native() const override { return nullptr; }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

class CpuEvent final : public Event {
 public:
  absl::Status Record(Stream&) override { return absl::OkStatus(); }
  absl::Status Wait(Stream&) override { return absl::OkStatus(); }
  absl::StatusOr<bool> Done() override { return true; }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

class CpuBackend final : public Backend {
 public:
  const std::string& name() const override { return name_; }
  bool Supports(MemoryType memory) const override {
    return memory == MemoryType::kHost;
  }

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape,
                                  MemoryType memory) override {
    if (!Supports(memory)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cpu backend cannot allocate ", MemoryName(memory), " memory"));
    }
    try {
      return Tensor::Host(dtype, shape);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu backend: out of memory for ", DTypeName(dtype),
                       ShapeString(shape)));
    }
  }

  absl::Status Copy(const Tensor& src, Tensor& dst, Stream*) override {
    RETURN_IF_ERROR(CheckCopyArgs(src, dst));
    if (!Supports(src.memory()) || !Supports(dst.memory())) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend cannot copy ", MemoryName(src.memory()),
                       " to ", MemoryName(dst.memory()), " memory"));
    }
    if (src.bytes() > 0) std::memmove(dst.raw(), src.raw(), src.bytes());
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::make_unique<CpuStream>();
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::make_unique<CpuEvent>();
  }

 private:
  std::string name_ = "cpu";
};

}  // namespace

absl::Status CheckCopyArgs(const Tensor& src, const Tensor& dst) {
  if (src.dtype() != dst.dtype() || src.bytes() != dst.bytes() ||
      (src.bytes() > 0 && (src.empty() || dst.empty()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy from ", src.DebugString(), " to ", dst.DebugString(),
                     ": dtype and size must match"));
  }
  return absl::OkStatus();
}

std::unique_ptr<Backend> NewCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace shardlm
