// Rotary position embedding: how a head's dimensions are paired, and how
// the rotation frequencies are stretched for contexts beyond the training
// length (RoPE scaling, as Hugging Face transformers' modeling_rope_utils
// defines each type and llama.cpp stores it in GGUF).
#ifndef SHARDLM_MODEL_ROPE_SCALING_H_
#define SHARDLM_MODEL_ROPE_SCALING_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardlm {

// How RoPE pairs the dimensions of a head. llama.cpp's converter permutes
// the Q/K rows of Llama weights, so GGUF files rotate adjacent pairs
// (x[2i], x[2i+1]); Hugging Face weights (and GGUF Qwen2, which llama.cpp
// runs "NeoX" style) rotate halves (x[i], x[i+d/2]). Using the wrong one
// gives plausible but wrong text.
enum class RopeStyle : uint8_t { kAdjacentPairs, kRotateHalf };

enum class RopeScalingType : uint8_t {
  kNone,
  kLinear,   // Positions divided by `factor` (every frequency / factor).
  kLlama3,   // Llama 3.1: low frequencies / factor, high kept, a smooth ramp
             // between (wavelengths against original_context).
  kYarn,     // YaRN: per-frequency blend of interpolation and extrapolation
             // by a linear ramp over the correction range, and cos/sin
             // scaled by attention_factor.
  kDynamic,  // NTK-aware ("dynamic" in transformers), static: the base
             // scaled once for the longest sequence served,
             // factor * original_context, by transformers' formula
             // (factor * len / original - (factor - 1))^(d / (d - 2)).
             // See docs/design-notes.md for why not per sequence.
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // llama3, yarn, dynamic: the training context (dynamic: transformers'
  // max_position_embeddings, which the served context is factor times).
  int64_t original_context = 0;
  double low_freq_factor = 1.0;  // llama3.
  double high_freq_factor = 4.0;
  double beta_fast = 32.0;  // yarn: the correction range, in rotations.
  double beta_slow = 1.0;
  // yarn: the correction range rounded out to whole dimensions (floor,
  // ceil), as llama.cpp and transformers by default do; gpt-oss's config
  // says truncate false, keeping it fractional.
  bool truncate = true;
  double attention_factor = 0.0;  // yarn; 0: 0.1 ln(factor) + 1.
  // Divisors of the head's frequencies, one per pair, as llama.cpp's
  // converter stores llama3 scaling (the GGUF tensor rope_freqs.weight);
  // empty when none. Applied on top of `type`.
  std::vector<float> freq_factors;
};

const char* RopeScalingName(RopeScalingType type);
// "linear", "llama3", "yarn", "dynamic" (and "default"/"none" as kNone);
// NotFound otherwise.
absl::StatusOr<RopeScalingType> ParseRopeScalingType(std::string_view name);

// InvalidArgument naming the field when a parameter is missing or absurd
// for its type, or freq_factors is not head_dim / 2 positive values.
absl::Status ValidateRopeScaling(const RopeScaling& s, int64_t head_dim);

// What a RoPE kernel applies: pair k of a head rotates by
// position * inv_freq[k]; cos and sin are multiplied by mscale.
struct RopeTable {
  RopeStyle style = RopeStyle::kRotateHalf;
  std::vector<double> inv_freq;  // [head_dim / 2]
  double mscale = 1.0;
  // inv_freq[k] = theta^(-2k / head_dim) and mscale 1 (the only case the
  // CUDA kernel computes itself, from theta): no scaling, or static NTK,
  // whose theta is then the scaled base.
  bool plain = true;
  float theta = 10000.0f;
};

// The table of a head of `head_dim` dimensions with base `theta`.
// Requires ValidateRopeScaling(scaling, head_dim).ok().
RopeTable MakeRopeTable(RopeStyle style, float theta, int64_t head_dim,
                        const RopeScaling& scaling);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_ROPE_SCALING_H_
