// Argument checks shared by the Communicator implementations, so that every
// backend rejects the same bad calls with the same InvalidArgument text.
// They look only at the caller's own tensors; agreement across ranks is
// each implementation's business.
#ifndef SHARDLM_COLLECTIVES_ARG_CHECKS_H_
#define SHARDLM_COLLECTIVES_ARG_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// The memory an implementation can reach: host (kHost, kHostPinned) or
// device (kDevice).
enum class Reach : uint8_t { kHost, kDevice };

absl::Status CheckAllReduceArgs(const std::string& group, Reach reach,
                                const Tensor& send, const Tensor& recv);
absl::Status CheckAllGatherArgs(const std::string& group, Reach reach, int size,
                                const Tensor& send, const Tensor& recv);
absl::Status CheckBroadcastArgs(const std::string& group, Reach reach, int size,
                                const Tensor& data, int root);
// `op` is "Send" or "Recv"; `peer` must be another rank of the group.
absl::Status CheckPeerArgs(const std::string& group, Reach reach,
                           const char* op, int rank, int size,
                           const Tensor& data, int peer);
// InvalidArgument unless `dtype` is one of the element types AllReduce
// supports on this backend (F32 and I32 on every backend).
absl::Status CheckReducible(const std::string& group, DType dtype,
                            bool allow_half);

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_ARG_CHECKS_H_
