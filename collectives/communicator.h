// Communicator: collectives and point-to-point transfers within one group
// of ranks (the TP group of a stage, or the PP chain of one TP index).
//
// Buffers are Tensors, so every call knows its dtype, element count and
// memory type; an implementation rejects memory it cannot reach (MPI takes
// host memory, NCCL device memory) with InvalidArgument. Every wait on a
// peer has a deadline: on expiry the call returns DeadlineExceeded naming
// the group and the peer(s) it was waiting for, and the communicator is
// unusable afterwards (Unavailable). Not thread-safe: one thread per
// communicator.
#ifndef SHARDLM_COLLECTIVES_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"

namespace shardlm {

enum class ReduceOp : uint8_t { kSum, kMax };

struct CommOptions {
  absl::Duration timeout = absl::Seconds(30);  // Per call.
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // Within this group.
  virtual int size() const = 0;
  // Human-readable group name for errors, e.g. "tp group of stage 1".
  virtual const std::string& name() const = 0;

  // Element-wise reduction over the group into every rank's `recv`.
  // `send` and `recv` have equal dtype and element count; in place when
  // they are the same tensor. F32 always; other dtypes where supported.
  virtual absl::Status AllReduce(const Tensor& send, Tensor& recv,
                                 ReduceOp op) = 0;
  // recv = concatenation of every rank's `send` in rank order:
  // recv.numel() == size() * send.numel().
  virtual absl::Status AllGather(const Tensor& send, Tensor& recv) = 0;
  // Copies `root`'s `data` into every other rank's `data`.
  virtual absl::Status Broadcast(Tensor& data, int root) = 0;
  // Blocking point-to-point transfer; the receiver's tensor must have the
  // sender's byte size.
  virtual absl::Status Send(const Tensor& data, int peer) = 0;
  virtual absl::Status Recv(Tensor& data, int peer) = 0;
  virtual absl::Status Barrier() = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_COMMUNICATOR_H_
