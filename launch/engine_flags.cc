#include "launch/engine_flags.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "executor/local_engine.h"
#include "kernels/threading.h"
#include "model/weight_source.h"
#include "step/kv_cache.h"

namespace shardlm {

void LocalEngineFlags::Register(FlagSet& flags) {
  flags.Add("model", &model,
            "GGUF file, or directory with config.json + *.safetensors + "
            "tokenizer.json");
  flags.Add("threads", &threads,
            "CPU threads; 0: the CPUs this process may use (its affinity "
            "mask, capped by its cgroup's CPU quota)");
  kv.Register(flags, "per rank");
  limits.Register(flags);
  speculation.Register(flags);
  flags.Add(
      "precision", &precision,
      "precision of the CPU matrix products: exact (f32 activations, within "
      "1e-3 of the reference) or fast (int8 activations and integer dot "
      "products, as llama.cpp; its distance from exact is in "
      "docs/precision.md). CPU only");
  flags.Add("tp", &tp, "tensor-parallel shards (run on threads here)");
  flags.Add("pp", &pp, "pipeline stages (run on threads here)");
  flags.Add("cp", &cp,
            "context-parallel ranks per stage (run on threads here; CPU "
            "only): a sequence's KV blocks are spread over them, so the "
            "longest sequence grows cp-fold at the same --kv-cache-bytes "
            "(and --cpu-offload-bytes) per rank; attention is split, and a "
            "step of at least cp tokens is split by tokens for the "
            "projections and MLP (a lone sequence's decode runs whole on "
            "every cp rank)");
  flags.Add("pp-balance", &pp_balance, kPpBalanceHelp);
  flags.Add("moe-sharding", &moe_sharding,
            "how a TP group splits a mixture of experts: tp (every expert's "
            "columns), ep (whole experts per rank) or auto (ep when tp "
            "divides the expert count)");
  flags.Add("device", &device,
            "auto, cpu, cuda or cuda:N; auto takes a GPU when one is usable");
  flags.Add("allow-shared-gpu", &allow_shared_gpu,
            "let --tp x --pp ranks share GPUs (tests only: slow, staged "
            "through the host)");
  flags.Add("cuda-weights", &cuda_weights, kCudaWeightsHelp);
}

std::string LocalEngineFlags::Problem() const {
  if (tp < 1 || tp > 64 || pp < 1 || pp > 64) {
    return "--tp and --pp must be in [1, 64]";
  }
  if (cp < 1 || cp > 64) {
    return absl::StrCat("--cp must be in [1, 64], got ", cp);
  }
  if (threads < 0 || threads > 4096) return "--threads must be in [0, 4096]";
  if (absl::StatusOr<MoeSharding> m = ParseMoeSharding(moe_sharding); !m.ok()) {
    return std::string(m.status().message());
  }
  if (absl::StatusOr<PpBalance> b = ParsePpBalance(pp_balance); !b.ok()) {
    return std::string(b.status().message());
  }
  if (std::string p = kv.Problem(); !p.empty()) return p;
  if (std::string p = limits.Problem(); !p.empty()) return p;
  if (std::string p = speculation.Problem(); !p.empty()) return p;
  if (absl::StatusOr<Precision> p = ParsePrecision(precision); !p.ok()) {
    return absl::StrCat("--precision: ", p.status().message());
  }
  if (absl::StatusOr<DeviceRequest> r = ParseDeviceFlag(device); !r.ok()) {
    return std::string(r.status().message());
  }
  if (absl::StatusOr<CudaWeights> w = ParseCudaWeights(cuda_weights); !w.ok()) {
    return std::string(w.status().message());
  }
  return "";
}

absl::StatusOr<DeviceChoice> LocalEngineFlags::ResolveDevice(
    const CudaAvailability& cuda) const {
  ASSIGN_OR_RETURN(DeviceRequest request, ParseDeviceFlag(device));
  std::string not_on_gpu;
  if (cp > 1) {
    not_on_gpu = "--cp > 1";
  } else if (kv.kv_cache_dtype != "auto" && kv.kv_cache_dtype != "bf16") {
    not_on_gpu = absl::StrCat("--kv-cache-dtype ", kv.kv_cache_dtype);
  } else if (precision == "fast") {
    not_on_gpu = "--precision fast";
  } else if (tp * pp > cuda.devices && !allow_shared_gpu) {
    not_on_gpu = absl::StrCat("--tp x --pp = ", tp * pp, " ranks on ",
                              cuda.devices, " GPU(s)");
  }
  return ChooseDevice(request, cuda, not_on_gpu);
}

EngineOptions LocalEngineFlags::ToOptions(const DeviceChoice& d) const {
  return {.kv = kv.ToOptions(),
          .limits = limits.ToLimits(),
          .threads = static_cast<int>(threads),
          .tp = static_cast<int>(tp),
          .pp = static_cast<int>(pp),
          .cp = static_cast<int>(cp),
          .moe_sharding =
              ParseMoeSharding(moe_sharding).value_or(MoeSharding::kAuto),
          .pp_balance = ParsePpBalance(pp_balance).value_or(PpBalance::kDecode),
          .device = d.kind,
          .device_ordinal = d.ordinal,
          .allow_shared_gpu = allow_shared_gpu,
          .cuda_weights =
              ParseCudaWeights(cuda_weights).value_or(CudaWeights::kBf16),
          .speculation = speculation.ToOptions(),
          .batch_invariant = speculation.batch_invariant,
          .precision = ParsePrecision(precision).value_or(Precision::kExact)};
}

namespace {

// ", and N recurrent-state slots of X KiB each (...)" for a hybrid model,
// else "".
std::string StateSlotsNote(const ModelConfig& c, const BlockManager& b) {
  const int32_t slots = b.state_slots() + b.state_snapshots();
  if (!c.is_hybrid() || slots == 0) return "";
  const int64_t linear = c.n_layers - c.AttentionLayers(0, c.n_layers);
  const double slot_kib = 4.0 * linear * c.SsmStateValues() / 1024.0;
  return absl::StrFormat(
      ", and %d recurrent-state slots (--max-seqs%s) of %.1f KiB each (%.1f "
      "MiB in all, taken from the ranks' KV budgets)",
      slots, b.state_snapshots() > 0 ? ", as many prefix snapshots" : "",
      slot_kib, slots * slot_kib / 1024.0);
}

}  // namespace

absl::StatusOr<LocalModel> LoadLocalModel(const LocalEngineFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> source,
                   OpenWeights(flags.model));
  LocalModel m;
  ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizer(flags.model));
  ASSIGN_OR_RETURN(DeviceChoice device, flags.ResolveDevice(QueryCuda()));
  std::fprintf(stderr, "shardlm: %s\n", device.reason.c_str());
  if (device.kind == DeviceKind::kCpu) {
    std::string why = "--threads";
    const int threads = flags.threads > 0 ? static_cast<int>(flags.threads)
                                          : DefaultCpuThreads(&why);
    std::fprintf(stderr, "shardlm: %d CPU thread%s (%s)%s; precision %s\n",
                 threads, threads == 1 ? "" : "s", why.c_str(),
                 flags.tp * flags.pp * flags.cp > 1
                     ? ", shared among the shards on threads"
                     : "",
                 flags.precision == "fast"
                     ? "fast (int8 activations, integer dot products)"
                     : "exact (f32 activations)");
  }
  ASSIGN_OR_RETURN(m.engine,
                   CreateLocalEngine(*source, flags.ToOptions(device)));
  const BlockManager& blocks = m.engine->blocks();
  const DType kv = m.engine->executor().kv_cache_dtype();
  std::fprintf(
      stderr,
      "shardlm: KV cache: %d device + %d host blocks of %d tokens, "
      "%s, %.1f KiB per token%s%s\n",
      blocks.num_blocks(), blocks.num_host_blocks(), blocks.block_size(),
      KvCacheDTypeName(kv), KvBytesPerToken(m.engine->config(), kv) / 1024.0,
      StateSlotsNote(m.engine->config(), blocks).c_str(),
      flags.cp > 1
          ? absl::StrCat(
                " (over ", flags.cp, " CP ranks, ",
                blocks.num_blocks() / flags.cp,
                blocks.num_host_blocks() > 0
                    ? absl::StrCat(" + ", blocks.num_host_blocks() / flags.cp,
                                   " host")
                    : "",
                " each)")
                .c_str()
          : "");
  m.name = source->config().name;
  if (m.name.empty()) {
    m.name = std::filesystem::path(flags.model).filename().string();
  }
  return m;
}

}  // namespace shardlm
