#include "kernels/check_args.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {

absl::Status CheckHostF32(std::string_view op, std::string_view arg,
                          const Tensor& t, const Shape& shape) {
  if (t.empty() || t.dtype() != DType::kF32 ||
      t.memory() == MemoryType::kDevice || t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(op), ": ", Sv(arg), " is ", t.empty() ? "empty" : t.DebugString(),
        t.memory() == MemoryType::kDevice ? " on the device" : "",
        ", expected host F32", ShapeString(shape)));
  }
  return absl::OkStatus();
}

}  // namespace shardlm
