#include "launch/remote_generate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "http/tls.h"
#include "shardlm/v1/inference.grpc.pb.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// grpc::StatusCode by its canonical name, for messages.
const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    default:
      return "ERROR";
  }
}

}  // namespace

void PrintLogprobs(std::FILE* out, const std::vector<PrintedToken>& tokens) {
  const auto quoted = [](const PrintedLogprob& t) {
    return absl::StrCat("\"", absl::CEscape(t.text), "\"");
  };
  std::fprintf(out, "[logprobs] token: text logprob (prob) | alternatives\n");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const PrintedToken& t = tokens[i];
    std::string line =
        absl::StrFormat("%4zu: %-16s %9.4f (%.3f) |", i, quoted(t.token),
                        t.token.logprob, std::exp(t.token.logprob));
    for (const PrintedLogprob& a : t.top) {
      absl::StrAppend(&line, " ", quoted(a), " ",
                      absl::StrFormat("%.4f", a.logprob));
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
}

std::string ApiKeyFromEnv() {
  const char* key = std::getenv("SHARDLM_API_KEY");
  return key == nullptr ? "" : key;
}

void AddApiKey(grpc::ClientContext& ctx) {
  if (const std::string key = ApiKeyFromEnv(); !key.empty()) {
    ctx.AddMetadata("authorization", "Bearer " + key);
  }
}

void ClientTlsFlags::Register(FlagSet& flags) {
  flags.Add("tls-ca", &ca,
            "PEM CA that signed the server's certificate: connect with TLS");
  flags.Add("tls-cert", &cert,
            "PEM client certificate, for servers that require mutual TLS "
            "(with --tls-key and --tls-ca)");
  flags.Add("tls-key", &key, "PEM private key of --tls-cert");
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientTlsFlags::Credentials() const {
  if (ca.empty()) {
    if (!cert.empty() || !key.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert and --tls-key need --tls-ca (the server's CA)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(ca, "--tls-ca"));
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile(cert, "--tls-cert"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile(key, "--tls-key"));
  }
  return grpc::SslCredentials(ssl);
}

v1::GenerateRequest GenerateRequestProto(const RemoteGenerateOptions& o) {
  v1::GenerateRequest req;
  if (o.chat) {  // One user turn, rendered in the model's chat format.
    v1::ChatMessage* turn = req.add_messages();
    turn->set_role("user");
    turn->set_content(o.prompt);
  } else {
    req.set_prompt(o.prompt);
  }
  req.set_max_tokens(o.max_tokens);
  req.set_ignore_eos(o.ignore_eos);
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(o.sampling.temperature);
  s->set_top_k(o.sampling.top_k);
  s->set_top_p(o.sampling.top_p);
  s->set_seed(o.sampling.seed);
  s->set_presence_penalty(o.sampling.presence_penalty);
  s->set_frequency_penalty(o.sampling.frequency_penalty);
  s->set_repetition_penalty(o.sampling.repetition_penalty);
  for (const LogitBias& b : o.sampling.logit_bias) {
    (*s->mutable_logit_bias())[b.token] = b.bias;
  }
  req.set_min_tokens(o.min_tokens);
  for (const std::string& stop : o.stop) req.add_stop(stop);
  req.set_logprobs(o.logprobs);
  return req;
}

int RemoteGenerate(const RemoteGenerateOptions& o) {
  const Clock::time_point t0 = Clock::now();
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      o.server, o.credentials != nullptr ? o.credentials
                                         : grpc::InsecureChannelCredentials());
  const auto connect_deadline = std::chrono::system_clock::now() +
                                std::chrono::milliseconds(static_cast<int64_t>(
                                    o.connect_timeout_s * 1000));
  // Fails at the first failed attempt (connection refused, unknown host)
  // rather than retrying until the deadline.
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    const bool failed = state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
                        state == GRPC_CHANNEL_SHUTDOWN;
    if (failed || !channel->WaitForStateChange(state, connect_deadline)) {
      std::fprintf(stderr,
                   "shardlm generate: cannot reach the server at %s (%s; is "
                   "`shardlm serve` running there?)\n",
                   o.server.c_str(),
                   failed ? "connection failed"
                          : absl::StrCat("no connection within ",
                                         o.connect_timeout_s, "s")
                                .c_str());
      return 1;
    }
    state = channel->GetState(/*try_to_connect=*/true);
  }
  const double connect_s = Seconds(t0, Clock::now());

  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(channel);
  const v1::GenerateRequest req = GenerateRequestProto(o);

  grpc::ClientContext ctx;
  AddApiKey(ctx);
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token = start;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&ctx, req);
  v1::GenerateResponse response;
  v1::GenerateResponse last;
  int64_t tokens = 0;
  std::vector<PrintedToken> logprobs;
  while (reader->Read(&response)) {
    if (tokens == 0 && response.token_ids_size() > 0) {
      first_token = Clock::now();
    }
    tokens += response.token_ids_size();
    std::fwrite(response.text().data(), 1, response.text().size(), stdout);
    std::fflush(stdout);
    if (!response.finish_reason().empty()) last = response;
    for (const v1::TokenLogprobs& lp : response.logprobs()) {
      PrintedToken& t = logprobs.emplace_back();
      t.token = {lp.token().text(), lp.token().logprob()};
      for (const v1::TokenLogprob& a : lp.top()) {
        t.top.push_back({a.text(), a.logprob()});
      }
    }
  }
  const grpc::Status status = reader->Finish();
  const Clock::time_point end = Clock::now();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!status.ok()) {
    std::fprintf(stderr, "shardlm generate: %s from %s: %s\n",
                 CodeName(status.error_code()), o.server.c_str(),
                 status.error_message().c_str());
    return 1;
  }

  if (o.logprobs > 0) PrintLogprobs(stderr, logprobs);
  if (o.stats) {
    const int32_t n = last.usage().completion_tokens();
    const double prefill_s = Seconds(start, first_token);
    const double decode_s = Seconds(first_token, end);
    std::fprintf(
        stderr,
        "[shardlm] server %s, connect %.3fs | prompt %d tokens, first token "
        "after %.3fs | generated %d tokens, decode %.1f tok/s | finish: %s\n",
        o.server.c_str(), connect_s, last.usage().prompt_tokens(), prefill_s, n,
        n > 1 && decode_s > 0 ? (n - 1) / decode_s : 0.0,
        last.finish_reason().c_str());
  }
  return 0;
}

}  // namespace shardlm
