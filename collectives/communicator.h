// Communicator: collectives and point-to-point transfers within one group
// of ranks (the TP group of a stage, or the PP chain of one TP index).
//
// Buffers are Tensors, so every call knows its dtype, element count and
// memory type; an implementation rejects memory it cannot reach (MPI takes
// host memory, NCCL device memory) with InvalidArgument. Every wait on a
// peer has a deadline: on expiry the call returns DeadlineExceeded naming
// the group and the peer(s) it was waiting for, and the communicator is
// unusable afterwards (Unavailable); an asynchronous communicator (below)
// reports the expiry at its next call instead. Not thread-safe: one thread
// per communicator.
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

// Bytes a rank's successful calls delivered to its peers, by kind of call,
// cumulative over the communicator's life: an all-gather or an all-reduce
// counts (size - 1) x the rank's buffer (each peer gets the rank's
// contribution once; the MPI, Gloo and in-process all-reduces all gather
// every input and reduce locally), a broadcast (size - 1) x the buffer at
// the root and 0 elsewhere, a send its buffer. This is the payload, not
// what MPI's or Gloo's algorithm puts on the wire (headers, or a ring's
// forwarding of other ranks' blocks: a ring all-gather still sends
// (size - 1) blocks per rank). Counted by the MPI, Gloo and in-process
// communicators; NCCL's and the staged one leave it at zero.
struct CommBytes {
  int64_t all_reduce = 0;
  int64_t all_gather = 0;
  int64_t broadcast = 0;
  int64_t send = 0;
  int64_t total() const { return all_reduce + all_gather + broadcast + send; }
};

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

  // The asynchronous contract (NcclCommunicator with
  // NcclConfig::asynchronous; every other communicator is synchronous and
  // keeps these defaults). An asynchronous communicator's collectives and
  // transfers return once their work is queued on its stream, before it
  // has run: the stream's consumer orders its reads after them on that
  // stream, and calls Synchronize before it trusts a result on the host
  // (once per step). A watchdog holds each call to its deadline: when one
  // passes or the group reports an error, the group is aborted and the
  // next call (any of the above, Track or Synchronize) returns that error,
  // later ones Unavailable.
  virtual bool asynchronous() const { return false; }
  // Watches whatever the communicator's stream holds now (e.g. a CUDA
  // graph replay whose collectives were captured, so never watched) against
  // the call timeout, named `what` in errors. Does nothing while the stream
  // is being captured, or for a synchronous communicator.
  virtual absl::Status Track(const std::string& /*what*/) { return {}; }
  // Returns once all the work on the communicator's stream is done (OK),
  // or with the error that ended the communicator; bounded by the call
  // timeout. OK at once for a synchronous communicator.
  virtual absl::Status Synchronize() { return {}; }

  // What this rank has sent (see CommBytes). Read on the communicator's
  // thread.
  const CommBytes& bytes_sent() const { return bytes_sent_; }

 protected:
  // For implementations, after a call succeeded: `bytes` of this rank's
  // buffer delivered to every peer.
  int64_t ToPeers(size_t bytes) const {
    return static_cast<int64_t>(size() - 1) * static_cast<int64_t>(bytes);
  }
  CommBytes bytes_sent_;
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_COMMUNICATOR_H_
