// Decode throughput of a synthetic 1B-class Llama in bf16 on one GPU
// (CudaModelRunner), against the HBM bandwidth floor.
//
//   gpu_decode_bench [--batches 1,16] [--prompt 128] [--steps 64]
//                    [--peak-gbps 4800] [--device 0] [--json FILE]
//                    [--weights bf16|q8_0|q4_0]
//
// --weights q8_0 / q4_0 keeps the projections and the LM head packed in
// that format (--cuda-weights quantized; RandomLlamaWeights): decode steps
// of up to 8 sequences take the quantized GEMV, the prompts' prefill the
// dequantize + cuBLAS path. The bytes a step reads then count the packed
// bytes (1.0625 / 0.5625 a weight; the embedding, read one row a token, is
// not counted), so the fraction of the floor is against the quantized
// floor, not bf16's.
//
// For each batch size, with CUDA graphs and with eager launches: every
// sequence is prefilled with `prompt` random
// tokens, then `steps` greedy decode steps are timed. A step must read
// every weight matrix once (bf16) and each sequence's K/V so far (bf16);
// that byte count over the step time is the achieved bandwidth, reported
// as a fraction of (a) the nominal peak (--peak-gbps, 4800 GB/s for an
// H200) and (b) the device-to-device copy bandwidth measured in the same
// run (cudaMemcpy moves 2 bytes of traffic per byte copied). Exits 1 when
// CUDA graph capture failed or when the graph replays decoded other tokens
// than the eager launches of the same prompts.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/cuda_model_runner.h"

namespace shardlm {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gpu_decode_bench: %s\n", msg.c_str());
  return 2;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Device-to-device copy bandwidth in GB/s of traffic (read + write).
double CopyBandwidth(int device) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  cudaSetDevice(device);
  if (cudaMalloc(&a, bytes) != cudaSuccess ||
      cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0;
  }
  cudaMemset(a, 1, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // Warm up.
  cudaDeviceSynchronize();
  const int reps = 10;
  const double start = Now();
  for (int i = 0; i < reps; ++i) {
    cudaMemcpy(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  }
  cudaDeviceSynchronize();
  const double secs = Now() - start;
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / secs / 1e9;
}

int Main(int argc, char** argv) {
  std::vector<int> batches = {1, 16};
  int prompt = 128, steps = 64, device = 0;
  double peak_gbps = 4800;
  std::string json_path, model = "1b";
  DType matrices = DType::kBF16;
  // The fraction of every sequence's KV blocks (its oldest) kept in the
  // host tier, which attention reads over the bus in place.
  double host_fraction = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--batches") {
      batches.clear();
      for (absl::string_view b : absl::StrSplit(value, ',')) {
        int v;
        if (!absl::SimpleAtoi(b, &v) || v < 1) return Fail("bad --batches");
        batches.push_back(v);
      }
    } else if (flag == "--prompt") {
      if (!absl::SimpleAtoi(value, &prompt) || prompt < 1)
        return Fail("bad --prompt");
    } else if (flag == "--steps") {
      if (!absl::SimpleAtoi(value, &steps) || steps < 1)
        return Fail("bad --steps");
    } else if (flag == "--device") {
      if (!absl::SimpleAtoi(value, &device)) return Fail("bad --device");
    } else if (flag == "--peak-gbps") {
      if (!absl::SimpleAtod(value, &peak_gbps)) return Fail("bad --peak-gbps");
    } else if (flag == "--json") {
      json_path = value;
    } else if (flag == "--host-fraction") {
      if (!absl::SimpleAtod(value, &host_fraction) || host_fraction < 0 ||
          host_fraction > 1) {
        return Fail("--host-fraction must be in [0, 1]");
      }
    } else if (flag == "--weights") {
      if (value == "bf16") {
        matrices = DType::kBF16;
      } else if (value == "q8_0") {
        matrices = DType::kQ8_0;
      } else if (value == "q4_0") {
        matrices = DType::kQ4_0;
      } else {
        return Fail("--weights: bf16, q8_0 or q4_0");
      }
    } else if (flag == "--model") {
      if (value != "1b" && value != "8b") return Fail("--model: 1b or 8b");
      model = value;
    } else {
      return Fail("unknown flag " + flag);
    }
  }

  // Synthetic Llama shapes: a 1B-class model, and Llama 3 8B's (32 layers,
  // 4096 wide, 14336 FFN, 32 query over 8 KV heads of 128, 128K vocab).
  ModelConfig c;
  c.name = "synthetic-1b-bf16";
  c.n_layers = 16;
  c.hidden = 2048;
  c.ffn_hidden = 8192;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.context_length = 4096;
  c.rope_theta = 500000.0f;
  if (model == "8b") {
    c.name = "synthetic-8b-bf16";
    c.n_layers = 32;
    c.hidden = 4096;
    c.ffn_hidden = 14336;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.context_length = 8192;
  }
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  const int64_t block_size = 16;
  const int64_t blocks_per_seq = (prompt + steps + 4 + block_size) / block_size;
  const KvPoolConfig kv{.n_layers = c.n_layers,
                        .kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = block_size,
                        .num_blocks = blocks_per_seq * max_batch};
  auto runner = CudaModelRunner::Create(device, c, kv);
  if (!runner.ok()) {
    const std::string msg(runner.status().message());
    // No GPU visible: a skip (ctest's SKIP_RETURN_CODE), not a pass; any
    // other failure fails.
    if (absl::StartsWith(msg, "no CUDA device")) {
      std::fprintf(stderr, "gpu_decode_bench: skipped: %s\n", msg.c_str());
      return 77;
    }
    return Fail(msg);
  }
  CudaModelRunner& r = **runner;
  if (matrices != DType::kBF16) {
    c.name = absl::StrCat("synthetic-", model, "-", DTypeName(matrices));
  }
  auto weights = RandomLlamaWeights(c, 1, r.backend(), r.exec(), matrices);
  if (!weights.ok()) return Fail(std::string(weights.status().message()));
  const int64_t weight_bytes = weights->bytes_per_step();
  if (absl::Status set = r.SetWeights(std::move(*weights)); !set.ok()) {
    return Fail(std::string(set.message()));
  }
  // Sequence s owns device blocks [s * dev_per_seq, ...) and host blocks
  // [s * host_per_seq, ...) (ids past the device pool), its oldest first.
  const int64_t host_per_seq =
      static_cast<int64_t>(host_fraction * blocks_per_seq);
  const int64_t dev_per_seq = blocks_per_seq - host_per_seq;
  if (absl::Status set =
          r.SetKvBlocks(std::max<int64_t>(1, dev_per_seq) * max_batch,
                        host_per_seq * max_batch);
      !set.ok()) {
    return Fail(std::string(set.message()));
  }
  const int64_t device_blocks = std::max<int64_t>(1, dev_per_seq) * max_batch;

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  const double copy_gbps = CopyBandwidth(device);
  std::printf("device %d: %s, %.1f GiB\n", device, prop.name,
              prop.totalGlobalMem / double(1 << 30));
  std::printf(
      "model %s: %lld layers, hidden %lld, ffn %lld, %lld/%lld "
      "heads, vocab %lld; %.3f GB of %s weights read per step\n",
      c.name.c_str(), (long long)c.n_layers, (long long)c.hidden,
      (long long)c.ffn_hidden, (long long)c.n_heads, (long long)c.n_kv_heads,
      (long long)c.vocab_size, weight_bytes / 1e9,
      matrices == DType::kBF16 ? "bf16" : DTypeName(matrices));
  std::printf(
      "bandwidth: nominal peak %.0f GB/s, measured D2D copy %.0f "
      "GB/s (%.0f%% of peak)\n",
      peak_gbps, copy_gbps, 100 * copy_gbps / peak_gbps);
  if (host_per_seq > 0) {
    std::printf(
        "host tier: the oldest %lld of each sequence's %lld KV blocks in "
        "pinned host memory, read in place over the bus\n",
        static_cast<long long>(host_per_seq),
        static_cast<long long>(blocks_per_seq));
  }

  std::string json =
      "{\"device\": \"" + std::string(prop.name) + "\", \"model\": \"" +
      c.name + "\", \"weights\": \"" + DTypeName(matrices) +
      "\", \"host_fraction\": " + std::to_string(host_fraction) +
      ", \"prompt\": " + std::to_string(prompt) +
      ", \"peak_gbps\": " + std::to_string(peak_gbps) +
      ", \"copy_gbps\": " + std::to_string(copy_gbps) +
      ", \"weight_bytes\": " + std::to_string(weight_bytes) + ", \"runs\": [";
  bool first_run = true;
  bool failed = false;
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    // Every token decoded with graphs, then eagerly: the same prompts must
    // give the same tokens (a replay runs exactly the eager kernels).
    std::vector<int32_t> decoded[2];
    for (const bool graphs : {true, false}) {
      const int batch = batches[bi];
      std::mt19937 rng(1000 + batch);  // The same prompts for both modes.
      std::vector<int32_t>& trace = decoded[graphs ? 0 : 1];
      r.set_cuda_graphs(graphs);
      std::vector<std::vector<int32_t>> tables(batch);
      for (int s = 0; s < batch; ++s) {
        for (int64_t b = 0; b < host_per_seq; ++b) {
          tables[s].push_back(
              static_cast<int32_t>(device_blocks + s * host_per_seq + b));
        }
        for (int64_t b = 0; b < dev_per_seq; ++b) {
          tables[s].push_back(static_cast<int32_t>(s * dev_per_seq + b));
        }
      }
      std::vector<int32_t> last(batch);
      for (int s = 0; s < batch; ++s) {  // Prefill, one sequence per step.
        StepInput p;
        p.block_tables = {tables[s]};
        p.seq_ids = {s};
        for (int i = 0; i < prompt; ++i) {
          p.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
          p.positions.push_back(i);
          p.token_seq.push_back(0);
        }
        p.logit_rows = {prompt - 1};
        p.sampling = {SamplingParams{}};
        p.sample_index = {0};
        auto out = r.Step(p);
        if (!out.ok()) return Fail(std::string(out.status().message()));
        last[s] = out->tokens[0];
      }
      const auto decode = [&](int pos) -> absl::Status {
        StepInput d;
        d.block_tables = tables;
        for (int s = 0; s < batch; ++s) {
          d.tokens.push_back(last[s]);
          d.positions.push_back(pos);
          d.token_seq.push_back(s);
          d.seq_ids.push_back(s);
          d.logit_rows.push_back(s);
          d.sampling.push_back(SamplingParams{});
          d.sample_index.push_back(pos);
        }
        auto out = r.Step(d);
        if (!out.ok()) return out.status();
        last = out->tokens;
        trace.insert(trace.end(), last.begin(), last.end());
        return absl::OkStatus();
      };
      const int warmup = 3;
      for (int i = 0; i < warmup; ++i) {
        if (auto s = decode(prompt + i); !s.ok()) {
          return Fail(std::string(s.message()));
        }
      }
      // Graphs captured during the timed steps: none while the padded
      // shape holds (the graph cache replays; worker/cuda_graphs.h).
      const int64_t captures_before = r.graph_captures();
      const int64_t replays_before = r.graph_replays();
      const double start = Now();
      for (int i = 0; i < steps; ++i) {
        if (auto s = decode(prompt + warmup + i); !s.ok()) {
          return Fail(std::string(s.message()));
        }
      }
      const double secs = Now() - start;
      const int64_t captures = r.graph_captures() - captures_before;
      const int64_t replays = r.graph_replays() - replays_before;
      const double step_s = secs / steps;
      // K and V of every sequence at its average context during the run.
      const double avg_ctx = prompt + warmup + steps / 2.0;
      const double kv_bytes = 2.0 * batch * avg_ctx * c.n_layers *
                              c.n_kv_heads * c.head_dim * 2 /*bf16*/;
      const double bytes = weight_bytes + kv_bytes;
      const double gbps = bytes / step_s / 1e9;
      const char* mode = !graphs           ? "eager"
                         : r.cuda_graphs() ? "graphs"
                                           : "graphs-failed";
      if (graphs && !r.cuda_graphs()) failed = true;
      std::printf(
          "batch %2d %-6s: %8.1f tokens/s, %.3f ms/step, %.2f GB/step "
          "-> %.0f GB/s = %.1f%% of peak, %.1f%% of measured copy "
          "bandwidth; %lld captures, %lld replays\n",
          batch, mode, batch / step_s, step_s * 1e3, bytes / 1e9, gbps,
          100 * gbps / peak_gbps, 100 * gbps / copy_gbps,
          static_cast<long long>(captures), static_cast<long long>(replays));
      json += std::string(first_run ? "" : ", ") +
              "{\"batch\": " + std::to_string(batch) + ", \"mode\": \"" + mode +
              "\"" + ", \"tokens_per_s\": " + std::to_string(batch / step_s) +
              ", \"step_ms\": " + std::to_string(step_s * 1e3) +
              ", \"bytes_per_step\": " + std::to_string(bytes) +
              ", \"frac_of_peak\": " + std::to_string(gbps / peak_gbps) +
              ", \"frac_of_copy\": " + std::to_string(gbps / copy_gbps) +
              ", \"graph_captures\": " + std::to_string(captures) +
              ", \"graph_replays\": " + std::to_string(replays) + "}";
      first_run = false;
    }
    if (decoded[0] != decoded[1]) {
      std::fprintf(stderr,
                   "gpu_decode_bench: batch %d: CUDA graph replays decoded "
                   "other tokens than eager launches\n",
                   batches[bi]);
      failed = true;
    }
  }
  json += "]}";
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  if (failed) {
    std::fprintf(stderr,
                 "gpu_decode_bench: FAILED (graph capture failed, or graphs "
                 "and eager launches disagree)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
