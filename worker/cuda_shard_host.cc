// NewCudaShardHost (worker/cuda_shard_host.h): a worker's shard on one GPU
// with NCCL communicators. Built only with CUDA and NCCL.
#include "worker/cuda_shard_host.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda_backend.h"
#include "collectives/nccl_communicator.h"
#include "core/log.h"
#include "core/status.h"
#include "model/shard_plan.h"
#include "worker/activation_memory.h"
#include "worker/cuda_model_runner.h"
#include "worker/cuda_shard.h"
#include "worker/llama_weights.h"

namespace shardlm {
namespace {

class CudaShardHost : public ShardHost {
 public:
  CudaShardHost(const WeightSource* source, CudaShardHostOptions options)
      : source_(source), o_(std::move(options)) {}

  absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) override {
    // The coordinator refuses --cp with CUDA workers; a worker told
    // otherwise must not hold all of the KV it was given a share of.
    absl::StatusOr<KvPoolConfig> kv =
        a.cp > 1 ? absl::UnimplementedError(absl::StrCat(
                       "assigned cp ", a.cp_rank, " of ", a.cp,
                       ": context parallelism is built for CPU workers only"))
                 : LoadShard(a);
    if (!kv.ok()) {
      // The communicators run on the runner's stream: they go first.
      pp_.reset();
      tp_.reset();
      shard_.reset();
      return absl::Status(kv.status().code(),
                          absl::StrCat("worker rank ", o_.rank, " on cuda:",
                                       o_.device, ": ", kv.status().message()));
    }
    return kv;
  }

  // The last stage's TP rank 0 samples (on the device when it can); the
  // others take part in the step's collectives and return nothing.
  absl::StatusOr<StepOutput> Step(const StepInput& step) override {
    if (!loaded_) {
      return absl::FailedPreconditionError("step before the shard was loaded");
    }
    return shard_->Step(step);
  }

  int64_t weight_bytes() const override {
    return loaded_ ? shard_->weight_bytes() : 0;
  }
  std::optional<RunnerStats> stats() const override {
    if (!loaded_) return std::nullopt;
    return shard_->stats();
  }
  bool loaded() const override { return loaded_.load(); }

 private:
  // The NCCL communicator of one group this shard belongs to: its rank 0
  // makes the id, the store relays it. Its collectives run on `stream`
  // (the runner's compute stream).
  absl::StatusOr<std::unique_ptr<Communicator>> Join(const std::string& key,
                                                     const std::string& name,
                                                     int rank, int size,
                                                     void* stream) {
    ASSIGN_OR_RETURN(std::string id,
                     AgreeOnGroupId(*o_.store, key, name, rank, NewNcclUniqueId,
                                    o_.timeout));
    ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                     NcclCommunicator::Create(
                         {.unique_id = std::move(id),
                          .rank = rank,
                          .size = size,
                          .device = o_.device,
                          .name = name,
                          .options = {o_.timeout},
                          .stream = stream,
                          // The runner synchronises once per step (FinishStep).
                          .asynchronous = NcclAsyncRequested()}));
    return std::unique_ptr<Communicator>(std::move(comm));
  }

  absl::StatusOr<KvPoolConfig> LoadShard(const WorkerAssignment& a) {
    if (shard_ != nullptr) {
      return absl::FailedPreconditionError("the shard is loaded already");
    }
    if (a.kv.dtype != DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA kernels keep the KV cache in bf16; the "
                       "coordinator asked for ",
                       KvCacheDTypeName(a.kv.DTypeOnCpu()),
                       " (--kv-cache-dtype bf16 or auto)"));
    }
    if ((a.tp > 1 || a.pp > 1) && o_.store == nullptr) {
      return absl::InternalError("no rendezvous store for the NCCL ids");
    }
    ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(*source_, a.tp, a.pp,
                                                a.moe_sharding, a.pp_balance));
    const ShardSpec& spec = plan.at(a.pp_rank, a.tp_rank);

    // The shard's runner first (its stream carries the collectives), then
    // the groups, every rank in the same order (its TP group, then its PP
    // chain) so that inits pair up: a missing peer fails here, by the
    // timeout, before minutes of loading. Then the weights and step
    // buffers (CudaShard::Load), and only then is the rest of the GPU's
    // memory measured for the KV pool.
    const ModelConfig& config = source_->config();
    ASSIGN_OR_RETURN(
        shard_, CudaShard::Create(
                    config,
                    {.spec = spec,
                     .kv = a.kv,
                     .limits = a.limits,
                     .name = absl::StrCat("worker rank ", o_.rank, " (pp ",
                                          a.pp_rank, ", tp ", a.tp_rank, ")")},
                    {.device = o_.device,
                     .comms_on_stream = true,
                     .cuda_weights = o_.cuda_weights}));
    void* stream = shard_->stream();
    for (const ShardGroup& g : ShardGroups(
             {.tp_rank = a.tp_rank, .pp_rank = a.pp_rank}, a.tp, 1, a.pp)) {
      if (g.size() == 1) continue;
      ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                       Join(NcclGroupKey(a.rendezvous_prefix, g.name), g.name,
                            g.rank, g.size(), stream));
      (g.kind == GroupKind::kTp ? tp_ : pp_) = std::move(c);
    }
    RETURN_IF_ERROR(shard_->Load(*source_));
    // NCCL connects peers and allocates its buffers at a group's first
    // collective: have them now, so that the KV sizing below sees them.
    RETURN_IF_ERROR(
        shard_->WarmUpCollectives({.tp = tp_.get(), .pp = pp_.get()}));
    std::string why;
    ASSIGN_OR_RETURN(const KvBlockCounts blocks, shard_->PlanBlocks(&why));
    RETURN_IF_ERROR(
        shard_->InitializeCache(blocks, {.tp = tp_.get(), .pp = pp_.get()}));
    // From now on a peer that does not arrive is dead or stuck: the
    // collectives wait as long as the coordinator waits for a step, not as
    // long as the cluster may take to form.
    if (a.step_timeout > absl::ZeroDuration()) {
      for (Communicator* c : {tp_.get(), pp_.get()}) {
        if (c != nullptr) {
          static_cast<NcclCommunicator*>(c)->set_timeout(a.step_timeout);
        }
      }
    }
    const int32_t tokens = std::max<int32_t>(a.limits.max_batched_tokens, 1);
    const int32_t seqs = std::max<int32_t>(a.limits.max_seqs, 1);
    Log("worker rank %d (pp %d, tp %d) on cuda:%d: weights "
        "%.2f GiB (%s), step buffers %.2f GiB for %d tokens x %d "
        "sequences; %s; %lld tokens of KV",
        o_.rank, a.pp_rank, a.tp_rank, o_.device,
        static_cast<double>(shard_->resident_weight_bytes()) / (1 << 30),
        CudaWeightsName(o_.cuda_weights),
        static_cast<double>(
            GpuActivationBytes(ActivationDimsOf(config, spec), tokens, seqs)) /
            (1 << 30),
        tokens, seqs, why.c_str(),
        static_cast<long long>(blocks.device * a.kv.block_size));
    loaded_ = true;
    return shard_->kv_config();
  }

  const WeightSource* source_;
  const CudaShardHostOptions o_;
  // Destroyed in reverse: the communicators (which run on the shard's
  // stream) before the shard.
  std::unique_ptr<CudaShard> shard_;
  std::unique_ptr<Communicator> tp_, pp_;  // Null where the group is 1.
  std::atomic<bool> loaded_{false};
};

}  // namespace

bool GpuWorkersBuilt() { return true; }

absl::StatusOr<std::unique_ptr<ShardHost>> NewCudaShardHost(
    const WeightSource* source, const CudaShardHostOptions& options) {
  ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", options.rank, ": CUDA device ",
                     options.device, " of ", devices, " visible"));
  }
  return std::unique_ptr<ShardHost>(
      std::make_unique<CudaShardHost>(source, options));
}

absl::StatusOr<std::string> GpuUuid(int device) {
  return CudaDeviceUuid(device);
}

}  // namespace shardlm
