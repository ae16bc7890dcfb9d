// Engine throughput on this machine, as ratios against its own measured
// memory bandwidth (a benchmark, not a test):
//   engine_bench --model PATH [--threads 1,2] [--prompt-tokens 512]
//                [--decode-tokens 128] [--batch 1] [--repeat 1]
//                [--bandwidth-mib 1024] [--json out.json]
// For each thread count: prefill tokens/s of one prompt, decode tokens/s,
// and decode time against the bandwidth floor (bytes each decode step must
// read: every weight matrix once plus the KV cache so far, divided by the
// measured read bandwidth at that thread count). With --batch N, N
// sequences of distinct prompts are prefilled in one step (N x
// prompt-tokens must fit the engine's 512-token budget) and decoded side by
// side: the decode figures are then per step of N tokens (what the
// simulator's CPU profile calibrates its batched matrix-vector rate from).
// Each engine first runs an untimed warm-up batch of the same shape; with
// --repeat R the batch is timed R times and the medians are reported.
// Every timed run must decode all its tokens, the same as an untimed
// reference run (one thread, TP = PP = 1); exits 1 when one does not.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/tensor.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "kernels/blas_cpu.h"
#include "kernels/cpu_isa.h"
#include "kernels/threading.h"
#include "launch/flags.h"
#include "nlohmann/json.hpp"
#include "worker/kv_pool.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// Best-of-5 read bandwidth (bytes/s) summing a buffer of `mib` MiB with
// the current thread count.
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ReadBandwidth(int64_t mib) {
  const int64_t n = mib << 18;  // floats.
  Tensor buf = *Tensor::Host(DType::kF32, {n});
  float* p = buf.data<float>();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i & 7);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    float total = 0;
#pragma omp parallel for simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += p[i];
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink = sink + total;
    best = std::max(best, n * 4.0 / s);
  }
  return best;
}

// The weight bytes a decode step of `batch` tokens reads, from the file.
double DecodeWeightBytes(const WeightSource& source, int64_t batch) {
  const ModelConfig& c = source.config();
  double expert_share = 1;
  if (c.is_moe()) {
    const double e = static_cast<double>(c.n_experts);
    expert_share = 1 - std::pow(1 - static_cast<double>(c.n_experts_used) / e,
                                static_cast<double>(batch));
  }
  double bytes = 0;
  for (const TensorInfo& t : source.tensors()) {
    if (t.name == "token_embd.weight" && !c.tied_embeddings) continue;
    const bool expert = t.name.find("_exps.") != std::string::npos ||
                        (t.name.find(".ffn_") != std::string::npos &&
                         std::count(t.name.begin(), t.name.end(), '.') == 4);
    bytes += static_cast<double>(t.bytes) * (expert ? expert_share : 1.0);
  }
  return bytes;
}

int Main(int argc, char** argv) {
  std::string model, threads_arg = "1,2", json_path, precision_arg = "exact";
  int64_t tp = 1, pp = 1;
  int64_t prompt_tokens = 512, decode_tokens = 128, bandwidth_mib = 1024;
  int64_t batch = 1, repeat = 1;
  FlagSet flags("usage: engine_bench --model PATH [flags]");
  flags.Add("model", &model, "model path");
  flags.Add("threads", &threads_arg, "comma-separated thread counts");
  flags.Add("prompt-tokens", &prompt_tokens, "prompt length");
  flags.Add("decode-tokens", &decode_tokens, "decode steps timed");
  flags.Add("batch", &batch, "sequences decoded side by side");
  flags.Add("repeat", &repeat,
            "timed batches per thread count (the medians are reported)");
  flags.Add("bandwidth-mib", &bandwidth_mib,
            "MiB summed to measure the read bandwidth");
  flags.Add("json", &json_path, "also write results here");
  flags.Add("tp", &tp, "tensor-parallel shards (threads of this process)");
  flags.Add("pp", &pp, "pipeline stages (threads of this process)");
  flags.Add("precision", &precision_arg,
            "exact or fast (kernels/precision.h); fast runs are not held to "
            "the reference run's tokens: its int8 rounding turns the "
            "thread count's f32 reordering into other draws of its error");
  const absl::Status parsed = flags.Parse(argc, argv, 1);
  const absl::StatusOr<Precision> precision = ParsePrecision(precision_arg);
  if (absl::Status s = parsed; !s.ok() || !precision.ok() || model.empty() ||
                               prompt_tokens < 1 || decode_tokens < 1 ||
                               bandwidth_mib < 1 || batch < 1 || repeat < 1) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  auto source = OpenWeights(model);
  if (!source.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  const int32_t vocab = (*source)->config().vocab_size;
  const EngineOptions defaults;
  if (batch > 1 &&
      (batch * prompt_tokens > defaults.limits.max_batched_tokens ||
       batch > defaults.limits.max_seqs)) {
    std::fprintf(stderr,
                 "--batch %lld x --prompt-tokens %lld: the prompts must be "
                 "prefilled in one step of at most %d tokens and %d "
                 "sequences\n",
                 static_cast<long long>(batch),
                 static_cast<long long>(prompt_tokens),
                 defaults.limits.max_batched_tokens, defaults.limits.max_seqs);
    return 2;
  }
  // Distinct prompts (no shared prefix for the prefix cache to find); a
  // warm-up batch of the same shape with other prompts first.
  const auto make_requests = [&](int64_t salt) {
    std::vector<GenerateRequest> requests(batch);
    for (int64_t r = 0; r < batch; ++r) {
      requests[r].max_tokens = static_cast<int32_t>(decode_tokens + 1);
      for (int64_t i = 0; i < prompt_tokens; ++i) {
        requests[r].prompt.push_back(static_cast<int32_t>(
            (i * 7919 + 13 + (r + salt * batch) * 104729) % vocab));
      }
    }
    return requests;
  };
  const std::vector<GenerateRequest> requests = make_requests(0);
  const std::vector<GenerateRequest> warm_up = make_requests(1);
  // The tokens every timed run must decode (greedy; no stop tokens, so all
  // max_tokens of them).
  std::vector<std::vector<int32_t>> reference;
  {
    auto engine =
        CreateLocalEngine(**source, {.threads = 1, .precision = *precision});
    auto results =
        engine.ok()
            ? (*engine)->GenerateBatch(requests)
            : absl::StatusOr<std::vector<GenerateResult>>(engine.status());
    if (!results.ok()) {
      std::fprintf(stderr, "reference run: %s\n",
                   std::string(results.status().message()).c_str());
      return 1;
    }
    for (const GenerateResult& r : *results) {
      if (r.tokens.size() != static_cast<size_t>(decode_tokens + 1)) {
        std::fprintf(stderr, "reference run: %zu tokens, want %lld\n",
                     r.tokens.size(),
                     static_cast<long long>(decode_tokens + 1));
        return 1;
      }
      reference.push_back(r.tokens);
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "tp %d x pp %d, batch %d, CPU kernels %s, OpenBLAS %s, precision "
      "%s\n%-8s %14s %14s %12s %14s %12s %10s\n",
      static_cast<int>(tp), static_cast<int>(pp), static_cast<int>(batch),
      CpuIsaName(ActiveCpuIsa()), BlasCoreName(), PrecisionName(*precision),
      "threads", "prefill tok/s", "decode tok/s", "read GB/s", "floor ms/tok",
      "of floor", "comm");
  for (absl::string_view t : absl::StrSplit(threads_arg, ',')) {
    int threads;
    if (!absl::SimpleAtoi(t, &threads) || threads < 1) {
      std::fprintf(stderr, "bad --threads entry '%s'\n",
                   std::string(t).c_str());
      return 2;
    }
    // Without the prefix cache, the timed batches reuse the KV blocks (and
    // scratch buffers, and OpenMP threads) the warm-up touched first, as
    // a server's steps do after its first requests: the first step pays
    // the page faults.
    auto engine = CreateLocalEngine(**source, {.kv = {.prefix_caching = false},
                                               .threads = threads,
                                               .tp = static_cast<int>(tp),
                                               .pp = static_cast<int>(pp),
                                               .precision = *precision});
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(engine.status().message()).c_str());
      return 1;
    }
    const ModelConfig& c = (*engine)->config();
    if (auto w = (*engine)->GenerateBatch(warm_up); !w.ok()) {
      std::fprintf(stderr, "warm-up: %s\n",
                   std::string(w.status().message()).c_str());
      return 1;
    }
    // Each timed batch's prefill and decode spans (the slowest sequence's);
    // the medians are reported.
    std::vector<double> prefills, decodes;
    for (int64_t rep = 0; rep < repeat; ++rep) {
      auto results = (*engine)->GenerateBatch(requests);
      if (!results.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(results.status().message()).c_str());
        return 1;
      }
      double prefill_s = 0, decode_s = 0;
      for (int64_t r = 0; r < batch; ++r) {
        const std::vector<int32_t>& got = (*results)[r].tokens;
        const std::vector<int32_t>& want = reference[r];
        if (*precision == Precision::kExact && got != want) {
          size_t at = 0;
          while (at < std::min(want.size(), got.size()) &&
                 got[at] == want[at]) {
            ++at;
          }
          std::fprintf(stderr,
                       "engine_bench: FAILED: %d threads decoded %zu tokens "
                       "of sequence %lld that differ from the reference "
                       "run's %zu at token %zu\n",
                       threads, got.size(), static_cast<long long>(r),
                       want.size(), at);
          return 1;
        }
        prefill_s = std::max(prefill_s, (*results)[r].prefill_seconds);
        decode_s = std::max(decode_s, (*results)[r].decode_seconds);
      }
      prefills.push_back(prefill_s);
      decodes.push_back(decode_s);
    }
    const double prefill_s = Median(prefills), decode_s = Median(decodes);
    // Tokens/s over the whole batch; a decode step makes `batch` of them.
    const double prefill_tps = batch * prompt_tokens / prefill_s;
    const double decode_tps = batch * decode_tokens / decode_s;
    // Bytes one decode step reads: every weight tensor once in its stored
    // format (the embedding only as the LM head when tied), a mixture's
    // experts only as many as the step's tokens touch on average (of E,
    // top-k each: E (1 - (1 - k/E)^batch)), plus K and V of the average
    // context in the cache's dtype.
    const double weight_bytes = DecodeWeightBytes(**source, batch);
    const double avg_ctx = prompt_tokens + decode_tokens / 2.0;
    // In the dtype the cache really stores (f16 by default on CPUs).
    const DType kv_dtype = (*engine)->executor().kv_cache_dtype();
    const double kv_bytes =
        batch * avg_ctx * static_cast<double>(KvBytesPerToken(c, kv_dtype));
    const double bandwidth = ReadBandwidth(bandwidth_mib);
    // One step's floor (weights once for the whole batch) against one step.
    const double floor_s = (weight_bytes + kv_bytes) / bandwidth;
    const double step_s = decode_s / decode_tokens;
    const double fraction = floor_s / step_s;
    // Share of each rank's step time spent in communicator calls
    // (including waits for peers), averaged over ranks.
    double comm_share = 0;
    const auto stats = (*engine)->executor().RankStats();
    for (const RunnerStats& s : stats) {
      if (s.forward_seconds > 0)
        comm_share += s.comm_seconds / s.forward_seconds;
    }
    if (!stats.empty()) comm_share /= stats.size();
    std::printf("%-8d %14.1f %14.2f %12.2f %14.2f %11.0f%% %9.0f%%\n", threads,
                prefill_tps, decode_tps, bandwidth / 1e9, floor_s * 1e3,
                fraction * 100, comm_share * 100);
    rows.push_back({{"threads", threads},
                    {"batch", batch},
                    {"prompt_tokens", prompt_tokens},
                    {"decode_tokens", decode_tokens},
                    {"decode_step_seconds", step_s},
                    {"prefill_tokens_per_s", prefill_tps},
                    {"decode_tokens_per_s", decode_tps},
                    {"read_bandwidth_bytes_per_s", bandwidth},
                    {"bytes_per_decode_step", weight_bytes + kv_bytes},
                    {"kv_cache_dtype", KvCacheDTypeName(kv_dtype)},
                    {"decode_fraction_of_bandwidth_floor", fraction},
                    {"tp", tp},
                    {"pp", pp},
                    {"blas_core", BlasCoreName()},
                    {"comm_share_of_step_time", comm_share}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << rows.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  return shardlm::Main(argc, argv);
}
