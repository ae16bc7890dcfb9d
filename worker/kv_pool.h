// The physical KV cache of one worker: fixed-size blocks, per layer.
//
// Block ids are decided elsewhere (the coordinator's block manager); every
// worker mirrors the same ids in its own pool, so a block id means the
// same logical slot on every rank.
#ifndef SHARDLM_WORKER_KV_POOL_H_
#define SHARDLM_WORKER_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "model/shard_plan.h"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm {

// Block ids [0, num_blocks) are the device tier, [num_blocks, num_blocks +
// num_host_blocks) the host (CPU offload) tier; a block table may mix them
// and attention reads either.
struct KvPoolConfig {
  // Layers held by this worker that attend (a hybrid model's linear
  // layers keep a state per sequence instead: below).
  int64_t n_layers = 0;
  int64_t kv_heads = 0;  // KV heads held by this worker.
  int64_t head_dim = 0;
  int64_t block_size = 16;      // Tokens per block.
  int64_t num_blocks = 0;       // Device tier.
  int64_t num_host_blocks = 0;  // Host tier.
  // Element type of the cache (f32, f16, bf16 or I8: IsCpuKvDType).
  DType dtype = kDefaultCpuKvDType;
  // Multi-head latent attention (ModelConfig::is_mla): one entry of
  // head_dim values per token and layer (kv_heads 1), held in k
  // (LatentCacheShape); v is empty.
  bool latent = false;
  // Every block copied into the host tier keeps a CRC-32C of its bytes,
  // checked when it is copied out (--kv-checksum).
  bool checksum_host_tier = false;
  // Hybrid models (ModelConfig::is_hybrid): the Gated DeltaNet layers held
  // and, per state slot (one per running sequence: BlockManager's
  // state_slots, sized by max_seqs), each one's f32 state on this rank:
  // the convolution's last conv_rows inputs of its conv_channels (the
  // replicated q/k channels, then its value heads' channels) and
  // state_heads k_dim x v_dim matrices (its value heads).
  int64_t linear_layers = 0;
  int64_t state_slots = 0;
  // Slots [state_slots, state_slots + host_state_slots): the host tier's
  // (one per device slot when there is a host tier), where a preempted
  // sequence's state waits (KvPool::CopyStates).
  int64_t host_state_slots = 0;
  // Then [.., + snapshot_slots): states kept at the end of cached prefix
  // blocks (BlockManager::SnapshotState), from the device budget.
  int64_t snapshot_slots = 0;
  int64_t total_state_slots() const {
    return state_slots + host_state_slots + snapshot_slots;
  }
  int64_t conv_rows = 0, conv_channels = 0;
  int64_t state_heads = 0, k_dim = 0, v_dim = 0;

  int64_t total_blocks() const { return num_blocks + num_host_blocks; }

  // Bytes of one block across all layers (K and V, or the latent).
  int64_t BytesPerBlock() const;
  // The most blocks that fit in `bytes`.
  int64_t BlocksFor(int64_t bytes) const;
  // f32 values of one slot's state in one linear layer.
  int64_t StateValuesPerLayer() const {
    return conv_rows * conv_channels + state_heads * k_dim * v_dim;
  }
  // Bytes of `slots` slots over every linear layer held (default: the
  // device tier's).
  int64_t StateBytes(int64_t slots = -1) const {
    return 4 * (slots < 0 ? state_slots : slots) * linear_layers *
           StateValuesPerLayer();
  }
};

// What a shard's pool holds per block (layers, KV heads or the latent,
// their width); the block size, counts and dtype are left unset.
KvPoolConfig PoolShapeForShard(const ModelConfig& config,
                               const ShardSpec& spec);

// The pool of one shard (its layers and KV heads) with as many device
// blocks as `budget_bytes` holds (enough for one full context when it is 0)
// and as many host blocks as `host_bytes` holds. A hybrid model's
// `state_slots` slots (max_seqs) and `snapshot_slots` come out of the
// device budget first.
// InvalidArgument when the device budget holds no block or either holds
// absurdly many.
absl::StatusOr<KvPoolConfig> PoolConfigForShard(
    const ModelConfig& config, const ShardSpec& spec, int64_t block_size,
    DType dtype, int64_t budget_bytes, int64_t host_bytes = 0,
    int64_t state_slots = 0, int64_t snapshot_slots = 0);

class KvPool {
 public:
  // ResourceExhausted when the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(
      const KvPoolConfig& config);

  const KvPoolConfig& config() const { return config_; }
  // Both tiers, in the CPU kernels' layouts (KeyCacheShape and
  // ValueCacheShape of total_blocks): one allocation per layer and
  // tensor (both tiers are host memory; they differ in budget and role
  // only).
  Tensor& k(int64_t layer) { return k_[layer]; }
  // Every layer's cache, for the forward pass.
  std::vector<Tensor>& k_layers() { return k_; }
  std::vector<Tensor>& v_layers() { return v_; }
  Tensor& v(int64_t layer) { return v_[layer]; }
  // Linear layer i's state (i counts the linear layers held, from 0):
  // [state_slots, conv_rows, conv_channels] and [state_slots,
  // state_heads, k_dim, v_dim], f32, zero at first.
  std::vector<Tensor>& conv_states() { return conv_; }
  std::vector<Tensor>& recurrent_states() { return recurrent_; }
  // KV blocks and state slots of both tiers, snapshots included.
  int64_t bytes() const {
    return config_.total_blocks() * config_.BytesPerBlock() +
           config_.StateBytes(config_.total_state_slots());
  }
  // What the tensors hold, whatever the config says: their element type
  // and their bytes per token slot (both tiers' slots together).
  DType stored_dtype() const {
    return k_.empty() ? config_.dtype : k_[0].dtype();
  }
  int64_t StoredBytesPerToken() const;

  // Runs the copies in order. InvalidArgument, with nothing copied, for a
  // block outside the pool or a copy onto itself. With
  // checksum_host_tier, a host block copied out whose bytes no longer
  // match the checksum taken when it was copied in is still copied (the
  // step must run on, its peers are in collectives with it) and noted
  // for TakeChecksumFailures.
  absl::Status CopyBlocks(absl::Span<const BlockCopy> copies);
  // Runs state slot copies in order, every linear layer's conv and
  // recurrent state. InvalidArgument, with nothing copied, for a slot
  // outside both tiers or a copy onto itself.
  absl::Status CopyStates(absl::Span<const BlockCopy> copies);
  // DataLoss naming the host blocks that failed their checksum since the
  // last call (the step that read them must not produce tokens), else OK.
  absl::Status TakeChecksumFailures();

  // Tests (SHARDLM_TEST_CORRUPT_HOST_KV=N in the environment when the pool
  // is created): flips one byte of the N-th block copied into the host
  // tier, after its checksum was taken, as a bit flip in memory would.
  static constexpr const char* kCorruptEnv = "SHARDLM_TEST_CORRUPT_HOST_KV";

 private:
  explicit KvPool(const KvPoolConfig& config) : config_(config) {}
  // One block of one KV head of one layer's K (or V), and the distance
  // between heads: the caches are [kv_heads, blocks, ...].
  size_t HeadBytes() const;
  // Copies one block over every layer, K and V, and KV head.
  void CopyBlock(int64_t src, int64_t dst);
  uint32_t BlockChecksum(int64_t block) const;
  bool IsHost(int64_t block) const { return block >= config_.num_blocks; }

  KvPoolConfig config_;
  std::vector<Tensor> k_, v_;
  std::vector<Tensor> conv_, recurrent_;
  std::vector<uint32_t> host_checksums_;  // Per host block.
  std::vector<int64_t> checksum_failures_;
  int64_t corrupt_countdown_ = 0;  // Host copies to the test's bit flip.
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_KV_POOL_H_
