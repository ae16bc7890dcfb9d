// Communicator over NCCL for device memory (MemoryType::kDevice), one GPU
// per rank.
//
// The communicator is created non-blocking (ncclConfig_t.blocking = 0), so
// that init and every enqueue are polled to the deadline instead of
// hanging; each operation is enqueued on the caller's compute stream
// (NcclConfig::stream; else a stream of the communicator's own), so that it
// follows the kernels that produced its input with no host round trip.
//
// Synchronous (the default): a call returns when that stream has drained
// (cudaStreamQuery polling). On expiry the communicator is aborted
// (ncclCommAbort), the call returns DeadlineExceeded naming the group and
// the members, and every later call returns Unavailable.
//
// Asynchronous (NcclConfig::asynchronous; see Communicator::asynchronous):
// a call returns once NCCL has accepted the enqueue (ncclInProgress polled
// to the deadline, as above), after recording an event on the stream that
// a CollectiveWatchdog polls against the call's deadline, together with
// ncclCommGetAsyncError. On expiry or an async error the watchdog aborts
// the communicator (which also ends its stuck kernels, so the stream
// drains); the next call returns the recorded error (DeadlineExceeded
// naming the group, the op and the peers waited for), later ones
// Unavailable. While the stream is being captured into a CUDA graph, calls
// record no event (the graph's replay is tracked with Track). Barrier
// stays synchronous (it is Synchronize after the all-reduce).
//
// CUDA and NCCL errors become Status; nothing here aborts the process.
// AllReduce supports F32, F16, BF16 and I32; NCCL's reduction order is its
// own (the same on every rank, but not the rank order of the fake and MPI
// communicators). Send/Recv move bytes and cannot check that the sizes
// match across ranks: a mismatch is the caller's bug and surfaces as a
// timeout or a short copy. Not thread-safe: one thread per communicator
// (the watchdog's thread touches the NCCL communicator only under a lock
// that the calls hold while they enqueue).
#ifndef SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/collective_watchdog.h"
#include "collectives/communicator.h"

namespace shardlm {

// A fresh ncclUniqueId as bytes (ncclGetUniqueId), for the coordinator to
// hand to every rank of one group.
absl::StatusOr<std::string> NewNcclUniqueId();

// Whether the environment asks GPU workers for asynchronous communicators
// (SHARDLM_NCCL_ASYNC=1: NcclConfig::asynchronous). Synchronous stays the
// default until the asynchronous mode has run on GPUs.
bool NcclAsyncRequested();

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
  // Calls return once queued, under a watchdog (see above). Off by
  // default: the synchronous mode is the one that has run on GPUs.
  bool asynchronous = false;
  // How often the watchdog polls the events and the async error.
  absl::Duration watchdog_interval = absl::Milliseconds(1);
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
  // An AllReduce of one float (NCCL has no barrier); returns once it is
  // done in both modes.
  absl::Status Barrier() override;

  bool asynchronous() const override { return watchdog_ != nullptr; }
  // Records an event after whatever the stream holds and watches it until
  // the current timeout (asynchronous mode, stream not capturing; else
  // nothing), e.g. after cudaGraphLaunch of a graph that holds collectives.
  absl::Status Track(const std::string& what) override;
  // Track, then waits (on the watchdog, not the stream) until all the
  // watched work is done or the watchdog failed. FailedPrecondition while
  // the stream is being captured.
  absl::Status Synchronize() override;
  // Whether the stream is being captured into a CUDA graph
  // (cudaStreamIsCapturing), when calls record no event.
  absl::StatusOr<bool> capturing() const;

 private:
  struct Impl;  // NCCL and CUDA handles, kept out of this header.
  NcclCommunicator(const NcclConfig& config, std::unique_ptr<Impl> impl);

  // Returns once `enqueue` (an NCCL call on this communicator's stream) has
  // been accepted and the stream has drained (synchronous) or is watched
  // (asynchronous), or on error/deadline.
  template <typename Enqueue>
  absl::Status Run(const char* op, const std::string& waiting_for,
                   Enqueue enqueue);
  // dead_, or the watchdog's failure (reported once, then dead_).
  absl::Status Usable();
  // Records an event on the stream (unless it is capturing) and hands it
  // to the watchdog.
  absl::Status WatchStream(std::string what, absl::Time deadline);

  std::string name_;
  CommOptions options_;
  int rank_, size_, device_;
  std::unique_ptr<Impl> impl_;
  absl::Status dead_;  // Unavailable after a timeout or an NCCL error.
  // Asynchronous mode only; destroyed before impl_, whose communicator its
  // abort callback uses.
  std::unique_ptr<CollectiveWatchdog> watchdog_;
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_NCCL_COMMUNICATOR_H_
