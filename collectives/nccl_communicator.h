// Communicator over NCCL for device memory (MemoryType::kDevice), one GPU
// per rank.
//
// The communicator is created non-blocking (ncclConfig_t.blocking = 0), so
// that init and every enqueue are polled to the deadline instead of
// hanging; each operation is enqueued on the caller's compute stream
// (NcclConfig::stream; else a stream of the communicator's own), so that it
// follows the kernels that produced its input with no host round trip, and
// the call returns when that stream has drained (cudaStreamQuery polling).
// On expiry the communicator is aborted (ncclCommAbort), the call returns
// DeadlineExceeded naming the group and the members, and every later call
// returns Unavailable. CUDA and NCCL errors become Status; nothing here
// aborts the process.
//
// AllReduce supports F32, F16, BF16 and I32; NCCL's reduction order is its
// own (the same on every rank, but not the rank order of the fake and MPI
// communicators). Send/Recv move bytes and cannot check that the sizes
// match across ranks: a mismatch is the caller's bug and surfaces as a
// timeout or a short copy. Not thread-safe: one thread per communicator.
#ifndef SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace shardlm {

// A fresh ncclUniqueId as bytes (ncclGetUniqueId), for the coordinator to
// hand to every rank of one group.
absl::StatusOr<std::string> NewNcclUniqueId();

struct NcclConfig {
  std::string unique_id;  // From NewNcclUniqueId(), the same on every rank.
  int rank = 0;
  int size = 1;
  int device = 0;    // CUDA device ordinal of this rank.
  std::string name;  // For errors, e.g. "tp group of stage 1".
  CommOptions options;
  // A cudaStream_t of `device` to run the collectives on (the compute
  // stream whose kernels produce and consume the buffers), owned by the
  // caller and outliving the communicator; null: a stream of its own.
  void* stream = nullptr;
};

class NcclCommunicator : public Communicator {
 public:
  // Joins the group (ncclCommInitRankConfig on `device`); every rank must
  // call this, each from its own thread or process. DeadlineExceeded when
  // the others do not arrive within options.timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclConfig& config);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int device() const { return device_; }
  // The deadline of each later call, and of the flush when the
  // communicator is destroyed: e.g. the join timeout while a cluster
  // forms, a step's after.
  void set_timeout(absl::Duration timeout);

  absl::Status AllReduce(const Tensor& send, Tensor& recv,
                         ReduceOp op) override;
  absl::Status AllGather(const Tensor& send, Tensor& recv) override;
  absl::Status Broadcast(Tensor& data, int root) override;
  absl::Status Send(const Tensor& data, int peer) override;
  absl::Status Recv(Tensor& data, int peer) override;
  // An AllReduce of one float: NCCL has no barrier.
  absl::Status Barrier() override;

 private:
  struct Impl;  // NCCL and CUDA handles, kept out of this header.
  NcclCommunicator(const NcclConfig& config, std::unique_ptr<Impl> impl);

  // Returns once `enqueue` (an NCCL call on this communicator's stream) has
  // been accepted and the stream has drained, or on error/deadline.
  template <typename Enqueue>
  absl::Status Run(const char* op, const std::string& waiting_for,
                   Enqueue enqueue);

  std::string name_;
  CommOptions options_;
  int rank_, size_, device_;
  std::unique_ptr<Impl> impl_;
  absl::Status dead_;  // Unavailable after a timeout or an NCCL error.
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_
