#include "kernels/precision.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

std::atomic<Precision> precision{Precision::kExact};

}  // namespace

void SetPrecision(Precision p) { precision.store(p); }

Precision ActivePrecision() {
  return precision.load(std::memory_order_relaxed);
}

const char* PrecisionName(Precision p) {
  return p == Precision::kFast ? "fast" : "exact";
}

absl::StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name == "exact") return Precision::kExact;
  if (name == "fast") return Precision::kFast;
  return absl::InvalidArgumentError(absl::StrCat(
      "precision must be exact (f32 activations, the default) or fast "
      "(int8 activations and integer dot products), got '",
      std::string(name), "'"));
}

}  // namespace shardlm
