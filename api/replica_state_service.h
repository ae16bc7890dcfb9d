// shardlm.v1.ReplicaState: a replica's load and prefix-cache key changes,
// streamed to the routers in front of it (proto/shardlm/v1/
// replica_state.proto). Each stream holds one server thread and reads the
// engine's stats and PrefixEventLog every interval; its memory is the
// changes of one interval (a reader that falls behind the log gets the
// live set again).
#ifndef SHARDLM_API_REPLICA_STATE_SERVICE_H_
#define SHARDLM_API_REPLICA_STATE_SERVICE_H_

#include "api/inference_service.h"
#include "engine/engine.h"
#include "shardlm/v1/replica_state.grpc.pb.h"

namespace shardlm {

class ReplicaStateService final : public v1::ReplicaState::Service {
 public:
  // Not owned; both outlive the service. `inference` gives the API key and
  // whether the server is draining. `publish_keys`: send the prefix
  // cache's keys (they disclose which prompt beginnings were sent; the
  // server's --metrics-prefix-cache), else the load alone.
  ReplicaStateService(const Engine* engine, const InferenceService* inference,
                      bool publish_keys)
      : engine_(engine), inference_(inference), publish_keys_(publish_keys) {}

  grpc::Status WatchState(
      grpc::ServerContext* context, const v1::WatchStateRequest* request,
      grpc::ServerWriter<v1::ReplicaStateUpdate>* writer) override;

  // Keys per update (a larger reset continues in later updates): 64K keys
  // are 512 KiB, under gRPC's default 4 MiB message limit.
  static constexpr int kMaxKeysPerUpdate = 1 << 16;

 private:
  const Engine* engine_;
  const InferenceService* inference_;
  const bool publish_keys_;
};

}  // namespace shardlm

#endif  // SHARDLM_API_REPLICA_STATE_SERVICE_H_
