// shardlm inspect: what a model file holds.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu_isa.h"
#include "kernels/threading.h"
#include "launch/commands.h"
#include "launch/flags.h"
#include "model/chat_template.h"
#include "model/shard_plan.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"
#include "step/kv_cache.h"

namespace shardlm {
namespace {

// gpt-oss's Hugging Face experts are MXFP4 in two u8 tensors (loaded as
// raw bytes): _blocks hold two values a byte, _scales one scale per 32 of
// them. Both show as MXFP4, the values counted with the blocks.
bool IsMxfp4Part(const TensorInfo& t, std::string_view part) {
  return t.dtype == DType::kI8 && t.name.ends_with(part);
}
DType ShownDType(const TensorInfo& t) {
  return IsMxfp4Part(t, ".blocks") || IsMxfp4Part(t, ".scales") ? DType::kMXFP4
                                                                : t.dtype;
}
uint64_t StoredValues(const TensorInfo& t) {
  if (IsMxfp4Part(t, ".scales")) return 0;
  uint64_t values = IsMxfp4Part(t, ".blocks") ? 2 : 1;
  for (int64_t d : t.shape) values *= static_cast<uint64_t>(d);
  return values;
}

// The --plan flags as given: degrees, the MoE split, the stage balance and
// the KV cache type counted.
struct PlanOptions {
  int64_t tp = 1, pp = 1;
  std::string moe_sharding = "auto";
  std::string pp_balance = "decode";
  std::string kv_dtype = "auto";
};

// K and V of each rank's layers and KV heads, per token of context:
// what a sequence's length costs each rank (TP ranks hold distinct
// heads, PP ranks distinct layers, so the ranks' sum is the model's).
void PrintKvCachePerToken(const ModelConfig& c, const ShardPlan& shards,
                          const std::string& kv_dtype, DType dtype) {
  std::printf("\nKV cache per token of context (%s):\n%-5s %14s\n",
              kv_dtype == "auto" ? "auto: f16 on CPUs, bf16 on GPUs"
                                 : KvCacheDTypeName(dtype),
              "rank", "bytes/token");
  int64_t total = 0;
  for (size_t i = 0; i < shards.shards.size(); ++i) {
    const ShardSpec& s = shards.shards[i];
    if (c.is_mla()) {
      // One latent entry per layer, K only (V is its first values),
      // replicated on every TP rank of the stage.
      const int64_t b =
          KvBytesPerToken(s.n_layers(), 1, c.CachedHeadDim(), dtype) / 2;
      total += b;
      std::printf(
          "%-5zu %14lld   (%lld layers x one latent of %lld, on "
          "every TP rank)\n",
          i + 1, static_cast<long long>(b),
          static_cast<long long>(s.n_layers()),
          static_cast<long long>(c.CachedHeadDim()));
      continue;
    }
    // A hybrid's Gated DeltaNet layers cache nothing per token.
    const int64_t layers = c.AttentionLayers(s.layer_begin, s.layer_end);
    const int64_t b =
        KvBytesPerToken(layers, s.n_kv_heads(), c.head_dim, dtype);
    total += b;
    std::printf(
        "%-5zu %14lld   (%lld %slayers x %lld KV heads x %lld x K, V)\n", i + 1,
        static_cast<long long>(b), static_cast<long long>(layers),
        c.is_hybrid() ? "attention " : "",
        static_cast<long long>(s.n_kv_heads()),
        static_cast<long long>(c.head_dim));
  }
  std::printf(
      "all   %14lld   (%.1f KiB per token; %.1f GiB per 128K "
      "tokens)\n",
      static_cast<long long>(total), total / 1024.0,
      total * 131072.0 / (1 << 30));
  if (c.is_hybrid()) {
    // Fixed per sequence, whatever its length: each linear layer's
    // convolution inputs and value heads' states, in f32.
    const int64_t linear = c.n_layers - c.AttentionLayers(0, c.n_layers);
    const int64_t state = linear * c.SsmStateValues() * 4;
    std::printf(
        "\nrecurrent state per sequence, whatever its length: %lld bytes "
        "(%lld Gated DeltaNet layers x %lld f32 values; %.1f MiB), over "
        "the stages that hold those layers\n",
        static_cast<long long>(state), static_cast<long long>(linear),
        static_cast<long long>(c.SsmStateValues()), state / 1048576.0);
  }
}

// --plan: the shard plan and the KV cache each rank holds; the exit code.
int PrintPlan(const std::string& path, const WeightSource& w,
              const PlanOptions& o) {
  absl::StatusOr<MoeSharding> moe = ParseMoeSharding(o.moe_sharding);
  absl::StatusOr<PpBalance> balance = ParsePpBalance(o.pp_balance);
  absl::StatusOr<DType> dtype = o.kv_dtype == "auto"
                                    ? absl::StatusOr<DType>(DType::kF16)
                                    : ParseKvCacheDType(o.kv_dtype);
  if (!dtype.ok()) {
    dtype = absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
  }
  for (const absl::Status& s :
       {moe.status(), balance.status(), dtype.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "shardlm inspect: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  auto shards = PlanShards(
      w, static_cast<int>(std::clamp<int64_t>(o.tp, 0, 4096)),
      static_cast<int>(std::clamp<int64_t>(o.pp, 0, 4096)), *moe, *balance);
  if (!shards.ok()) {
    std::fprintf(stderr, "shardlm inspect: %s\n",
                 std::string(shards.status().message()).c_str());
    return 1;
  }
  std::printf(
      "shard plan for %s: tp %d x pp %d = %zu worker ranks "
      "(rank 0 is the coordinator)\n\n%s",
      path.c_str(), shards->tp, shards->pp, shards->shards.size(),
      shards->DebugString().c_str());
  PrintKvCachePerToken(w.config(), *shards, o.kv_dtype, *dtype);
  return 0;
}

// Every tensor (name, dtype, shape, bytes), then the file's mix of types.
void PrintTensors(const std::string& path, const WeightSource& w) {
  std::printf("model    %s\nformat   %s\n\n%s\n", path.c_str(),
              w.format().c_str(), w.config().DebugString().c_str());
  std::printf("%-36s %-6s %-16s %12s\n", "tensor", "dtype", "shape", "bytes");
  uint64_t total = 0;
  // The file's mix of types (llama.cpp's _M / _S files use several):
  // tensors, values and bytes of each, in the table's order.
  struct Mix {
    int tensors = 0;
    uint64_t values = 0, bytes = 0;
  };
  std::map<int, Mix> mix;
  for (const TensorInfo& t : w.tensors()) {
    const DType shown = ShownDType(t);
    std::printf("%-36s %-6s %-16s %12llu\n", t.name.c_str(), DTypeName(shown),
                ShapeString(t.shape).c_str(),
                static_cast<unsigned long long>(t.bytes));
    total += t.bytes;
    const uint64_t values = StoredValues(t);
    Mix& m = mix[static_cast<int>(shown)];
    ++m.tensors;
    m.values += values;
    m.bytes += t.bytes;
  }
  std::printf("%zu tensors, %s bytes (%.1f MiB)\n\n", w.tensors().size(),
              absl::StrFormat("%d", total).c_str(), total / 1048576.0);
  std::printf("%-6s %8s %12s %14s %10s\n", "dtype", "tensors", "MiB",
              "share of bytes", "bits/value");
  for (const auto& [t, m] : mix) {
    std::printf("%-6s %8d %12.1f %13.1f%% %10.2f\n",
                DTypeName(static_cast<DType>(t)), m.tensors,
                m.bytes / 1048576.0,
                100.0 * m.bytes / std::max<uint64_t>(total, 1),
                8.0 * m.bytes / std::max<uint64_t>(m.values, 1));
  }
  std::printf("\n");
}

// Parameters a token computes with: everything but the experts, and
// top-k of each layer's experts (merged or one tensor each).
void PrintExperts(const WeightSource& w) {
  const ModelConfig& c = w.config();
  uint64_t experts = 0, other = 0;
  for (const TensorInfo& t : w.tensors()) {
    const uint64_t values = StoredValues(t);
    const bool expert = t.name.find("_exps.") != std::string::npos ||
                        (t.name.find(".ffn_") != std::string::npos &&
                         std::count(t.name.begin(), t.name.end(), '.') == 4);
    (expert ? experts : other) += values;
  }
  const double active =
      other + static_cast<double>(experts) * c.n_experts_used / c.n_experts;
  std::printf(
      "experts  %lld per layer, top %lld%s, expert FFN %lld; parameters "
      "%.1fM in all, %.1fM active per token (%.1fM in experts)\n\n",
      static_cast<long long>(c.n_experts),
      static_cast<long long>(c.n_experts_used),
      c.expert_weights_norm ? " renormalized" : "",
      static_cast<long long>(c.expert_ffn_hidden), (experts + other) / 1e6,
      active / 1e6, experts / 1e6);
}

// The tokenizer and chat template, and what a CPU server started here
// would run.
void PrintTokenizerAndCpu(const std::string& path) {
  auto tokenizer = LoadTokenizer(path);
  if (tokenizer.ok()) {
    std::printf("tokenizer  %s\n", (*tokenizer)->Summary().c_str());
    const absl::StatusOr<ChatTemplate> chat =
        ChatTemplate::ForModel(**tokenizer);
    std::printf("chat       %s\n",
                chat.ok() ? chat->Describe().c_str()
                          : std::string(chat.status().message()).c_str());
  } else {
    std::printf("tokenizer  none: %s\n",
                std::string(tokenizer.status().message()).c_str());
  }
  // What a CPU server started here would run (generate and serve log
  // their choice too).
  std::string why;
  const int threads = DefaultCpuThreads(&why);
  std::printf("cpu        %s kernels; %d thread%s by default (%s)\n",
              CpuIsaName(ActiveCpuIsa()), threads, threads == 1 ? "" : "s",
              why.c_str());
  std::printf(
      "precision  exact by default (f32 activations); --precision fast: int8 "
      "activations and integer dot products for the block-quantized "
      "matrices (f32 ones stay f32)\n");
}

}  // namespace

int InspectCommand(int argc, char** argv) {
  bool plan = false;
  PlanOptions o;
  FlagSet flags(
      "usage: shardlm inspect PATH [--plan --tp T --pp P "
      "--moe-sharding auto|tp|ep --pp-balance decode|prefill "
      "--kv-cache-dtype D]\n"
      "Prints the model config, every tensor (name, dtype, shape, bytes) and\n"
      "a tokenizer summary of a GGUF file or a safetensors directory; with\n"
      "--plan, the shard plan instead: layers, heads, bytes per rank, and\n"
      "the KV cache bytes each rank holds per token of context.");
  flags.Add("plan", &plan, "print the TP x PP shard plan");
  flags.Add("tp", &o.tp, "tensor-parallel degree for --plan");
  flags.Add("pp", &o.pp, "pipeline-parallel degree for --plan");
  flags.Add("moe-sharding", &o.moe_sharding,
            "how --plan splits a mixture of experts: auto, tp or ep");
  flags.Add("pp-balance", &o.pp_balance, kPpBalanceHelp);
  flags.Add("kv-cache-dtype", &o.kv_dtype,
            "the KV cache element type --plan counts: auto (f16 on CPUs, "
            "bf16 on GPUs: 2 bytes either way), f32, f16, bf16 or int8");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm inspect: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "shardlm inspect: expected one model path\n\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  const std::string& path = flags.positional()[0];
  auto source = OpenWeights(path);
  if (!source.ok()) {
    std::fprintf(stderr, "shardlm inspect: %s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  const WeightSource& w = **source;
  if (plan) return PrintPlan(path, w, o);
  PrintTensors(path, w);
  if (w.config().is_moe()) PrintExperts(w);
  PrintTokenizerAndCpu(path);
  return 0;
}

}  // namespace shardlm
