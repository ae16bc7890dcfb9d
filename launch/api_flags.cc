#include "launch/api_flags.h"

#include <fstream>
#include <optional>
#include <sstream>

namespace shardlm {
namespace {

// The file's bytes, or nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

void ApiFlags::Register(FlagSet& flags) {
  flags.Add("max-client-priority", &max_client_priority,
            "highest request priority a client may ask for (higher ones "
            "preempt lower ones); 0: none outranks the default");
  flags.Add("max-grpc-calls", &max_grpc_calls,
            "gRPC calls handled at once; more get RESOURCE_EXHAUSTED");
  flags.Add("drain-timeout-s", &drain_timeout_s,
            "on SIGTERM/SIGINT, how long requests in flight may take to "
            "finish (new ones are refused) before they are cancelled");
  flags.Add("tls-cert", &tls_cert,
            "PEM certificate (chain) of the public APIs: gRPC and HTTP "
            "serve TLS only (with --tls-key)");
  flags.Add("tls-key", &tls_key, "PEM private key of --tls-cert");
  flags.Add("tls-client-ca", &tls_client_ca,
            "PEM CA for mutual TLS: clients must present a certificate it "
            "signed");
  flags.Add("metrics-auth", &metrics_auth,
            "/metrics needs the API key (SHARDLM_API_KEY) too");
  flags.Add("metrics-prefix-cache", &metrics_prefix_cache,
            "show the prefix cache's hits on /metrics (off: whoever reads "
            "them could learn whether another user sent a prompt)");
  flags.Add("request-memory-mb", &request_memory_mb,
            "MiB that requests in flight may cost the server (bodies, "
            "parsing, tokenizing, queued prompts); past it a request waits "
            "250 ms, then gets 429 / RESOURCE_EXHAUSTED. 0: an eighth of "
            "the machine's (or cgroup's) memory, within 256 MiB..16 GiB");
  flags.Add("chat-template", &chat_template,
            "a Jinja chat template file to use instead of the model's (as "
            "transformers' chat_template; shardlm renders the formats it "
            "recognizes, e.g. Qwen2.5's with tools, and refuses others)");
  flags.Add("idle-thread-timeout-s", &idle_thread_timeout_s,
            "HTTP pool threads above the base (4) exit after this many "
            "seconds without work");
}

absl::StatusOr<TlsConfig> ApiFlags::LoadTls() const {
  return LoadTlsConfig(tls_cert, tls_key, tls_client_ca);
}

std::string ApiFlags::Problem() const {
  if (max_client_priority < -(1 << 30) || max_client_priority > (1 << 30)) {
    return "--max-client-priority must be within +-2^30";
  }
  if (max_grpc_calls < 1 || max_grpc_calls > 100000) {
    return "--max-grpc-calls must be in [1, 100000]";
  }
  if (drain_timeout_s < 0) return "--drain-timeout-s must be >= 0";
  if (request_memory_mb < 0 || request_memory_mb > (int64_t{1} << 30)) {
    return "--request-memory-mb must be in [0, 2^30] (0: the default)";
  }
  if (idle_thread_timeout_s < 1 || idle_thread_timeout_s > 86400) {
    return "--idle-thread-timeout-s must be in [1, 86400]";
  }
  if (!chat_template.empty() && !ReadFile(chat_template).has_value()) {
    return "--chat-template: cannot read " + chat_template;
  }
  return "";
}

void ApiFlags::Apply(ApiServerOptions& options, TlsConfig tls) const {
  options.service.max_client_priority =
      static_cast<int32_t>(max_client_priority);
  options.max_grpc_calls = static_cast<int>(max_grpc_calls);
  options.metrics_auth = metrics_auth;
  options.metrics_prefix_cache = metrics_prefix_cache;
  options.tls = std::move(tls);
  options.request_memory_bytes = request_memory_mb << 20;
  options.idle_thread_timeout = std::chrono::seconds(idle_thread_timeout_s);
  if (!chat_template.empty()) {
    options.service.chat_template = ReadFile(chat_template).value_or("");
  }
}

}  // namespace shardlm
