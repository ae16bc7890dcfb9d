// The precision of CPU matrix products: one declared mode per process
// (issue #60), sent to every rank in the assignment.
//   - kExact (the default, and what every correctness test runs): f32
//     activations times the weights' values; logits within 1e-3 of the
//     numpy reference.
//   - kFast: each matrix input is quantized to int8 per run of 32 values
//     (one f32 scale each, round to nearest), as llama.cpp does, and
//     multiplied by the weights' int8 codes in integer dot products (AVX2
//     maddubs, AVX-512 VNNI vpdpbusd), exact in int32 per 32 (or 16)
//     values, then scaled in f32. Block-quantized weights only: f32
//     weights, the norms and attention stay f32. Its distance from kExact
//     is measured (bench/precision_bench.py), not assumed.
// GPUs keep bf16 activations in either mode, and the engine refuses
// kFast there with that reason.
#ifndef SHARDLM_KERNELS_PRECISION_H_
#define SHARDLM_KERNELS_PRECISION_H_

#include <string_view>

#include "absl/status/statusor.h"

namespace shardlm {

enum class Precision { kExact, kFast };

// Not thread-safe against running kernels: set it before the first step
// (the engine and the worker do, from their options and the assignment).
void SetPrecision(Precision p);
Precision ActivePrecision();

// "exact" / "fast".
const char* PrecisionName(Precision p);
absl::StatusOr<Precision> ParsePrecision(std::string_view name);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_PRECISION_H_
