// What the KV tiers cost and save on this machine (a benchmark, not a
// test):
//   kv_tiers_bench --model PATH [--requests 12] [--prompt-tokens 200]
//                  [--max-tokens 32] [--device-blocks 40] [--threads 0]
//                  [--prefix-tokens 1024] [--json out.json]
// Preemption: the same concurrent requests with a device pool for all of
// them, with a small device pool and a host tier (swaps), and with the
// small pool alone (recompute). Reports wall time against the big pool,
// preemptions, blocks moved and the share of step time spent copying.
// Prefix cache: requests sharing a 1024-token prefix, one after another,
// with and without the cache: prompt tokens computed, hit rate and time to
// first token.
// Exits 1 when a run measured something else than it names: tokens that
// differ from the big pool's (or, with the prefix cache, from no cache),
// fewer tokens than asked, a pool of another size, a swap run that never
// swapped, a recompute run that never recomputed, a cache that never hit.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "kernels/blas_cpu.h"
#include "launch/flags.h"
#include "nlohmann/json.hpp"
#include "step/kv_cache.h"
#include "worker/kv_pool.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  std::string name;
  int64_t device_blocks = 0;
  double seconds = 0;
  int64_t output_tokens = 0;
  SchedulerStats stats;
  double copy_seconds = 0;
  double forward_seconds = 0;
  std::vector<std::vector<int32_t>> tokens;
};

std::vector<int32_t> Tokens(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) {
    t.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 13) % vocab));
  }
  return t;
}

absl::StatusOr<Run> Concurrent(const WeightSource& source,
                               const EngineOptions& options,
                               const std::vector<GenerateRequest>& reqs,
                               std::string name) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   CreateLocalEngine(source, options));
  Run run{.name = std::move(name),
          .device_blocks = engine->blocks().num_blocks()};
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                   engine->GenerateBatch(reqs));
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const GenerateResult& r : results) {
    run.output_tokens += static_cast<int64_t>(r.tokens.size());
    run.tokens.push_back(r.tokens);
  }
  run.stats = engine->stats();
  for (const RunnerStats& s : engine->executor().RankStats()) {
    run.copy_seconds += s.copy_seconds;
    run.forward_seconds += s.forward_seconds;
  }
  return run;
}

int Main(int argc, char** argv) {
  std::string model, json_path;
  int64_t requests = 12, prompt_tokens = 200, max_tokens = 32;
  int64_t device_blocks = 40, threads = 0, prefix_tokens = 1024;
  FlagSet flags("usage: kv_tiers_bench --model PATH [flags]");
  flags.Add("model", &model, "model path");
  flags.Add("requests", &requests, "concurrent requests");
  flags.Add("prompt-tokens", &prompt_tokens, "prompt length");
  flags.Add("max-tokens", &max_tokens, "tokens generated per request");
  flags.Add("device-blocks", &device_blocks,
            "device KV blocks in the small-pool runs");
  flags.Add("threads", &threads, "CPU threads, 0 = all cores");
  flags.Add("prefix-tokens", &prefix_tokens,
            "tokens of the prefix the prefix-cache requests share");
  flags.Add("json", &json_path, "also write results here");
  if (absl::Status s = flags.Parse(argc, argv, 1);
      !s.ok() || model.empty() || requests < 1 || prompt_tokens < 1 ||
      max_tokens < 1 || device_blocks < 1 || prefix_tokens < 16) {
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
  const ModelConfig& c = (*source)->config();
  // One device block of the whole model (K and V, every layer) in the
  // default KV dtype.
  const DType kv = kDefaultCpuKvDType;
  const int64_t block_bytes =
      2 * c.n_layers * *BytesFor(kv, 16 * c.n_kv_heads * c.head_dim);
  std::vector<GenerateRequest> reqs;
  for (int64_t i = 0; i < requests; ++i) {
    reqs.push_back(
        {.prompt = Tokens(prompt_tokens + (i * 37) % 64, i, c.vocab_size),
         .max_tokens = static_cast<int32_t>(max_tokens)});
  }
  const int64_t need = requests * ((prompt_tokens + 64 + max_tokens) / 16 + 1);
  EngineOptions base;
  base.threads = static_cast<int>(threads);
  base.limits.max_batched_tokens = 256;
  base.kv.dtype = kv;
  EngineOptions big = base, swap = base, recompute = base, checked = base;
  big.kv.kv_cache_bytes = need * block_bytes;
  swap.kv.kv_cache_bytes = recompute.kv.kv_cache_bytes =
      device_blocks * block_bytes;
  swap.kv.cpu_offload_bytes = need * block_bytes;
  big.kv.prefix_caching = swap.kv.prefix_caching = recompute.kv.prefix_caching =
      false;
  // The swap run again with --kv-checksum: what the checksums cost.
  checked = swap;
  checked.kv.checksum = true;

  nlohmann::json out;
  std::printf(
      "%lld requests of %lld-%lld prompt tokens, %lld generated each\n"
      "%-22s %9s %9s %10s %10s %11s %11s %12s\n",
      static_cast<long long>(requests), static_cast<long long>(prompt_tokens),
      static_cast<long long>(prompt_tokens + 63),
      static_cast<long long>(max_tokens), "run", "seconds", "vs big",
      "preempt sw", "preempt rc", "blocks out", "blocks in", "copy share");
  std::vector<Run> runs;
  for (auto [name, opts] :
       {std::pair{std::string("big device pool"), big},
        std::pair{absl::StrCat(device_blocks, " blocks + host"), swap},
        std::pair{absl::StrCat(device_blocks, " blocks, no host"), recompute},
        std::pair{absl::StrCat(device_blocks, " + host, checksum"), checked}}) {
    auto run = Concurrent(**source, opts, reqs, name);
    if (!run.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(),
                   std::string(run.status().message()).c_str());
      return 1;
    }
    runs.push_back(std::move(*run));
    const Run& r = runs.back();
    const double share =
        r.forward_seconds > 0 ? r.copy_seconds / r.forward_seconds : 0;
    std::printf("%-22s %9.2f %8.2fx %10lld %10lld %11lld %11lld %11.2f%%\n",
                r.name.c_str(), r.seconds, r.seconds / runs[0].seconds,
                static_cast<long long>(r.stats.preempted_swap),
                static_cast<long long>(r.stats.preempted_recompute),
                static_cast<long long>(r.stats.blocks.swapped_out),
                static_cast<long long>(r.stats.blocks.swapped_in), share * 100);
    const auto fail = [&](const std::string& why) {
      std::fprintf(stderr, "kv_tiers_bench: FAILED: %s: %s\n", r.name.c_str(),
                   why.c_str());
      return 1;
    };
    if (r.tokens != runs[0].tokens) {
      return fail("tokens differ from the big pool's");
    }
    if (r.output_tokens != requests * max_tokens) {
      return fail(absl::StrCat(r.output_tokens, " tokens, want ",
                               requests * max_tokens));
    }
    const int64_t want_blocks = runs.size() == 1 ? need : device_blocks;
    if (r.device_blocks != want_blocks) {
      return fail(
          absl::StrCat(r.device_blocks, " device blocks, want ", want_blocks));
    }
    if ((runs.size() == 2 || runs.size() == 4) && r.stats.preempted_swap == 0) {
      return fail("no request was swapped out (more --requests?)");
    }
    if (runs.size() == 3 && r.stats.preempted_recompute == 0) {
      return fail("no request was recomputed (more --requests?)");
    }
    if (runs.size() == 4 && r.stats.kv_checksum_failures != 0) {
      return fail(absl::StrCat(r.stats.kv_checksum_failures,
                               " checksum failures without corruption"));
    }
    out["preemption"].push_back(
        {{"run", r.name},
         {"seconds", r.seconds},
         {"slowdown_vs_big_pool", r.seconds / runs[0].seconds},
         {"output_tokens", r.output_tokens},
         {"preempted_swap", r.stats.preempted_swap},
         {"preempted_recompute", r.stats.preempted_recompute},
         {"blocks_swapped_out", r.stats.blocks.swapped_out},
         {"blocks_swapped_in", r.stats.blocks.swapped_in},
         {"copy_seconds", r.copy_seconds},
         {"copy_share_of_step_time", share}});
  }

  // What --kv-checksum costs a swap: 256 blocks of the whole model (every
  // layer, K and V) copied to the host tier and back, repeatedly, with
  // and without checksums (KvPool::CopyBlocks alone: the engine runs
  // above swap too few blocks to time).
  {
    double rate[2] = {0, 0};
    for (const bool checksum : {false, true}) {
      const int64_t n = 256;
      auto pool = KvPool::Create({.n_layers = c.n_layers,
                                  .kv_heads = c.n_kv_heads,
                                  .head_dim = c.head_dim,
                                  .block_size = 16,
                                  .num_blocks = n,
                                  .num_host_blocks = n,
                                  .dtype = kv,
                                  .checksum_host_tier = checksum});
      if (!pool.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(pool.status().message()).c_str());
        return 1;
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {  // Touch every page.
        std::memset((*pool)->k(l).data<char>(), 1, (*pool)->k(l).bytes());
        std::memset((*pool)->v(l).data<char>(), 2, (*pool)->v(l).bytes());
      }
      std::vector<BlockCopy> to_host, to_device;
      for (int32_t b = 0; b < n; ++b) {
        to_host.push_back({b, static_cast<int32_t>(n + b)});
        to_device.push_back({static_cast<int32_t>(n + b), b});
      }
      int64_t copied = 0;
      const auto t0 = Clock::now();
      double seconds = 0;
      while (seconds < 1.0) {
        if (!(*pool)->CopyBlocks(to_host).ok() ||
            !(*pool)->CopyBlocks(to_device).ok() ||
            !(*pool)->TakeChecksumFailures().ok()) {
          std::fprintf(stderr, "kv_tiers_bench: FAILED: block copies\n");
          return 1;
        }
        copied += 2 * n;
        seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      rate[checksum] = copied / seconds;
    }
    std::printf(
        "swap copies (%lld-byte blocks): %.0f blocks/s (%.2f GB/s) plain, "
        "%.0f blocks/s (%.2f GB/s) with --kv-checksum: %.2fx the copy "
        "time\n",
        static_cast<long long>(block_bytes), rate[0],
        rate[0] * block_bytes / 1e9, rate[1], rate[1] * block_bytes / 1e9,
        rate[0] / rate[1]);
    out["checksum"] = {{"block_bytes", block_bytes},
                       {"copy_blocks_per_second_plain", rate[0]},
                       {"copy_blocks_per_second_checksum", rate[1]}};
  }

  // Prefix cache: 4 requests sharing a prefix, one after another.
  const std::vector<int32_t> prefix = Tokens(prefix_tokens, 999, c.vocab_size);
  std::vector<GenerateRequest> chats;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r{.prompt = prefix, .max_tokens = 8};
    const auto tail = Tokens(40, 1000 + i, c.vocab_size);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    chats.push_back(std::move(r));
  }
  std::printf(
      "\n4 requests sharing a %lld-token prefix, one at a time\n"
      "%-10s %16s %10s %18s\n",
      static_cast<long long>(prefix_tokens), "cache", "prompt computed",
      "hit rate", "TTFT after first");
  std::vector<std::vector<int32_t>> first_tokens;
  for (bool cache : {false, true}) {
    EngineOptions o = base;
    o.kv.prefix_caching = cache;
    auto engine = CreateLocalEngine(**source, o);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(engine.status().message()).c_str());
      return 1;
    }
    double ttft_later = 0;
    int64_t prompt_total = 0;
    std::vector<std::vector<int32_t>> tokens;
    for (size_t i = 0; i < chats.size(); ++i) {
      auto r = (*engine)->Generate(chats[i]);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
        return 1;
      }
      if (i > 0) ttft_later += r->prefill_seconds / (chats.size() - 1);
      prompt_total += static_cast<int64_t>(chats[i].prompt.size());
      tokens.push_back(r->tokens);
    }
    const SchedulerStats st = (*engine)->stats();
    const int64_t decode = static_cast<int64_t>(chats.size()) * 7;
    const int64_t prompt_computed = st.computed_tokens - decode;
    const double hit = static_cast<double>(st.blocks.prefix_hit_tokens) /
                       static_cast<double>(prompt_total);
    std::printf("%-10s %9lld/%-6lld %9.1f%% %15.0f ms\n", cache ? "on" : "off",
                static_cast<long long>(prompt_computed),
                static_cast<long long>(prompt_total), hit * 100,
                ttft_later * 1e3);
    // The 2nd to 4th requests find the whole blocks of the prefix cached.
    const int64_t want_hits = cache ? 3 * (prefix_tokens / 16 * 16) : 0;
    if (st.blocks.prefix_hit_tokens != want_hits) {
      std::fprintf(stderr,
                   "kv_tiers_bench: FAILED: prefix cache %s: %lld prompt "
                   "tokens hit, want %lld\n",
                   cache ? "on" : "off",
                   static_cast<long long>(st.blocks.prefix_hit_tokens),
                   static_cast<long long>(want_hits));
      return 1;
    }
    if (!cache) {
      first_tokens = tokens;
    } else if (tokens != first_tokens) {
      std::fprintf(stderr,
                   "kv_tiers_bench: FAILED: prefix cache: tokens differ from "
                   "no cache\n");
      return 1;
    }
    out["prefix_cache"].push_back({{"cache", cache},
                                   {"prompt_tokens", prompt_total},
                                   {"prompt_tokens_computed", prompt_computed},
                                   {"hit_rate", hit},
                                   {"ttft_after_first_seconds", ttft_later}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  return shardlm::Main(argc, argv);
}
