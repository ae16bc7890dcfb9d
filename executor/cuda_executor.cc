// StepExecutors on GPUs (built only with CUDA; cuda_executor_stub.cc in
// binaries without it): one CudaModelRunner, or tp * pp of them on threads.
#include "executor/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backend/cuda_backend.h"
#include "backend/device.h"
#include "collectives/staged_communicator.h"
#ifdef SHARDLM_WITH_NCCL
#include "collectives/nccl_communicator.h"
#endif
#include "core/log.h"
#include "core/status.h"
#include "executor/in_process_executor.h"
#include "model/shard_plan.h"
#include "worker/cuda_model_runner.h"
#include "worker/cuda_shard.h"

namespace shardlm {

CudaAvailability QueryCuda() {
  CudaAvailability a{.built_with_cuda = true};
  absl::StatusOr<int> n = CudaDeviceCount();
  if (n.ok()) {
    a.devices = *n;
  } else {
    a.why_none = std::string(n.status().message());
  }
  return a;
}

namespace {

// One shard on one GPU; sampling on the device.
class CudaExecutor : public StepExecutor {
 public:
  const char* backend() const override { return "cuda"; }
  explicit CudaExecutor(std::unique_ptr<CudaShard> shard)
      : shard_(std::move(shard)), device_(shard_->device()) {}
  const ModelConfig& config() const override { return shard_->config(); }
  int64_t num_kv_blocks() const override { return shard_->blocks().device; }
  int64_t num_host_kv_blocks() const override { return shard_->blocks().host; }
  // bf16 bytes on the device (not the f32 bytes of the CPU runner).
  int64_t weight_bytes() const override { return shard_->weight_bytes(); }
  DType kv_cache_dtype() const override { return shard_->kv_dtype(); }
  std::vector<RunnerStats> RankStats() const override {
    return {shard_->stats()};
  }
  // The step figures, and the GPU's memory in use and in all (any thread:
  // cudaMemGetInfo asks the calling thread's current device).
  std::vector<RankReport> RankReports() const override {
    RankReport r{
        .rank = 1,
        .stats = shard_->stats(),
        .weight_bytes = shard_->weight_bytes(),
        .kv_bytes = shard_->blocks().device * shard_->kv_block_bytes(),
        .host_kv_bytes = shard_->blocks().host * shard_->kv_block_bytes()};
    size_t free = 0, total = 0;
    if (cudaSetDevice(device_) == cudaSuccess &&
        cudaMemGetInfo(&free, &total) == cudaSuccess) {
      r.gpu_memory_used_bytes = static_cast<int64_t>(total - free);
      r.gpu_memory_total_bytes = static_cast<int64_t>(total);
    }
    return {r};
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    return shard_->Step(step);
  }

 private:
  std::unique_ptr<CudaShard> shard_;
  int device_;
};

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

#ifdef SHARDLM_WITH_NCCL
bool NcclBuilt() { return true; }

// The ranks' NCCL groups (ids made here, one per group), each member on its
// rank's device and runner stream, then one collective of each kind on
// every rank at once (NCCL's buffers exist before the KV sizing).
absl::StatusOr<InProcessComms> MakeNcclComms(
    int tp, int pp, const std::vector<std::unique_ptr<CudaShard>>& shards) {
  std::map<std::string, std::string> ids;  // One per group (ShardGroups).
  for (int r = 0; r < tp * pp; ++r) {
    for (const ShardGroup& g : ShardGroups(PlaceOfRank(r, tp, 1), tp, 1, pp)) {
      if (g.size() > 1 && !ids.contains(g.name)) {
        ASSIGN_OR_RETURN(ids[g.name], NewNcclUniqueId());
      }
    }
  }
  ASSIGN_OR_RETURN(
      InProcessComms comms,
      MakeGroupComms(
          tp, pp,
          [&](const GroupMember& m)
              -> absl::StatusOr<std::unique_ptr<Communicator>> {
            CudaShard& shard = *shards[m.cluster_rank];
            ASSIGN_OR_RETURN(
                std::unique_ptr<NcclCommunicator> c,
                NcclCommunicator::Create(
                    {.unique_id = ids.at(m.group),
                     .rank = m.rank,
                     .size = m.size,
                     .device = shard.device(),
                     .name = m.group,
                     .options = {.timeout = absl::Seconds(120)},
                     .stream = shard.stream(),
                     // The runner synchronises once per step (FinishStep).
                     .asynchronous = NcclAsyncRequested()}));
            return std::unique_ptr<Communicator>(std::move(c));
          }));
  std::vector<absl::Status> warm(shards.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < shards.size(); ++r) {
    threads.emplace_back(
        [&, r] { warm[r] = shards[r]->WarmUpCollectives(comms.per_rank[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < warm.size(); ++r) {
    if (!warm[r].ok()) {
      return absl::Status(
          warm[r].code(),
          absl::StrCat("rank ", r, " warming up NCCL: ", warm[r].message()));
    }
  }
  return comms;
}
#else
bool NcclBuilt() { return false; }

absl::StatusOr<InProcessComms> MakeNcclComms(
    int, int, const std::vector<std::unique_ptr<CudaShard>>&) {
  return absl::FailedPreconditionError("this shardlm was built without NCCL");
}
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& o) {
  RETURN_IF_ERROR(o.kv.Validate());
  RETURN_IF_ERROR(o.limits.Validate());
  if (o.tp < 1 || o.pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA executor: tp (", o.tp, ") and pp (", o.pp, ") must be >= 1"));
  }
  const CudaAvailability cuda = QueryCuda();
  if (cuda.devices == 0) return absl::FailedPreconditionError(cuda.why_none);
  const int ranks = o.tp * o.pp;
  std::vector<int> devices;
  if (ranks == 1) {
    if (o.device < 0 || o.device >= cuda.devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", o.device, " of ", cuda.devices));
    }
    devices = {o.device};
  } else {
    ASSIGN_OR_RETURN(devices,
                     AssignGpus(ranks, cuda.devices, o.allow_shared_gpu));
  }
  ASSIGN_OR_RETURN(
      ShardPlan plan,
      PlanShards(source, o.tp, o.pp, MoeSharding::kAuto, o.pp_balance));

  // Ranks on distinct GPUs talk over NCCL, on their runners' streams;
  // ranks that share a GPU (--allow-shared-gpu; NCCL refuses two ranks of
  // a group on one device) through in-process groups that stage device
  // tensors through the host.
  const bool shared =
      std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  const bool nccl = ranks > 1 && !shared && NcclBuilt();

  // Each shard's weights go up one at a time (the f32 host copy is dropped
  // once uploaded), then every runner reserves its activations, and only
  // then is the rest of each GPU's memory given to the KV caches.
  std::vector<std::unique_ptr<CudaShard>> shards;
  std::vector<GpuRankKv> ranks_kv;
  int64_t weight_bytes = 0, block_bytes = 0;
  for (size_t r = 0; r < plan.shards.size(); ++r) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<CudaShard> shard,
        LoadCudaShard(source,
                      {.spec = plan.shards[r],
                       .kv = o.kv,
                       .limits = o.limits,
                       .name = absl::StrCat("shard pp ", plan.shards[r].pp_rank,
                                            " tp ", plan.shards[r].tp_rank)},
                      {.device = devices[r],
                       .comms_on_stream = nccl,
                       .cuda_weights = o.cuda_weights}));
    weight_bytes += shard->resident_weight_bytes();
    block_bytes = std::max(block_bytes, shard->kv_block_bytes());
    ranks_kv.push_back(
        {.device = devices[r], .block_bytes = shard->kv_block_bytes()});
    shards.push_back(std::move(shard));
  }
  InProcessComms comms;
  if (nccl) {
    ASSIGN_OR_RETURN(comms, MakeNcclComms(o.tp, o.pp, shards));
  } else if (ranks > 1) {
    comms = MakeInProcessComms(o.tp, o.pp, StageThroughHost);
  }
  // Every rank gets the same blocks: the fewest any GPU holds for all of
  // the ranks on it (ranks may share one, so not each shard's own figure).
  std::string why;
  ASSIGN_OR_RETURN(const int64_t blocks,
                   SizeGpuKv(ranks_kv, o.kv.kv_cache_bytes,
                             o.kv.gpu_memory_utilization, o.kv.block_size,
                             /*placeholder_blocks=*/1, &why));
  // The host tier: what --cpu-offload-bytes holds for every rank.
  const int64_t host_blocks = HostTierBlocks(
      o.kv.cpu_offload_bytes, block_bytes, o.kv.block_size, blocks);
  if (o.kv.cpu_offload_bytes > 0) {
    absl::StrAppend(&why, "; ", host_blocks,
                    " host-tier blocks (pinned) from --cpu-offload-bytes");
  }
  for (size_t r = 0; r < shards.size(); ++r) {
    RETURN_IF_ERROR(shards[r]->InitializeCache(
        {.device = blocks, .host = host_blocks},
        ranks > 1 ? comms.per_rank[r] : ShardComms{}));
  }
  Log("CUDA, %d rank(s) (tp %d x pp %d) on device(s) %s%s: "
      "weights %s (%s), activations for %d tokens x %d "
      "sequences; %s; %lld tokens of KV",
      ranks, o.tp, o.pp, absl::StrJoin(devices, ",").c_str(),
      ranks == 1 ? ""
      : nccl     ? ", NCCL between them"
                 : ", collectives staged through the host",
      Gib(weight_bytes).c_str(), CudaWeightsName(o.cuda_weights),
      o.limits.max_batched_tokens, o.limits.max_seqs, why.c_str(),
      static_cast<long long>(blocks * o.kv.block_size));
  if (ranks == 1) {
    return std::unique_ptr<StepExecutor>(
        std::make_unique<CudaExecutor>(std::move(shards[0])));
  }
  std::vector<std::unique_ptr<Shard>> as_shards;
  for (auto& shard : shards) as_shards.push_back(std::move(shard));
  return NewThreadedExecutor(std::move(comms.owned), std::move(as_shards),
                             /*threads_per_rank=*/1);
}

}  // namespace shardlm
