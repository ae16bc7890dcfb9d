// Communicator over Gloo's TCP transport for host memory, for CPU workers
// started without mpirun (shardlm worker, Kubernetes pods).
//
// Ranks find each other through a RendezvousStore: each publishes its
// listening address under the group's name and reads the others' (the
// cluster's store lives on the coordinator's control plane; tests use an
// in-memory one). Every wait has the communicator's deadline: Gloo throws
// on expiry or when a peer's connection breaks, and the call returns
// DeadlineExceeded or Unavailable naming the group and the peer(s) it was
// waiting for; the communicator is unusable afterwards (Gloo tears down the
// whole context on the first error).
//
// AllReduce gathers every rank's input and reduces locally in rank order,
// as MpiCommunicator and FakeCommunicator do, so all backends give
// bit-identical sums. Not thread-safe (one thread per communicator);
// distinct communicators may share one GlooTransport across threads.
#ifndef SHARDLM_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/rendezvous_store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace shardlm {

// Gloo's TCP device: a listening socket and an event loop, shared by every
// communicator of this process.
class GlooTransport {
 public:
  // Listens on `host` (a name or address of this machine), or, when
  // `interface` is set, on that network interface's address (as
  // GLOO_SOCKET_IFNAME does).
  static absl::StatusOr<std::shared_ptr<GlooTransport>> Create(
      const std::string& host, const std::string& interface = "");
  // The address peers connect to, for logs.
  std::string description() const;

 private:
  friend class GlooCommunicator;
  explicit GlooTransport(std::shared_ptr<gloo::transport::Device> device)
      : device_(std::move(device)) {}
  std::shared_ptr<gloo::transport::Device> device_;
};

class GlooCommunicator : public Communicator {
 public:
  // Rank `rank` of `size` in group `name`: publishes this rank's address in
  // `store` under keys prefixed by `key_prefix` and `name`, and connects to
  // every other rank, waiting up to `options.timeout` for all of them.
  // `labels` (size() entries, optional) name the members in errors, e.g.
  // "rank 3 (stage 1, tp 0)"; by default "rank N".
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      RendezvousStore& store, const std::string& key_prefix,
      std::shared_ptr<GlooTransport> transport, std::string name, int rank,
      int size, CommOptions options = {}, std::vector<std::string> labels = {});

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(const Tensor& send, Tensor& recv,
                         ReduceOp op) override;
  absl::Status AllGather(const Tensor& send, Tensor& recv) override;
  absl::Status Broadcast(Tensor& data, int root) override;
  absl::Status Send(const Tensor& data, int peer) override;
  absl::Status Recv(Tensor& data, int peer) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(std::string name, int rank, int size, CommOptions options,
                   std::vector<std::string> labels);

  // Runs `op` (a Gloo call); converts Gloo's exceptions into a status
  // naming `what` and `waiting_for`, and marks the communicator dead.
  template <typename F>
  absl::Status Guard(const char* what, const std::string& waiting_for, F op);
  std::string Others() const;  // Every member but this rank, for errors.

  std::string name_;
  int rank_, size_;
  CommOptions options_;
  std::vector<std::string> labels_;
  std::shared_ptr<GlooTransport> transport_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<char> gathered_;  // AllReduce's gather buffer, reused.
  absl::Status dead_;
};

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_GLOO_COMMUNICATOR_H_
