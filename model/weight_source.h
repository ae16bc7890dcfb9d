// WeightSource: the tensors of a model file, by canonical name.
//
// Canonical names are GGUF's (token_embd.weight, blk.N.attn_q.weight,
// output_norm.weight, output.weight, ...); readers of other formats map
// their names onto these when they open a file, so nothing above model/
// knows which format a model came from.
#ifndef SHARDLM_MODEL_WEIGHT_SOURCE_H_
#define SHARDLM_MODEL_WEIGHT_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace shardlm {

struct TensorInfo {
  std::string name;  // Canonical name.
  DType dtype = DType::kF32;
  Shape shape;          // Row-major, outermost first: [out, in] for weights.
  int file = 0;         // Index of the file that holds it (sharded formats).
  uint64_t offset = 0;  // Absolute byte offset in that file.
  uint64_t bytes = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  virtual const ModelConfig& config() const = 0;
  // Every tensor, in file order. Offsets and sizes were bounds-checked when
  // the source was opened.
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // The tensor's bytes (memory-mapped; valid while the source lives).
  virtual absl::Span<const uint8_t> Data(const TensorInfo& info) const = 0;
  // A short description of the format ("GGUF v3", "safetensors").
  virtual std::string format() const = 0;

  // Null when there is no tensor of that name.
  const TensorInfo* Find(std::string_view name) const;
  // NotFound naming the tensor, or InvalidArgument when its shape is not
  // `shape`.
  absl::StatusOr<const TensorInfo*> Require(std::string_view name,
                                            const Shape& shape) const;
};

// Opens a GGUF file, or a directory holding config.json and one or more
// *.safetensors files. Every failure names the path and what is wrong.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeights(
    const std::string& path);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_WEIGHT_SOURCE_H_
