#include "core/dtype.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace shardlm {

int64_t BlockElems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      return 32;
    default:
      return 1;
  }
}

int64_t BlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kQ8_0:
      return 2 + 32;
    case DType::kQ4_0:
      return 2 + 16;
    case DType::kQ4_1:
      return 2 + 2 + 16;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kI32:
      return "I32";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

bool IsQuantized(DType t) { return BlockElems(t) > 1; }

absl::StatusOr<int64_t> BytesFor(DType t, int64_t n) {
  const int64_t block = BlockElems(t);
  if (n < 0 || n % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values is not a whole number of ", DTypeName(t),
                     " blocks of ", block));
  }
  const int64_t blocks = n / block;
  if (blocks > std::numeric_limits<int64_t>::max() / BlockBytes(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values of ", DTypeName(t), " overflow a size"));
  }
  return blocks * BlockBytes(t);
}

}  // namespace shardlm
