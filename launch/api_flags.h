// Flags of the public API server that `serve`, `launch` and `coordinator`
// share: limits, fairness, the graceful stop and TLS.
#ifndef SHARDLM_LAUNCH_API_FLAGS_H_
#define SHARDLM_LAUNCH_API_FLAGS_H_

#include <cstdint>
#include <string>

#include "api/api_server.h"
#include "launch/flags.h"

namespace shardlm {

struct ApiFlags {
  int64_t max_client_priority = 0;
  int64_t max_grpc_calls = 512;
  int64_t drain_timeout_s = 30;
  std::string tls_cert, tls_key, tls_client_ca;
  bool metrics_auth = false;
  bool metrics_prefix_cache = false;
  // 0: MemoryBudget::DefaultLimitBytes() (an eighth of memory, clamped).
  int64_t request_memory_mb = 0;
  int64_t idle_thread_timeout_s = 10;
  std::string chat_template;  // A Jinja file replacing the model's.

  // Adds --max-client-priority, --max-grpc-calls, --drain-timeout-s,
  // --tls-cert, --tls-key, --tls-client-ca, --metrics-auth,
  // --metrics-prefix-cache, --request-memory-mb, --idle-thread-timeout-s
  // and --chat-template.
  void Register(FlagSet& flags);
  // Empty when the values are in range (and --chat-template's file reads),
  // else the problem (naming the flag).
  std::string Problem() const;
  // The TLS files read (plaintext when none given), or the problem naming
  // the flag and file.
  absl::StatusOr<TlsConfig> LoadTls() const;
  // Sets what these flags govern in `options`, with `tls` from LoadTls()
  // (read once, before the model loads) and --chat-template's source.
  void Apply(ApiServerOptions& options, TlsConfig tls) const;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_API_FLAGS_H_
