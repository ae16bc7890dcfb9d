// The coordinator's rendezvous store (Control.StoreSet / StoreGet), as a
// RendezvousStore for GlooCommunicator: how workers started without mpirun
// find each other's data-plane addresses.
#ifndef SHARDLM_WORKER_CONTROL_STORE_H_
#define SHARDLM_WORKER_CONTROL_STORE_H_

#include <memory>
#include <string>

#include "collectives/gloo_communicator.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace shardlm {

class ControlPlaneStore : public RendezvousStore {
 public:
  // `coordinator` (host:port) names the coordinator in errors.
  ControlPlaneStore(std::shared_ptr<grpc::Channel> channel,
                    std::string coordinator, std::string cluster_token);
  ~ControlPlaneStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  // Asks in waits of at most 10 s (the server's cap) until `timeout`.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;

 private:
  struct Stub;
  std::unique_ptr<Stub> stub_;
  std::string coordinator_, token_;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CONTROL_STORE_H_
