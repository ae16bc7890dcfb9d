// Communicator over MPI for host memory (MemoryType::kHost, kHostPinned),
// for CPU workers started under mpirun.
//
// Every operation is non-blocking MPI (MPI_Iallgather, MPI_Ibcast,
// MPI_Isend/MPI_Irecv, MPI_Ibarrier) polled with MPI_Test until the
// deadline, so a missing peer gives DeadlineExceeded instead of a hang.
// Data goes through buffers owned by the communicator: after a timeout the
// abandoned request keeps its buffers (they are never freed), so a late
// peer can never make MPI write into, or read from, memory the caller has
// reused. AllReduce gathers every rank's input and reduces locally in rank
// order, so all ranks get bit-identical results (the same as the fake's)
// whatever algorithm MPI would pick; the price is (size - 1) x the bytes of
// a ring all-reduce, acceptable for TP groups of a few ranks.
//
// Split() (MPI_Comm_split) is a blocking collective without a deadline:
// MPI has no non-blocking split. Not thread-safe (one thread per
// communicator); distinct communicators may be used from distinct threads
// when MPI provides MPI_THREAD_MULTIPLE.
#ifndef SHARDLM_COLLECTIVES_MPI_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace shardlm {

// Initializes MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) unless
// it already is. Safe to call more than once.
absl::Status EnsureMpiInitialized();
// MPI_Finalize unless MPI is not initialized or already finalized. Every
// MpiCommunicator should be destroyed first.
absl::Status FinalizeMpi();

// Owns MPI's lifetime in a main(): initializes on Start(), finalizes in the
// destructor if Start() was the one that initialized it.
class MpiRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<MpiRuntime>> Start();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  ~MpiRuntime();

  // The thread level MPI provides (MPI_THREAD_SINGLE..MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }

 private:
  MpiRuntime(bool owns, int thread_level)
      : owns_(owns), thread_level_(thread_level) {}
  bool owns_;
  int thread_level_;
};

class MpiCommunicator : public Communicator {
 public:
  // A communicator over all of MPI_COMM_WORLD (a duplicate, so that its
  // traffic and error handler are its own), named "world". Initializes MPI
  // if needed.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> World(
      CommOptions options = {});

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override;

  // Collective over this group (MPI_Comm_split): ranks passing the same
  // `color` (>= 0) form one new group, ordered by `key` then by rank here.
  // The result inherits this communicator's options.
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> Split(int color, int key,
                                                         std::string name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  // Ranks of this group's members in MPI_COMM_WORLD, in group rank order.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  absl::Status AllReduce(const Tensor& send, Tensor& recv,
                         ReduceOp op) override;
  absl::Status AllGather(const Tensor& send, Tensor& recv) override;
  absl::Status Broadcast(Tensor& data, int root) override;
  absl::Status Send(const Tensor& data, int peer) override;
  absl::Status Recv(Tensor& data, int peer) override;
  absl::Status Barrier() override;

 private:
  // A communicator-owned byte buffer; shared so that a request abandoned
  // on timeout can keep it alive.
  using Buffer = std::shared_ptr<std::vector<char>>;

  MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options);
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Wrap(
      MPI_Comm comm, std::string name, CommOptions options);

  // Polls `request` until it completes or the deadline passes. On timeout
  // the request and `keep` are abandoned, the communicator becomes
  // unusable, and the error names the group and `waiting_for`.
  absl::Status Wait(MPI_Request& request, const char* op,
                    const std::string& waiting_for, Buffer keep,
                    MPI_Status* status = nullptr);
  absl::Status Usable() const;
  absl::Status MpiError(int code, const char* what) const;
  std::string MembersString() const;

  MPI_Comm comm_;
  std::string name_;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 0;
  std::vector<int> world_ranks_;
  absl::Status dead_;  // Unavailable after a timeout.
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_MPI_COMMUNICATOR_H_
