// shardlm bench: load generator for a running server. For each concurrency
// level it keeps that many Generate streams in flight (one thread each) until
// --requests requests have finished, greedy with ignore_eos so every request
// generates exactly --max-tokens tokens, and reports throughput and latency
// percentiles measured at the client.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "launch/commands.h"
#include "launch/flags.h"
#include "launch/remote_generate.h"
#include "shardlm/v1/inference.grpc.pb.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct BenchFlags {
  std::string server;
  std::string concurrency = "1,8,32";
  int64_t requests = 64;
  std::string prompts;
  int64_t max_tokens = 64;
  std::string json;
  double connect_timeout = 5.0;
  double request_timeout = 300.0;
  ClientTlsFlags tls;
};

// Varied lengths, from a few words to a paragraph.
const char* const kBuiltinPrompts[] = {
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "Write a short poem about the sea.",
    "Explain why the sky is blue in simple terms.",
    "List five fruits that are red:",
    "In 1969, the first humans landed on the Moon. The mission was called",
    "Translate to French: Good morning, how are you today?",
    "A recipe for pancakes needs flour, eggs, milk and",
    "The quick brown fox jumps over the lazy dog. This sentence is famous "
    "because it contains every letter of the English alphabet, which makes "
    "it useful for",
    "Q: What is the largest planet in the solar system?\nA:",
    "Photosynthesis is the process by which green plants and some other "
    "organisms use sunlight to synthesize foods from carbon dioxide and "
    "water. In plants, photosynthesis generally involves the green pigment "
    "chlorophyll and generates oxygen as a by-product. The main stages are",
    "Dear customer, thank you for your order. Unfortunately",
    "int main() {\n  std::vector<int> v = {3, 1, 2};\n  std::sort(",
    "The history of the Roman Empire spans many centuries, beginning with the "
    "founding of the city of Rome and continuing through the Republic, the "
    "reigns of the emperors, the division into eastern and western halves, "
    "and finally the fall of the western empire in 476 AD. Historians have "
    "long debated the causes of that fall, pointing to",
};

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "ERROR";
  }
}

// Nearest-rank percentile of unsorted samples; 0 when there are none.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(p / 100.0 * v.size() + 0.999999);
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

struct LevelResult {
  int concurrency = 0;
  int64_t requests = 0;
  int64_t ok = 0;
  int64_t short_requests = 0;  // OK but fewer than max_tokens tokens.
  int64_t output_tokens = 0;
  double wall_s = 0;
  std::vector<double> ttft_s;
  std::vector<double> itl_s;
  std::map<std::string, int64_t> errors;
  std::string first_error;  // Code and message of one failed request.
};

struct Request {
  int64_t tokens = 0;
  double ttft_s = 0;
  std::vector<double> itl_s;
  grpc::Status status;
};

Request RunOne(v1::Inference::Stub& stub, const std::string& prompt,
               const BenchFlags& f) {
  v1::GenerateRequest req;
  req.set_prompt(prompt);
  req.set_max_tokens(static_cast<int32_t>(f.max_tokens));
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0.0f);

  grpc::ClientContext ctx;
  AddApiKey(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(
                       static_cast<int64_t>(f.request_timeout * 1000)));
  Request r;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub.Generate(&ctx, req);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.token_ids_size() == 0) continue;
    const Clock::time_point now = Clock::now();
    if (r.tokens == 0) {
      r.ttft_s = Seconds(start, now);
    } else {
      r.itl_s.push_back(Seconds(last, now));
    }
    last = now;
    r.tokens += response.token_ids_size();
  }
  r.status = reader->Finish();
  return r;
}

LevelResult RunLevel(v1::Inference::Stub& stub,
                     const std::vector<std::string>& prompts, int concurrency,
                     const BenchFlags& f) {
  LevelResult level;
  level.concurrency = concurrency;
  level.requests = f.requests;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      for (int64_t i = next++; i < f.requests; i = next++) {
        Request r = RunOne(stub, prompts[i % prompts.size()], f);
        std::lock_guard<std::mutex> lock(mu);
        if (r.status.ok()) {
          ++level.ok;
          if (r.tokens != f.max_tokens) ++level.short_requests;
          level.output_tokens += r.tokens;
          if (r.tokens > 0) level.ttft_s.push_back(r.ttft_s);
          level.itl_s.insert(level.itl_s.end(), r.itl_s.begin(), r.itl_s.end());
        } else {
          ++level.errors[CodeName(r.status.error_code())];
          if (level.first_error.empty()) {
            level.first_error = absl::StrCat(CodeName(r.status.error_code()),
                                             ": ", r.status.error_message());
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  level.wall_s = Seconds(start, Clock::now());
  return level;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

double PerSecond(double n, double s) { return s > 0 ? n / s : 0.0; }

std::string LevelJson(const LevelResult& l) {
  std::string errors;
  for (const auto& [code, n] : l.errors) {
    absl::StrAppend(&errors, errors.empty() ? "" : ", ", JsonString(code), ": ",
                    n);
  }
  return absl::StrFormat(
      "    {\"concurrency\": %d, \"requests\": %d, \"ok\": %d, "
      "\"short_requests\": %d, \"errors\": {%s}, \"wall_s\": %.6f, "
      "\"requests_per_s\": %.6f, \"output_tokens\": %d, "
      "\"output_tokens_per_s\": %.6f, \"ttft_ms\": {\"p50\": %.4f, \"p99\": "
      "%.4f}, \"itl_ms\": {\"p50\": %.4f, \"p99\": %.4f}}",
      l.concurrency, l.requests, l.ok, l.short_requests, errors, l.wall_s,
      PerSecond(l.ok, l.wall_s), l.output_tokens,
      PerSecond(l.output_tokens, l.wall_s), 1e3 * Percentile(l.ttft_s, 50),
      1e3 * Percentile(l.ttft_s, 99), 1e3 * Percentile(l.itl_s, 50),
      1e3 * Percentile(l.itl_s, 99));
}

bool WaitConnected(grpc::Channel& channel, double timeout_s) {
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
        state == GRPC_CHANNEL_SHUTDOWN ||
        !channel.WaitForStateChange(state, deadline)) {
      return false;
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return true;
}

void RegisterBenchFlags(FlagSet& flags, BenchFlags& f) {
  flags.Add("server", &f.server, "HOST:PORT of a running server");
  f.tls.Register(flags);
  flags.Add("concurrency", &f.concurrency,
            "comma-separated numbers of streams in flight");
  flags.Add("requests", &f.requests, "requests at each concurrency level");
  flags.Add("prompts", &f.prompts,
            "file with one prompt per line (default: 16 built-in prompts)");
  flags.Add("max-tokens", &f.max_tokens, "tokens generated per request");
  flags.Add("json", &f.json, "also write the results as JSON to this file");
  flags.Add("connect-timeout", &f.connect_timeout,
            "seconds to wait for the server to accept a connection");
  flags.Add("request-timeout", &f.request_timeout,
            "deadline of each request in seconds");
}

// The first problem with the flags ("" if none), checked in order; the
// concurrency levels in `*levels`.
std::string CheckBenchFlags(const BenchFlags& f, const FlagSet& flags,
                            std::vector<int>* levels) {
  std::string problem;
  if (f.server.empty()) problem = "--server is required";
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  if (problem.empty()) {
    for (const absl::string_view part : absl::StrSplit(f.concurrency, ',')) {
      int c = 0;
      if (!absl::SimpleAtoi(part, &c) || c < 1 || c > 4096) {
        problem = absl::StrCat("--concurrency: '", part,
                               "' is not a number from 1 to 4096");
        break;
      }
      levels->push_back(c);
    }
  }
  if (problem.empty() && (f.requests < 1 || f.requests > (1 << 24))) {
    problem = "--requests must be at least 1";
  }
  if (problem.empty() && (f.max_tokens < 1 || f.max_tokens > (1 << 24))) {
    problem = "--max-tokens must be at least 1";
  }
  if (problem.empty() && (f.connect_timeout <= 0 || f.request_timeout <= 0)) {
    problem = "timeouts must be positive";
  }
  return problem;
}

// --prompts' lines (CR stripped, blank ones skipped), or the built-in ones.
absl::StatusOr<std::vector<std::string>> LoadPrompts(const BenchFlags& f) {
  std::vector<std::string> prompts;
  if (f.prompts.empty()) {
    prompts.assign(std::begin(kBuiltinPrompts), std::end(kBuiltinPrompts));
    return prompts;
  }
  std::ifstream in(f.prompts);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", f.prompts));
  }
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.prompts, " has no prompts"));
  }
  return prompts;
}

// Runs each concurrency level, printing a table row as each ends; whether
// any request failed.
bool RunLevels(v1::Inference::Stub& stub,
               const std::vector<std::string>& prompts,
               const std::vector<int>& levels, const BenchFlags& f,
               std::vector<LevelResult>* results) {
  std::printf(
      "shardlm bench: %s, %d prompts, %d requests per level, %d "
      "tokens each (greedy, ignore_eos)\n",
      f.server.c_str(), static_cast<int>(prompts.size()),
      static_cast<int>(f.requests), static_cast<int>(f.max_tokens));
  std::printf("%11s %8s %9s %10s %10s %10s %10s %10s  %s\n", "concurrency",
              "ok", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50",
              "ITL p99", "errors");
  std::fflush(stdout);
  bool any_error = false;
  for (const int c : levels) {
    LevelResult l = RunLevel(stub, prompts, c, f);
    std::string errors;
    for (const auto& [code, n] : l.errors) {
      absl::StrAppend(&errors, errors.empty() ? "" : " ", code, "=", n);
    }
    if (l.short_requests > 0) {
      absl::StrAppend(&errors, errors.empty() ? "" : " ",
                      "short=", l.short_requests);
    }
    std::printf("%11d %8d %9.2f %10.1f %8.1fms %8.1fms %8.1fms %8.1fms  %s\n",
                c, static_cast<int>(l.ok), PerSecond(l.ok, l.wall_s),
                PerSecond(l.output_tokens, l.wall_s),
                1e3 * Percentile(l.ttft_s, 50), 1e3 * Percentile(l.ttft_s, 99),
                1e3 * Percentile(l.itl_s, 50), 1e3 * Percentile(l.itl_s, 99),
                errors.empty() ? "-" : errors.c_str());
    std::fflush(stdout);
    if (!l.first_error.empty()) {
      std::fprintf(stderr, "shardlm bench: e.g. %s\n", l.first_error.c_str());
    }
    any_error = any_error || !l.errors.empty();
    results->push_back(std::move(l));
  }
  return any_error;
}

// --json: the run's settings and each level's results; false if the file
// could not be written.
bool WriteJson(const BenchFlags& f, size_t n_prompts,
               const std::vector<LevelResult>& results) {
  std::string json = absl::StrFormat(
      "{\n  \"server\": %s,\n  \"max_tokens\": %d,\n  "
      "\"requests_per_level\": %d,\n  \"prompts\": %d,\n  \"levels\": [\n",
      JsonString(f.server), f.max_tokens, f.requests, n_prompts);
  for (size_t i = 0; i < results.size(); ++i) {
    absl::StrAppend(&json, LevelJson(results[i]),
                    i + 1 < results.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&json, "  ]\n}\n");
  std::ofstream out(f.json);
  out << json;
  return static_cast<bool>(out.flush());
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  BenchFlags f;
  FlagSet flags(
      "usage: shardlm bench --server HOST:PORT [--concurrency 1,8,32] "
      "[--requests N]\n"
      "                     [--prompts FILE] [--max-tokens 64] [--json OUT]\n"
      "Load-tests a running server: at each concurrency level, N greedy\n"
      "requests (ignore_eos, so each generates exactly --max-tokens tokens)\n"
      "with that many streams in flight. Reports requests/s, output tokens/s,\n"
      "time to first token and inter-token latency (p50/p99), and errors by\n"
      "status code. Exits 1 if any request failed.");
  RegisterBenchFlags(flags, f);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm bench: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  std::vector<int> levels;
  if (const std::string problem = CheckBenchFlags(f, flags, &levels);
      !problem.empty()) {
    std::fprintf(stderr, "shardlm bench: %s\n\n%s", problem.c_str(),
                 flags.Usage().c_str());
    return 2;
  }

  absl::StatusOr<std::vector<std::string>> prompts = LoadPrompts(f);
  if (!prompts.ok()) {
    std::fprintf(stderr, "shardlm bench: %s\n",
                 std::string(prompts.status().message()).c_str());
    return 1;
  }

  // One channel: gRPC multiplexes the concurrent streams over it.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      f.tls.Credentials();
  if (!credentials.ok()) {
    std::fprintf(stderr, "shardlm bench: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(f.server, *credentials);
  if (!WaitConnected(*channel, f.connect_timeout)) {
    std::fprintf(stderr,
                 "shardlm bench: cannot reach the server at %s (is `shardlm "
                 "serve` running there?)\n",
                 f.server.c_str());
    return 1;
  }
  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(channel);

  std::vector<LevelResult> results;
  const bool any_error = RunLevels(*stub, *prompts, levels, f, &results);

  if (!f.json.empty() && !WriteJson(f, prompts->size(), results)) {
    std::fprintf(stderr, "shardlm bench: cannot write %s\n", f.json.c_str());
    return 1;
  }
  // Failed requests are measurements, not a failure of the tool; still,
  // a script should notice them.
  return any_error ? 1 : 0;
}

}  // namespace shardlm
