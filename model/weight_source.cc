#include "model/weight_source.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/gguf.h"
#include "model/safetensors.h"

namespace shardlm {

const TensorInfo* WeightSource::Find(std::string_view name) const {
  for (const TensorInfo& t : tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<const TensorInfo*> WeightSource::Require(
    std::string_view name, const Shape& shape) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model has no tensor '", Sv(name), "'"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", Sv(name), "' has shape ",
                     ShapeString(t->shape), ", expected ", ShapeString(shape)));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeights(
    const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return OpenSafetensorsWeights(path);
  }
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model path ", path, " does not exist"));
  }
  return OpenGgufWeights(path);
}

}  // namespace shardlm
