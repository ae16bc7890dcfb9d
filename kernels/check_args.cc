#include "kernels/check_args.h"

#include <algorithm>
#include <string>

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

absl::Status CheckDevice(std::string_view op, std::string_view arg,
                         const Tensor& t, const Shape& shape,
                         std::initializer_list<DType> dtypes) {
  const bool dtype_ok =
      std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end();
  if (t.empty() && NumElements(shape) == 0 && t.shape() == shape && dtype_ok) {
    return absl::OkStatus();
  }
  if (t.empty() || !dtype_ok || t.memory() != MemoryType::kDevice ||
      t.shape() != shape) {
    std::string want;
    for (DType d : dtypes) {
      absl::StrAppend(&want, want.empty() ? "" : "|", DTypeName(d));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(op), ": ", Sv(arg), " is ", t.empty() ? "empty" : t.DebugString(),
        t.memory() == MemoryType::kDevice ? "" : " in host memory",
        ", expected device ", want, ShapeString(shape)));
  }
  return absl::OkStatus();
}

}  // namespace shardlm
