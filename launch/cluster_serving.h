// What `shardlm launch` (ranks under mpirun) and `shardlm coordinator`
// (ranks started one by one, e.g. as Kubernetes pods) share on the
// coordinator's side: the flags of the model, layout, engine and public
// API, and serving once the control plane listens.
#ifndef SHARDLM_LAUNCH_CLUSTER_SERVING_H_
#define SHARDLM_LAUNCH_CLUSTER_SERVING_H_

#include <signal.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "cluster/control_service.h"
#include "grpcpp/server.h"
#include "launch/api_flags.h"
#include "launch/cache_flags.h"
#include "launch/control_tls_flags.h"
#include "launch/flags.h"
#include "launch/speculation_flags.h"
#include "model/weight_source.h"

namespace shardlm {

struct ClusterFlags {
  std::string model;
  int64_t tp = 1;
  int64_t pp = 1;
  // Context parallel (CPU workers): each stage's ranks form
  // TP x CP, tp * pp * cp workers in all.
  int64_t cp = 1;
  std::string moe_sharding = "auto";
  std::string pp_balance = "decode";
  std::string precision = "exact";  // --precision (kernels/precision.h).
  std::string listen = "127.0.0.1:50051";
  std::string http_listen;
  int64_t threads = 1;
  // The KV cache's flags (--kv-cache-dtype "auto": f16 on CPU workers,
  // bf16, the only type the CUDA kernels take, on GPU workers) and the
  // step limits.
  KvCacheFlags kv;
  BatchLimitFlags limits;
  SpeculationFlags speculation;  // The coordinator drafts; workers verify.
  // Where the workers run their shards: "auto" (launch: CUDA when every
  // worker sees a GPU, else the CPU; coordinator: cpu), "cpu" or "cuda".
  std::string device = "auto";
  bool allow_shared_gpu = false;
  int64_t worker_timeout_ms = 5000;
  int64_t startup_timeout_s = 300;
  int64_t step_timeout_s = 30;
  int64_t max_steps_in_flight = 0;  // 0: pp.
  ApiFlags api;
  ControlTlsFlags control_tls;

  // Adds the flags above; `model_help` says where the model must be.
  void Register(FlagSet& flags, const std::string& model_help);
  // Empty when the values are in range, else the problem (naming the flag).
  std::string Problem() const;
  // The control plane's options for these flags, with the workers on
  // `device` ("cpu" or "cuda": --device resolved).
  // --moe-sharding (checked by Problem(): auto on a bad value).
  MoeSharding MoeShardingOf() const {
    return ParseMoeSharding(moe_sharding).value_or(MoeSharding::kAuto);
  }
  // --pp-balance (checked by Problem(): decode on a bad value).
  PpBalance PpBalanceOf() const {
    return ParsePpBalance(pp_balance).value_or(PpBalance::kDecode);
  }
  ClusterOptions Control(std::string cluster_token,
                         const std::string& device) const;
  // The KV cache dtype on `device`: --kv-cache-dtype, "auto" resolved.
  // InvalidArgument when CUDA workers are asked for another type than bf16.
  absl::StatusOr<DType> KvDType(const std::string& device) const;
};

struct ServeClusterOptions {
  const char* command = "launch";  // For messages: "shardlm <command>: ..."
  std::string workers_dial;        // The address workers dial, for the log.
  // A rank lost after startup: stay up (not ready, requests UNAVAILABLE
  // naming the rank) for `failure_grace`, then tell the other workers to
  // leave and return 1, so that a supervisor (Kubernetes, LWS's
  // RecreateGroupOnPodRestart) restarts the group. Else serve on, failing.
  bool exit_when_cluster_fails = false;
  absl::Duration failure_grace = absl::Seconds(3);
  // Instead (shardlm coordinator --rejoin; `service` built with
  // ClusterOptions::rejoin): stay up, not ready, pause the requests that
  // held KV, and wait up to `rejoin_timeout` for the lost ranks to come
  // back (a restarted worker with the same rank), re-form the data plane
  // with the survivors and resume every paused request (recomputed from
  // its tokens: the stream continues as if undisturbed). A replacement
  // that does not come in time fails them with UNAVAILABLE naming the
  // rank.
  bool rejoin = false;
  absl::Duration rejoin_timeout = absl::Seconds(120);
};

// Waits for the workers of `service` to load, builds the engine, serves
// the public API until a stop signal (then drains) or, with
// exit_when_cluster_fails, until the cluster fails. Returns the exit code.
// `control` is the server `service` runs in; it is shut down on return.
int ServeCluster(const ClusterFlags& f, const ServeClusterOptions& options,
                 const WeightSource& source, ControlService& service,
                 grpc::Server& control, const sigset_t& stop_signals);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_CLUSTER_SERVING_H_
