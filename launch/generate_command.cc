// shardlm generate: streams a completion from a model in this process.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/engine.h"
#include "coordinator/inference_service.h"
#include "coordinator/stop_strings.h"
#include "kernels/cpu_isa.h"
#include "launch/commands.h"
#include "launch/engine_flags.h"
#include "launch/flags.h"
#include "launch/remote_generate.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

struct GenerateFlags {
  LocalEngineFlags engine;
  std::string server;
  std::string prompt;
  bool chat = false;
  bool ignore_eos = false;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t seed = 0;
  bool stats = false;
  std::vector<std::string> stop;
  int64_t logprobs = 0;
  ClientTlsFlags tls;  // With --server.
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "shardlm generate: %s\n",
               std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int GenerateCommand(int argc, char** argv) {
  GenerateFlags f;
  FlagSet flags(
      "usage: shardlm generate --model PATH --prompt TEXT [flags]\n"
      "       shardlm generate --server HOST:PORT --prompt TEXT [flags]\n"
      "Streams the completion of TEXT to stdout. Temperature 0 is greedy;\n"
      "the same seed gives the same text.");
  f.engine.Register(flags);
  flags.Add("server", &f.server,
            "HOST:PORT of a running server (shardlm serve); then --model "
            "and the engine flags are not used");
  flags.Add("prompt", &f.prompt, "text to complete");
  flags.Add("chat", &f.chat,
            "send the prompt as a user turn in the model's chat format");
  flags.Add("ignore-eos", &f.ignore_eos,
            "generate --max-tokens tokens, printing end-of-text tokens too");
  flags.Add("max-tokens", &f.max_tokens, "most tokens to generate");
  flags.Add("temperature", &f.temperature, "sampling temperature, 0 = greedy");
  flags.Add("top-k", &f.top_k, "keep the k most likely tokens, 0 = off");
  flags.Add("top-p", &f.top_p, "nucleus mass to keep, 1 = off");
  flags.Add("seed", &f.seed, "sampling seed");
  flags.Add("stats", &f.stats, "print token counts and speeds to stderr");
  flags.Add("stop", &f.stop,
            "end the completion where its text contains this string (not "
            "printed)");
  flags.Add("logprobs", &f.logprobs,
            "print each token's log-probability and this many most likely "
            "alternatives to stderr (0 = off, at most 20)");
  f.tls.Register(flags);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm generate: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  std::string problem;
  if (f.engine.model.empty() && f.server.empty()) {
    problem = "--model (or --server) is required";
  }
  if (problem.empty() && f.prompt.empty()) problem = "--prompt is required";
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  if (problem.empty() && (f.max_tokens < 1 || f.max_tokens > (1 << 24))) {
    problem = "--max-tokens must be at least 1";
  }
  if (problem.empty() && (f.top_k < 0 || f.top_k > (1 << 30))) {
    problem = "--top-k must be >= 0";
  }
  if (problem.empty() && (f.logprobs < 0 || f.logprobs > kMaxLogprobs)) {
    problem = absl::StrCat("--logprobs must be in [0, ", kMaxLogprobs, "]");
  }
  for (const std::string& stop : f.stop) {
    if (problem.empty() && (stop.empty() || stop.size() > 256)) {
      problem = "--stop must be 1 to 256 bytes";
    }
  }
  if (problem.empty()) problem = f.engine.Problem();
  const SamplingParams sampling{
      .temperature = static_cast<float>(f.temperature),
      .top_k = static_cast<int32_t>(f.top_k),
      .top_p = static_cast<float>(f.top_p),
      .seed = static_cast<uint64_t>(f.seed)};
  if (absl::Status s = ValidateSamplingParams(sampling);
      problem.empty() && !s.ok()) {
    problem = std::string(s.message());
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "shardlm generate: %s\n\n%s", problem.c_str(),
                 flags.Usage().c_str());
    return 2;
  }

  RemoteGenerateOptions request{
      .prompt = f.prompt,
      .chat = f.chat,
      .ignore_eos = f.ignore_eos,
      .max_tokens = static_cast<int32_t>(f.max_tokens),
      .sampling = sampling,
      .stats = f.stats,
      .stop = f.stop,
      .logprobs = static_cast<int32_t>(f.logprobs)};
  if (!f.server.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        f.tls.Credentials();
    if (!credentials.ok()) {
      std::fprintf(stderr, "shardlm generate: %s\n",
                   std::string(credentials.status().message()).c_str());
      return 2;
    }
    request.server = f.server;
    request.credentials = *std::move(credentials);
    return RemoteGenerate(request);
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto local = LoadLocalModel(f.engine);
  if (!local.ok()) return Fail(local.status());
  Engine& engine = *local->engine;
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();

  const Tokenizer& tok = *local->tokenizer;
  // The same request building and checks as gRPC and HTTP requests get
  // (chat format, BOS, stop tokens, limits).
  const InferenceService service(&engine, &tok, local->name,
                                 {.tp = static_cast<int>(f.engine.tp),
                                  .pp = static_cast<int>(f.engine.pp),
                                  .cp = static_cast<int>(f.engine.cp)});
  absl::StatusOr<GenerateRequest> built =
      service.ToEngineRequest(GenerateRequestProto(request));
  if (!built.ok()) return Fail(built.status());
  GenerateRequest req = *std::move(built);

  StreamingDetokenizer detok(&tok);
  StopStringFilter stop_strings(f.stop);
  const auto stops = req.stop_token_ids;
  const auto print = [](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto result = engine.Generate(req, [&](int32_t id) {
    // Stop tokens end the stream without being printed; a stop string ends
    // it (as a cancel here: the engine has no text) before itself.
    if (std::find(stops.begin(), stops.end(), id) == stops.end()) {
      print(stop_strings.Push(detok.Push(id)));
    }
    return !stop_strings.stopped();
  });
  if (!result.ok()) {
    std::fputc('\n', stdout);
    return Fail(result.status());
  }
  if (stop_strings.stopped()) result->finish_reason = FinishReason::kStop;
  print(stop_strings.Push(detok.Finish()));
  print(stop_strings.Finish());
  std::fputc('\n', stdout);
  std::fflush(stdout);  // Before the stats on stderr.
  if (f.logprobs > 0) {
    std::vector<PrintedToken> printed;
    const auto text_of = [&](int32_t id) {
      StreamingDetokenizer d(&tok);
      return d.Push(id) + d.Finish();
    };
    for (size_t i = 0; i < result->logprobs.size(); ++i) {
      const TokenLogprobs& lp = result->logprobs[i];
      PrintedToken& t = printed.emplace_back();
      t.token = {text_of(result->tokens[i]), lp.sampled};
      for (const TokenLogprob& a : lp.top) {
        t.top.push_back({text_of(a.token), a.logprob});
      }
    }
    PrintLogprobs(stderr, printed);
  }

  if (f.stats) {
    const size_t n = result->tokens.size();
    std::fprintf(
        stderr,
        "[shardlm] load %.2fs | prompt %zu tokens, prefill %.3fs (%.1f tok/s)"
        " | generated %zu tokens, decode %.1f tok/s | finish: %s | cpu "
        "kernels: %s\n",
        load_s, req.prompt.size(), result->prefill_seconds,
        req.prompt.size() / result->prefill_seconds, n,
        n > 1 ? (n - 1) / result->decode_seconds : 0.0,
        FinishReasonName(result->finish_reason), CpuIsaName(ActiveCpuIsa()));
  }
  return 0;
}

}  // namespace shardlm
