// gpt-oss's experts as its Hugging Face folders hold them, read one expert
// matrix at a time into the layout the CPU kernels take (model/safetensors.cc
// names them):
//   MXFP4, as shipped: blk.N.ffn_gate_up_exps.blocks [experts, 2f, in / 32,
//   16] u8 with .scales [experts, 2f, in / 32] u8 (gate's rows even, up's
//   odd; byte j of a block holds values 2j and 2j + 1, low nibble first;
//   the scale 2^(e - 127)), and ffn_down_exps.blocks / .scales [experts,
//   hidden, f / 32, ...]: repacked into GGUF's MXFP4 blocks (e, then 16
//   bytes holding values j and j + 16), bit for bit the same values;
//   dequantized (transformers' GptOssExperts parameters):
//   ffn_gate_up_exps.weight_t [experts, hidden, 2f] and
//   ffn_down_exps.weight_t [experts, f, hidden], input-major: read as f32
//   [out, in].
// The gate and up biases, ffn_gate_up_exps.bias [experts, 2f], are
// interleaved the same way.
#ifndef SHARDLM_WORKER_GPT_OSS_EXPERTS_H_
#define SHARDLM_WORKER_GPT_OSS_EXPERTS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "model/weight_source.h"

namespace shardlm {

// Whether layer `layer` holds its experts in either gpt-oss form.
bool HasGptOssExperts(const WeightSource& source, int64_t layer);

// Every tensor of the layer's experts present with its shape (`experts`
// experts of `f` columns over `hidden`), nothing read; InvalidArgument or
// NotFound naming the tensor otherwise.
absl::Status CheckGptOssExperts(const WeightSource& source, int64_t layer,
                                int64_t experts, int64_t f, int64_t hidden);

// Expert `e`'s matrix `kind` ("ffn_gate", "ffn_up" [f, hidden] or
// "ffn_down" [hidden, f]): MXFP4 blocks [rows, cols / 32 * 17 bytes] from
// the MXFP4 form, f32 [rows, cols] from the dequantized one.
absl::StatusOr<Tensor> ReadGptOssExpert(const WeightSource& source,
                                        int64_t layer, std::string_view kind,
                                        int64_t e, int64_t experts, int64_t f,
                                        int64_t hidden);

// Experts [e0, e1)'s gate (`up` false) or up biases, columns [c0, c1) of
// `f`, as f32 [e1 - e0, c1 - c0].
absl::StatusOr<Tensor> ReadGptOssGateUpBias(const WeightSource& source,
                                            int64_t layer, bool up,
                                            int64_t experts, int64_t f,
                                            int64_t e0, int64_t e1, int64_t c0,
                                            int64_t c1);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_GPT_OSS_EXPERTS_H_
