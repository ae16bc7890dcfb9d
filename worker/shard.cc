#include "worker/shard.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/status.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"
#include "worker/model_runner.h"
#include "worker/sample_step.h"

namespace shardlm {

absl::StatusOr<StepOutput> ShardRunner::Step(const StepInput& step) {
  ASSIGN_OR_RETURN(Tensor logits, Forward(step));
  return SampleStep(step, std::move(logits));
}

const ShardRunner& Shard::initialized_runner() const {
  const ShardRunner* r = runner();
  SHARDLM_CHECK(r != nullptr, "shard ", spec_.DebugString(),
                ": asked for its runner's figures before InitializeCache");
  return *r;
}

absl::StatusOr<StepOutput> Shard::Step(const StepInput& step) {
  ShardRunner* r = runner();
  if (r == nullptr) {
    return absl::FailedPreconditionError("step before the KV cache was set up");
  }
  // Only the sampling shard would find a bad sampling part otherwise,
  // after its peers had entered collectives it never joins.
  RETURN_IF_ERROR(ValidateStepSampling(step));
  if (spec().samples()) return r->Step(step);
  RETURN_IF_ERROR(r->Forward(step).status());
  return StepOutput{};
}

namespace {

class CpuShard : public Shard {
 public:
  CpuShard(LlamaWeights weights, KvPoolConfig kv, int threads)
      : Shard(weights.spec),
        weights_(std::move(weights)),
        kv_(kv),
        threads_(threads) {}

  absl::StatusOr<KvBlockCounts> BlocksAvailable() const override {
    return KvBlockCounts{kv_.num_blocks, kv_.num_host_blocks};
  }

  absl::Status InitializeCache(KvBlockCounts blocks,
                               ShardComms comms) override {
    if (runner_ != nullptr) {
      return absl::FailedPreconditionError("the KV cache is set up already");
    }
    if (blocks.device < 1 || blocks.device > kv_.num_blocks ||
        blocks.host < 0 || blocks.host > kv_.num_host_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV blocks ", blocks.device, " + ", blocks.host,
                       " (host) asked of a shard whose budget holds ",
                       kv_.num_blocks, " + ", kv_.num_host_blocks));
    }
    KvPoolConfig kv = kv_;
    kv.num_blocks = blocks.device;
    kv.num_host_blocks = blocks.host;
    ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool, KvPool::Create(kv));
    runner_ = std::make_unique<ModelRunner>(std::move(weights_),
                                            std::move(pool), comms);
    // Steps may run on another thread than this one (OpenMP's setting is
    // per thread).
    runner_->set_cpu_threads(threads_);
    blocks_ = blocks;
    return absl::OkStatus();
  }

 private:
  ShardRunner* runner() override { return runner_.get(); }
  const ShardRunner* runner() const override { return runner_.get(); }

  LlamaWeights weights_;   // Moved into the runner by InitializeCache.
  const KvPoolConfig kv_;  // The blocks the budget holds.
  const int threads_;
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Shard>> LoadCpuShard(const WeightSource& source,
                                                    const ShardRequest& r) {
  RETURN_IF_ERROR(r.kv.Validate());
  ASSIGN_OR_RETURN(LlamaWeights weights,
                   LoadLlamaWeights(source, r.spec, LogLoadProgress(r.name)));
  ASSIGN_OR_RETURN(
      KvPoolConfig kv,
      PoolConfigForShard(weights.config, r.spec, r.kv.block_size,
                         r.kv.DTypeOnCpu(), r.kv.kv_cache_bytes,
                         r.kv.cpu_offload_bytes, r.limits.max_seqs,
                         r.kv.prefix_caching ? r.limits.max_seqs : 0));
  kv.checksum_host_tier = r.kv.checksum;
  return std::unique_ptr<Shard>(
      std::make_unique<CpuShard>(std::move(weights), kv, r.threads));
}

}  // namespace shardlm
