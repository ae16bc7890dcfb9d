// A WeightSource held in memory: for tests, and for tools that build a
// model without a file (e.g. a random model of a given config).
#ifndef SHARDLM_MODEL_IN_MEMORY_WEIGHTS_H_
#define SHARDLM_MODEL_IN_MEMORY_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/weight_source.h"

namespace shardlm {

class InMemoryWeights : public WeightSource {
 public:
  explicit InMemoryWeights(ModelConfig config) : config_(std::move(config)) {}

  // Adds an f32 tensor with canonical name `name`.
  void AddF32(std::string name, Shape shape, std::vector<float> values);
  // Adds a tensor of any dtype from its stored bytes (BytesFor(dtype,
  // elements) of them).
  void AddRaw(std::string name, DType dtype, Shape shape,
              std::vector<uint8_t> bytes);

  const ModelConfig& config() const override { return config_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  absl::Span<const uint8_t> Data(const TensorInfo& info) const override;
  std::string format() const override { return "in-memory"; }

 private:
  ModelConfig config_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<uint8_t>> data_;  // Indexed by TensorInfo::file.
};

// A small Llama shape for tests: 4 layers, hidden 64, FFN 128, 4 query
// and 2 KV heads of 16, vocabulary 97, context 64. Tests adjust fields.
ModelConfig SmallTestConfig();

// A Llama model of `config` with seeded normal weights (fan-in scaled) and
// norms near 1: every tensor LoadLlamaWeights needs (Qwen3's QK norms and
// a mixture's router and experts, one tensor each, a hybrid's Gated
// DeltaNet layers and gated attention, when the config has them).
std::unique_ptr<InMemoryWeights> RandomLlamaWeights(const ModelConfig& config,
                                                    uint32_t seed);

// The same with every matrix but the embedding in block format `matrices`
// (random blocks, quant::FillRandomBlocks, of about the same scale). Rows
// must be whole blocks of it.
std::unique_ptr<InMemoryWeights> RandomLlamaWeights(const ModelConfig& config,
                                                    uint32_t seed,
                                                    DType matrices);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_IN_MEMORY_WEIGHTS_H_
