#include "launch/cluster_serving.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "api/api_server.h"
#include "cluster/remote_executor.h"
#include "core/secret.h"
#include "core/status.h"
#include "engine/engine.h"
#include "http/http_server.h"
#include "launch/drain.h"
#include "launch/remote_generate.h"
#include "model/tokenizer.h"

namespace shardlm {

void ClusterFlags::Register(FlagSet& flags, const std::string& model_help) {
  flags.Add("model", &model, model_help);
  flags.Add("tp", &tp, "tensor-parallel degree");
  flags.Add("pp", &pp, "pipeline-parallel degree");
  flags.Add("cp", &cp,
            "context-parallel ranks per stage (CPU workers only): each "
            "stage's ranks form tp x cp, a "
            "sequence's KV blocks spread over the cp ranks (block i on cp "
            "rank i mod cp), so the longest sequence grows cp-fold at the "
            "same --kv-cache-bytes (and --cpu-offload-bytes) per worker; "
            "attention is split, and a step of at least cp tokens is split "
            "by tokens for the projections and MLP (every cp rank holds the "
            "stage's weights; a lone sequence's decode runs whole on each)");
  flags.Add("pp-balance", &pp_balance, kPpBalanceHelp);
  flags.Add("moe-sharding", &moe_sharding,
            "how a TP group splits a mixture of experts: tp (every expert's "
            "columns), ep (whole experts per rank) or auto (ep when tp "
            "divides the expert count)");
  flags.Add("listen", &listen, "address of the public gRPC API");
  flags.Add("http-listen", &http_listen,
            "address of the HTTP API (OpenAI-style routes, /metrics, "
            "/health, /ready); empty: none. SHARDLM_API_KEY guards both");
  flags.Add("threads", &threads, "CPU threads per worker");
  flags.Add(
      "precision", &precision,
      "precision of the CPU matrix products: exact (f32 activations, within "
      "1e-3 of the reference) or fast (int8 activations and integer dot "
      "products, as llama.cpp; its distance from exact is in "
      "docs/precision.md). CPU only");
  kv.Register(flags, "per worker");
  limits.Register(flags);
  speculation.Register(flags);
  flags.Add("device", &device,
            "where the workers run: auto (launch: cuda when every worker "
            "sees a GPU and the binary has CUDA, else cpu; coordinator: "
            "cpu), cpu or cuda (worker r of each host takes GPU "
            "local index % visible GPUs)");
  flags.Add("allow-shared-gpu", &allow_shared_gpu,
            "let two CUDA workers use one GPU (tests; NCCL itself refuses "
            "two ranks of one group on one GPU)");
  flags.Add("worker-timeout-ms", &worker_timeout_ms,
            "a worker silent this long is declared dead");
  flags.Add("startup-timeout-s", &startup_timeout_s,
            "how long workers may take to register and load");
  flags.Add("step-timeout-s", &step_timeout_s,
            "a step without every worker's result this long after it was "
            "sent (or, with steps in flight, after the step before it "
            "ended): the ranks missing are hung, and the cluster fails");
  flags.Add("max-steps-in-flight", &max_steps_in_flight,
            "steps submitted before the oldest one's tokens are back, so "
            "that pipeline stages work at once (each step takes its share "
            "of the running requests); 0: --pp; 1: one step at a time");
  api.Register(flags);
  control_tls.Register(flags);
}

std::string ClusterFlags::Problem() const {
  if (model.empty()) return "--model is required";
  if (tp < 1 || pp < 1 || tp * pp > 4096) {
    return "--tp and --pp must be >= 1 (and tp x pp at most 4096)";
  }
  if (cp < 1 || cp > 64 || tp * pp * cp > 4096) {
    return absl::StrCat(
        "--cp must be in [1, 64] (and tp x pp x cp at most "
        "4096), got ",
        cp);
  }
  if (cp > 1 && device == "cuda") {
    return absl::StrCat("--cp ", cp,
                        " with --device cuda: context parallelism is built for "
                        "CPU workers only so far; use --cp 1, or --device cpu");
  }
  if (threads < 1 || worker_timeout_ms < 100 || startup_timeout_s < 1 ||
      step_timeout_s < 1 || max_steps_in_flight < 0 ||
      max_steps_in_flight > 64) {
    return "--threads must be >= 1, --worker-timeout-ms >= 100, "
           "--startup-timeout-s and --step-timeout-s >= 1, "
           "--max-steps-in-flight in [0, 64]";
  }
  if (std::string p = kv.Problem(); !p.empty()) return p;
  if (std::string p = limits.Problem(); !p.empty()) return p;
  if (std::string p = speculation.Problem(); !p.empty()) return p;
  if (std::string p = api.Problem(); !p.empty()) return p;
  if (absl::StatusOr<Precision> p = ParsePrecision(precision); !p.ok()) {
    return absl::StrCat("--precision: ", p.status().message());
  }
  if (precision == "fast" && device == "cuda") {
    return "--precision fast with --device cuda: GPU workers run bf16 "
           "activations in either mode; use --device cpu, or --precision "
           "exact";
  }
  if (absl::StatusOr<MoeSharding> m = ParseMoeSharding(moe_sharding); !m.ok()) {
    return std::string(m.status().message());
  }
  if (absl::StatusOr<PpBalance> b = ParsePpBalance(pp_balance); !b.ok()) {
    return std::string(b.status().message());
  }
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return absl::StrCat("--device must be auto, cpu or cuda, not '", device,
                        "'");
  }
  if (device == "cuda") {
    if (absl::StatusOr<DType> t = KvDType("cuda"); !t.ok()) {
      return std::string(t.status().message());
    }
  }
  return "";
}

absl::StatusOr<DType> ClusterFlags::KvDType(const std::string& on) const {
  if (kv.kv_cache_dtype == "auto") {
    return on == "cuda" ? DType::kBF16 : kDefaultCpuKvDType;
  }
  ASSIGN_OR_RETURN(const DType t, ParseKvCacheDType(kv.kv_cache_dtype));
  if (on == "cuda" && t != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype ", kv.kv_cache_dtype,
        ": GPU workers keep the KV cache in bf16 (use bf16 or auto)"));
  }
  return t;
}

ClusterOptions ClusterFlags::Control(std::string cluster_token,
                                     const std::string& on) const {
  ClusterOptions o;
  o.tp = static_cast<int>(tp);
  o.pp = static_cast<int>(pp);
  o.cp = static_cast<int>(cp);
  o.moe_sharding = MoeShardingOf();
  o.pp_balance = PpBalanceOf();
  o.cluster_token = std::move(cluster_token);
  o.kv = kv.ToOptions();
  o.kv.dtype = KvDType(on).value_or(kDefaultCpuKvDType);
  o.limits = limits.ToLimits();
  o.device = on;
  o.allow_shared_gpu = allow_shared_gpu;
  o.threads_per_worker = static_cast<int>(threads);
  o.batch_invariant =
      speculation.batch_invariant || speculation.ToOptions().enabled();
  o.precision = ParsePrecision(precision).value_or(Precision::kExact);
  o.worker_timeout = absl::Milliseconds(worker_timeout_ms);
  o.step_timeout = absl::Seconds(step_timeout_s);
  return o;
}

namespace {

// Waits for a stop signal; with `watch`, also returns (0) when the
// cluster fails (a rank lost, hung or failing steps). Returns the signal.
int WaitForStop(const sigset_t& stop_signals, const StepExecutor* watch) {
  RouteStopSignalsHere();
  while (true) {
    const timespec tick = {0, 200'000'000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig > 0) return sig;
    if (watch != nullptr && !watch->Health().ok()) return 0;
  }
}

// A rank was lost (`why`): pauses what held KV, waits for the ranks to
// register again under a new rendezvous prefix, and resumes it. Sets *sig
// when a stop signal came meanwhile.
absl::Status Reform(const ClusterFlags& f, const ServeClusterOptions& o,
                    const std::string& why, ControlService& service,
                    RemoteExecutor& remote, Engine& engine,
                    const sigset_t& stop_signals, int* sig) {
  *sig = 0;
  std::fprintf(stderr,
               "[shardlm] %s: lost a rank: %s; re-forming (--rejoin): waiting "
               "up to %s for it to come back\n",
               o.command, why.c_str(),
               absl::FormatDuration(o.rejoin_timeout).c_str());
  const absl::Status lost = absl::UnavailableError(
      absl::StrCat("the cluster is re-forming after: ", why));
  remote.BeginReform(lost);
  engine.DropKvState(lost);
  static int formation = 1;
  auto id = RandomHexToken(8);
  RETURN_IF_ERROR(service.Reform(
      absl::StrCat("reform-", ++formation, "-", id.ok() ? *id : "0")));
  const absl::Time give_up = absl::Now() + o.rejoin_timeout;
  while (true) {
    absl::Status s = service.WaitUntilReady(absl::Seconds(1));
    if (s.ok()) break;
    const timespec now = {0, 0};
    if (const int got = sigtimedwait(&stop_signals, nullptr, &now); got > 0) {
      *sig = got;
      return absl::CancelledError("stopped while re-forming");
    }
    if (!absl::IsDeadlineExceeded(s)) {
      return absl::UnavailableError(
          absl::StrCat("could not re-form the cluster: ", s.message()));
    }
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(
          absl::StrCat("the cluster did not re-form within ",
                       absl::FormatDuration(o.rejoin_timeout),
                       " (--rejoin-timeout-s): ", s.message()));
    }
  }
  RETURN_IF_ERROR(remote.EndReform());
  std::fprintf(stderr, "[shardlm] %s: re-formed; serving again\n", o.command);
  engine.Resume();
  return absl::OkStatus();
}

// While the workers join and load, the HTTP port already answers the
// probes: /health 200 (the process serves: a liveness probe must not
// restart a coordinator that waits for its pods), /ready 503 saying
// what is missing. The API takes the port over once the cluster is up.
// None (nullptr) without --http-listen or on port 0.
absl::StatusOr<std::unique_ptr<HttpServer>> StartStartupProbes(
    const ClusterFlags& f, const TlsConfig& tls, ControlService& service) {
  if (f.http_listen.empty() || f.http_listen.ends_with(":0")) {
    return std::unique_ptr<HttpServer>();
  }
  HttpServerOptions probe_options;
  probe_options.listen_address = f.http_listen;
  probe_options.tls = tls;
  probe_options.max_connections = 16;
  probe_options.probe_paths = {"/health", "/ready"};
  return HttpServer::Start(
      probe_options, [&service](const HttpRequest& req, HttpResponse& res) {
        if (req.path == "/health") {
          res.Send(200, "text/plain", "ok\n");
          return;
        }
        res.Send(503, "text/plain",
                 absl::StrCat("starting: ", service.Health().message(), "\n"));
      });
}

// The line that says the cluster serves: its layout, KV blocks and ports.
void PrintServing(const ClusterFlags& f, const ServeClusterOptions& o,
                  const std::string& name, const Engine& engine, int api_port) {
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  const int64_t blocks = engine.blocks().num_blocks();
  const std::string layout =
      f.cp > 1 ? absl::StrCat(" x cp ", f.cp) : std::string();
  const int64_t host_blocks = engine.blocks().num_host_blocks();
  const std::string per_rank =
      f.cp > 1
          ? absl::StrCat(" over ", f.cp, " CP ranks, ", blocks / f.cp,
                         host_blocks > 0
                             ? absl::StrCat(" + ", host_blocks / f.cp, " host")
                             : "",
                         " each")
          : std::string();
  std::fprintf(stderr,
               "[shardlm] serving %s with tp %d x pp %d%s (%d workers, %lld KV "
               "blocks of %d%s) on %s:%d; workers connect to %s\n",
               name.c_str(), static_cast<int>(f.tp), static_cast<int>(f.pp),
               layout.c_str(), static_cast<int>(f.tp * f.pp * f.cp),
               static_cast<long long>(blocks),
               static_cast<int>(f.kv.block_size), per_rank.c_str(),
               host.c_str(), api_port, o.workers_dial.c_str());
}

// Serves until a stop signal (drained) or a cluster failure that is not
// re-formed; the exit code.
int ServeUntilStopped(const ClusterFlags& f, const ServeClusterOptions& o,
                      ControlService& service, RemoteExecutor* remote,
                      Engine& engine, ApiServer& api,
                      const sigset_t& stop_signals) {
  const bool watch = o.exit_when_cluster_fails || o.rejoin;
  int code = 0;
  while (true) {
    int sig = WaitForStop(stop_signals, watch ? remote : nullptr);
    if (sig != 0) {
      code = DrainOnSignal(api, sig, stop_signals,
                           absl::Seconds(f.api.drain_timeout_s), "coordinator");
      service.Shutdown("coordinator shutting down");
      break;
    }
    // The rank's own reason when one was lost, else the failed step's.
    const absl::Status health = service.Health();
    const std::string why(health.ok() ? remote->Health().message()
                                      : health.message());
    if (o.rejoin) {
      absl::Status s =
          Reform(f, o, why, service, *remote, engine, stop_signals, &sig);
      if (s.ok()) continue;
      // The paused requests end now, naming the lost rank; not later as
      // "the engine shut down".
      engine.EndAll(absl::UnavailableError(
          sig != 0 ? absl::StrCat("the server stopped while re-forming "
                                  "after: ",
                                  why)
                   : absl::StrCat(s.message(), " (lost: ", why, ")")));
      if (sig != 0) {  // Stopped while re-forming: nothing to drain.
        service.Shutdown("coordinator shutting down");
        break;
      }
      std::fprintf(stderr, "shardlm %s: %s\n", o.command,
                   std::string(s.message()).c_str());
      service.Shutdown(std::string(s.message()), /*cluster_failed=*/true);
      code = 1;
      break;
    }
    // Not ready from now on (/ready follows the ranks' health); requests
    // get UNAVAILABLE naming the rank while the grace lasts.
    std::fprintf(stderr, "shardlm %s: the cluster failed: %s; exiting in %s\n",
                 o.command, why.c_str(),
                 absl::FormatDuration(o.failure_grace).c_str());
    const timespec grace = absl::ToTimespec(o.failure_grace);
    sigtimedwait(&stop_signals, nullptr, &grace);
    service.Shutdown(absl::StrCat("the cluster failed: ", why),
                     /*cluster_failed=*/true);
    code = 1;
    break;
  }
  return code;
}

}  // namespace

int ServeCluster(const ClusterFlags& f, const ServeClusterOptions& o,
                 const WeightSource& source, ControlService& service,
                 grpc::Server& control, const sigset_t& stop_signals) {
  const auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "shardlm %s: %s%s\n", o.command, what.c_str(),
                 std::string(s.message()).c_str());
    service.Shutdown("startup failed");
    control.Shutdown();
    return 1;
  };
  // The probes answer while the workers join and load. Bad TLS files fail
  // now, not after the workers loaded.
  absl::StatusOr<TlsConfig> tls = f.api.LoadTls();
  if (!tls.ok()) return fail("", tls.status());
  auto startup_probes = StartStartupProbes(f, *tls, service);
  if (!startup_probes.ok()) {
    return fail("--http-listen: ", startup_probes.status());
  }
  auto executor = RemoteExecutor::WaitForWorkers(
      service, source.config(), absl::Seconds(f.startup_timeout_s));
  if (!executor.ok()) {
    return fail("workers did not start: ", executor.status());
  }
  if (*startup_probes != nullptr) (*startup_probes)->Shutdown();
  startup_probes->reset();
  RemoteExecutor* remote = executor->get();
  remote->set_max_steps_in_flight(static_cast<int>(
      f.max_steps_in_flight > 0 ? f.max_steps_in_flight : f.pp));
  auto tokenizer = LoadTokenizer(f.model);
  if (!tokenizer.ok()) return fail("", tokenizer.status());
  auto engine = Engine::Create(
      std::move(*executor),
      {.kv = f.kv.ToOptions(),
       .limits = f.limits.ToLimits(),
       .cp = static_cast<int>(f.cp),
       .device = service.options().device == "cuda" ? DeviceKind::kCuda
                                                    : DeviceKind::kCpu,
       .speculation = f.speculation.ToOptions(),
       .batch_invariant = f.speculation.batch_invariant,
       .precision = ParsePrecision(f.precision).value_or(Precision::kExact),
       .resume_interrupted = o.rejoin});
  if (!engine.ok()) return fail("", engine.status());
  std::string name = source.config().name;
  if (name.empty()) name = std::filesystem::path(f.model).filename().string();
  // Filled field by field: gcc 12 misreports the strings of a designated
  // temporary as maybe-uninitialized.
  ApiServerOptions api_options;
  api_options.listen_address = f.listen;
  api_options.model_name = name;
  api_options.service.tp = static_cast<int>(f.tp);
  api_options.service.pp = static_cast<int>(f.pp);
  api_options.service.cp = static_cast<int>(f.cp);
  api_options.service.api_key = ApiKeyFromEnv();
  f.api.Apply(api_options, *tls);
  api_options.http_listen_address = f.http_listen;
  auto api = ApiServer::Start(engine->get(), tokenizer->get(), api_options);
  if (!api.ok()) return fail("", api.status());
  PrintServing(f, o, name, **engine, (*api)->port());

  const int code =
      ServeUntilStopped(f, o, service, remote, **engine, **api, stop_signals);
  control.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return code;
}

}  // namespace shardlm
