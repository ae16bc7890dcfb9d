// Flags of the public API server that `serve` and `launch` share: limits,
// fairness and the graceful stop.
#ifndef SHARDLM_LAUNCH_API_FLAGS_H_
#define SHARDLM_LAUNCH_API_FLAGS_H_

#include <cstdint>
#include <string>

#include "coordinator/inference_service.h"
#include "launch/flags.h"

namespace shardlm {

struct ApiFlags {
  int64_t max_client_priority = 0;
  int64_t max_grpc_calls = 512;
  int64_t drain_timeout_s = 30;

  // Adds --max-client-priority, --max-grpc-calls and --drain-timeout-s.
  void Register(FlagSet& flags);
  // Empty when the values are in range, else the problem (naming the flag).
  std::string Problem() const;
  // Sets what these flags govern in `options`.
  void Apply(ApiServerOptions& options) const;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_API_FLAGS_H_
