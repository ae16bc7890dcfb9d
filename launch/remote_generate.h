// `shardlm generate --server HOST:PORT`: the same completion as the local
// path, streamed from a running server (shardlm serve or a cluster's
// coordinator) over the public gRPC API.
#ifndef SHARDLM_LAUNCH_REMOTE_GENERATE_H_
#define SHARDLM_LAUNCH_REMOTE_GENERATE_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "kernels/sampling/sampling.h"
#include "launch/flags.h"
#include "shardlm/v1/inference.pb.h"

namespace shardlm {

// A client's TLS flags: --tls-ca (the CA that signed the server's
// certificate; turns TLS on) and, for mutual TLS, --tls-cert and --tls-key
// (the client's own certificate and key). PEM files.
struct ClientTlsFlags {
  std::string ca, cert, key;

  void Register(FlagSet& flags);
  // Channel credentials: TLS when --tls-ca is given, else insecure; the
  // problem naming the flag and file when one cannot be read.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials() const;
};

struct RemoteGenerateOptions {
  std::string server;                                     // "host:port".
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // Null: insecure.
  std::string prompt;       // Sent as text; the server tokenizes it.
  bool chat = false;        // Send the prompt as a user message (the server
                            // renders its model's chat format).
  bool ignore_eos = false;  // Generate max_tokens whatever comes.
  int32_t max_tokens = 128;
  SamplingParams sampling;
  bool stats = false;             // Usage and timings to stderr.
  std::vector<std::string> stop;  // Stop strings.
  int32_t logprobs = 0;           // > 0: print each token's logprobs to stderr.
  int32_t min_tokens = 0;
  // How long to wait for the server to accept a connection.
  double connect_timeout_s = 5.0;
};

// The shardlm.v1 request `o` asks for: what the server gets, and what the
// local CLI turns into an engine request through the same service code.
v1::GenerateRequest GenerateRequestProto(const RemoteGenerateOptions& o);

// Streams the completion to stdout, then a newline. Returns the process exit
// code: 0, or 1 with a message on stderr (an unreachable server is named by
// its address; a rejected request gives the server's status and message).
int RemoteGenerate(const RemoteGenerateOptions& options);

// One token's log-probability and its most likely alternatives, as printed.
struct PrintedLogprob {
  std::string text;
  float logprob = 0;
};
struct PrintedToken {
  PrintedLogprob token;
  std::vector<PrintedLogprob> top;
};
// One line per token to `out`: its index, text (quoted, escaped),
// log-probability and probability, then the alternatives.
void PrintLogprobs(std::FILE* out, const std::vector<PrintedToken>& tokens);

// The API key servers are started with and clients send: the environment
// variable SHARDLM_API_KEY (not a flag, so that it stays out of `ps`).
std::string ApiKeyFromEnv();
// Adds "authorization: Bearer <key>" to `ctx` when SHARDLM_API_KEY is set.
void AddApiKey(grpc::ClientContext& ctx);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_REMOTE_GENERATE_H_
