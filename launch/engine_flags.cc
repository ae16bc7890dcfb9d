#include "launch/engine_flags.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/weight_source.h"
#include "step/kv_cache.h"
#include "worker/kv_pool.h"

namespace shardlm {

void LocalEngineFlags::Register(FlagSet& flags) {
  flags.Add("model", &model,
            "GGUF file, or directory with config.json + *.safetensors + "
            "tokenizer.json");
  flags.Add("threads", &threads, "CPU threads, 0 = all cores");
  flags.Add("kv-cache-bytes", &kv_cache_bytes,
            "KV cache budget; 0 = one full context on the CPU, the memory "
            "--gpu-memory-utilization leaves on a GPU");
  flags.Add("cpu-offload-bytes", &cpu_offload_bytes,
            "host KV tier: preempted and overlong sequences swap there, "
            "evicted prefix blocks stay cached there");
  flags.Add("kv-cache-dtype", &kv_cache_dtype,
            "KV cache element type: auto (f16 on CPUs, bf16 on GPUs), f32, "
            "f16, bf16 or int8 (CPUs); f16 and bf16 hold twice the tokens "
            "of f32, int8 3.8 times");
  flags.Add("prefix-caching", &prefix_caching,
            "reuse the KV of full blocks shared with earlier requests");
  flags.Add("max-batched-tokens", &max_batched_tokens,
            "tokens per step; longer prompts prefill in chunks");
  flags.Add("tp", &tp, "tensor-parallel shards (run on threads here)");
  flags.Add("pp", &pp, "pipeline stages (run on threads here)");
  flags.Add("moe-sharding", &moe_sharding,
            "how a TP group splits a mixture of experts: tp (every expert's "
            "columns), ep (whole experts per rank) or auto (ep when tp "
            "divides the expert count)");
  flags.Add("device", &device,
            "auto, cpu, cuda or cuda:N; auto takes a GPU when one is usable");
  flags.Add("gpu-memory-utilization", &gpu_memory_utilization,
            "on a GPU, the fraction of its memory this process may use; "
            "what weights and activations leave becomes KV cache (unless "
            "--kv-cache-bytes is set)");
  flags.Add("allow-shared-gpu", &allow_shared_gpu,
            "let --tp x --pp ranks share GPUs (tests only: slow, staged "
            "through the host)");
}

std::string LocalEngineFlags::Problem() const {
  if (max_batched_tokens < 1 || max_batched_tokens > (1 << 20)) {
    return "--max-batched-tokens must be in [1, 1048576]";
  }
  if (tp < 1 || tp > 64 || pp < 1 || pp > 64) {
    return "--tp and --pp must be in [1, 64]";
  }
  if (threads < 0 || threads > 4096) return "--threads must be in [0, 4096]";
  if (absl::StatusOr<MoeSharding> m = ParseMoeSharding(moe_sharding); !m.ok()) {
    return std::string(m.status().message());
  }
  if (kv_cache_bytes < 0) return "--kv-cache-bytes must be >= 0";
  if (cpu_offload_bytes < 0) return "--cpu-offload-bytes must be >= 0";
  if (kv_cache_dtype != "auto") {
    if (absl::StatusOr<DType> t = ParseKvCacheDType(kv_cache_dtype); !t.ok()) {
      return absl::StrCat("--kv-cache-dtype: ", t.status().message(),
                          " or auto");
    }
  }
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return "--gpu-memory-utilization must be in (0, 1]";
  }
  if (absl::StatusOr<DeviceRequest> r = ParseDeviceFlag(device); !r.ok()) {
    return std::string(r.status().message());
  }
  return "";
}

absl::StatusOr<DeviceChoice> LocalEngineFlags::ResolveDevice(
    const CudaAvailability& cuda) const {
  ASSIGN_OR_RETURN(DeviceRequest request, ParseDeviceFlag(device));
  std::string not_on_gpu;
  if (kv_cache_dtype != "auto" && kv_cache_dtype != "bf16") {
    not_on_gpu = absl::StrCat("--kv-cache-dtype ", kv_cache_dtype);
  } else if (tp * pp > cuda.devices && !allow_shared_gpu) {
    not_on_gpu = absl::StrCat("--tp x --pp = ", tp * pp, " ranks on ",
                              cuda.devices, " GPU(s)");
  }
  return ChooseDevice(request, cuda, not_on_gpu);
}

EngineOptions LocalEngineFlags::ToOptions(const DeviceChoice& d) const {
  std::optional<DType> kv_dtype;
  if (kv_cache_dtype != "auto") kv_dtype = *ParseKvCacheDType(kv_cache_dtype);
  return {.kv_cache_bytes = kv_cache_bytes,
          .cpu_offload_bytes = cpu_offload_bytes,
          .kv_cache_dtype = kv_dtype,
          .prefix_caching = prefix_caching,
          .max_batched_tokens = static_cast<int32_t>(max_batched_tokens),
          .threads = static_cast<int>(threads),
          .tp = static_cast<int>(tp),
          .pp = static_cast<int>(pp),
          .moe_sharding =
              ParseMoeSharding(moe_sharding).value_or(MoeSharding::kAuto),
          .device = d.kind,
          .device_ordinal = d.ordinal,
          .gpu_memory_utilization = gpu_memory_utilization,
          .allow_shared_gpu = allow_shared_gpu};
}

absl::StatusOr<LocalModel> LoadLocalModel(const LocalEngineFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> source,
                   OpenWeights(flags.model));
  LocalModel m;
  ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizer(flags.model));
  ASSIGN_OR_RETURN(DeviceChoice device, flags.ResolveDevice(QueryCuda()));
  std::fprintf(stderr, "shardlm: %s\n", device.reason.c_str());
  ASSIGN_OR_RETURN(m.engine, Engine::Create(*source, flags.ToOptions(device)));
  const BlockManager& blocks = m.engine->blocks();
  const DType kv = m.engine->executor().kv_cache_dtype();
  std::fprintf(stderr,
               "shardlm: KV cache: %d device + %d host blocks of %d tokens, "
               "%s, %.1f KiB per token\n",
               blocks.num_blocks(), blocks.num_host_blocks(),
               blocks.block_size(), KvCacheDTypeName(kv),
               KvBytesPerToken(m.engine->config(), kv) / 1024.0);
  m.name = source->config().name;
  if (m.name.empty()) {
    m.name = std::filesystem::path(flags.model).filename().string();
  }
  return m;
}

}  // namespace shardlm
