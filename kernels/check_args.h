// Argument checks shared by kernel launchers: launchers validate shapes,
// dtypes and memory types and return InvalidArgument; kernels only compute.
#ifndef SHARDLM_KERNELS_CHECK_ARGS_H_
#define SHARDLM_KERNELS_CHECK_ARGS_H_

#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// OK when `t` is a host f32 tensor of exactly `shape`.
absl::Status CheckHostF32(std::string_view op, std::string_view arg,
                          const Tensor& t, const Shape& shape);

// OK when `t` is device memory of exactly `shape` and one of `dtypes` (an
// empty tensor of an empty shape passes).
absl::Status CheckDevice(std::string_view op, std::string_view arg,
                         const Tensor& t, const Shape& shape,
                         std::initializer_list<DType> dtypes);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_CHECK_ARGS_H_
