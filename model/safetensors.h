// safetensors + config.json reader (Hugging Face model directories).
#ifndef SHARDLM_MODEL_SAFETENSORS_H_
#define SHARDLM_MODEL_SAFETENSORS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace shardlm {

// The model configuration in `dir`/config.json, checked as
// OpenSafetensorsWeights checks it (unsupported features are refused by
// name).
absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& dir);

// Opens a directory with config.json and one or more *.safetensors files.
// Tensor names are mapped to canonical (GGUF) names; RoPE is rotate-half.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsWeights(
    const std::string& dir);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_SAFETENSORS_H_
