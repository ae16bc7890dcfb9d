// Host side of the device layout of Q8_0 / Q4_0 weights
// (quant_device_layout.h): repacking GGUF blocks into it, a reference
// dequantizer of the packed form (through the same index arithmetic the
// CUDA kernels use), the dequantization scratch's size, and the argument
// checks of the CUDA entry points (LinearQuantizedCuda, kernels/cuda_ops.h),
// all plain C++ so that they are tested on CPUs.
#ifndef SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_PACK_H_
#define SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_PACK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/linear/quant_device_layout.h"

namespace shardlm {

// Whether `t` has a device layout (Q8_0, Q4_0).
bool HasDeviceQuantLayout(DType t);
// Its format; InvalidArgument naming the dtype for the others.
absl::StatusOr<quant_layout::QuantFormat> DeviceQuantFormat(DType t);

// Bytes of a packed [out, in] matrix of `t`. InvalidArgument when `t` has
// no device layout, `in` is not a positive multiple of 32 or `out` is not
// positive.
absl::StatusOr<int64_t> PackedQuantBytes(DType t, int64_t out, int64_t in);

// Repacks a host GGUF matrix of `t` ([out, in] blocks as loaded) into the
// device layout, in a new host tensor of the same dtype and shape (and
// byte size): what the upload copies to the device byte for byte.
absl::StatusOr<Tensor> PackQuantized(const Tensor& gguf);

// Row `row` of a packed [out, in] matrix of `t` (`packed` holding
// PackedQuantBytes) into `dst` (in floats), as the CUDA kernels read it.
// Equal to DequantizeRow (model/dequantize.h) of the GGUF row, exactly.
absl::Status DequantizePacked(DType t, const uint8_t* packed, int64_t out,
                              int64_t in, int64_t row, float* dst);

// Decode steps of up to this many rows of x take the quantized GEMV; more
// go through dequantization into a scratch and cuBLAS.
inline constexpr int64_t kQuantGemvMaxRows = 8;

// The dequantization scratch of a rank that keeps quantized weights: bf16
// for at most this many values (64 MiB), filled with one chunk of output
// rows of a weight at a time (so that its size does not grow with the
// model: the largest matrix of an 8B model, its LM head, is 1 GiB in bf16).
inline constexpr int64_t kDequantScratchMaxElems = int64_t{32} << 20;
// Bytes of the scratch when the largest matrix kept quantized has
// `largest_elems` values (out * in): bf16 for min(that, the cap); 0 when
// none is.
int64_t DequantScratchBytes(int64_t largest_elems);
// Output rows of an [out, in] matrix dequantized per chunk into a scratch
// of `scratch_elems` bf16 values (at least 1; at most out).
int64_t DequantChunkRows(int64_t out, int64_t in, int64_t scratch_elems);

// The checks of LinearQuantizedCuda's GEMV (kernels/cuda_ops.h), before
// anything is queued: x [n, in] bf16 with 1 <= n <= kQuantGemvMaxRows,
// w a packed [out, in] Q8_0 / Q4_0 tensor of PackedQuantBytes, y [n, out]
// f32 or bf16; all in device memory, x and w 16-byte aligned. n = 0 is
// allowed (nothing to do). InvalidArgument naming the argument.
absl::Status CheckQuantGemvArgs(const Tensor& x, const Tensor& w,
                                const Tensor& y);
// The checks of DequantizePackedCuda: w as above, rows [row_begin,
// row_end) of it into dst [row_end - row_begin, in] bf16 on the device,
// 16-byte aligned.
absl::Status CheckDequantizePackedArgs(const Tensor& w, int64_t row_begin,
                                       int64_t row_end, const Tensor& dst);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_LINEAR_QUANT_DEVICE_PACK_H_
