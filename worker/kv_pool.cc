#include "worker/kv_pool.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/crc32c.h"
#include "core/status.h"
#include "kernels/attention/latent_attention.h"
#include "kernels/attention/paged_attention.h"

namespace shardlm {

int64_t KvPoolConfig::BytesPerBlock() const {
  return (latent ? 1 : 2) * n_layers * kv_heads *
         KvHeadBlockBytes(dtype, block_size, head_dim);
}

int64_t KvPoolConfig::BlocksFor(int64_t bytes) const {
  const int64_t per_block = BytesPerBlock();
  return per_block > 0 ? bytes / per_block : 0;
}

KvPoolConfig PoolShapeForShard(const ModelConfig& c, const ShardSpec& spec) {
  // Under MLA every TP rank holds the whole latent (its heads all read it).
  KvPoolConfig kv{.n_layers = spec.n_layers(),
                  .kv_heads = c.is_mla() ? 1 : spec.n_kv_heads(),
                  .head_dim = c.CachedHeadDim(),
                  .latent = c.is_mla()};
  if (c.is_hybrid()) {
    // Its TP share of the value heads; the q/k channels are every rank's
    // (worker/llama_weights.h, LoadGatedDeltaNet).
    const auto [v0, v1] = SsmValueHeads(c, spec);
    kv.n_layers = c.AttentionLayers(spec.layer_begin, spec.layer_end);
    kv.linear_layers = spec.n_layers() - kv.n_layers;
    kv.conv_rows = c.ssm_conv_width - 1;
    kv.conv_channels =
        2 * c.ssm_k_heads * c.ssm_k_dim + (v1 - v0) * c.ssm_v_dim;
    kv.state_heads = v1 - v0;
    kv.k_dim = c.ssm_k_dim;
    kv.v_dim = c.ssm_v_dim;
  }
  return kv;
}

absl::StatusOr<KvPoolConfig> PoolConfigForShard(
    const ModelConfig& c, const ShardSpec& spec, int64_t block_size,
    DType dtype, int64_t budget_bytes, int64_t host_bytes, int64_t state_slots,
    int64_t snapshot_slots) {
  if (!IsCpuKvDType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype ", DTypeName(dtype),
                     ": expected f32, f16, bf16 or int8"));
  }
  if (block_size <= 0 || budget_bytes < 0 || host_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block size (", block_size, ") must be positive and the KV budgets (",
        budget_bytes, " device, ", host_bytes, " host bytes) not negative"));
  }
  KvPoolConfig kv = PoolShapeForShard(c, spec);
  kv.block_size = block_size;
  kv.dtype = dtype;
  if (kv.linear_layers > 0) {
    if (state_slots < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.architecture, ": a hybrid model needs state slots (max_seqs)"));
    }
    kv.state_slots = state_slots;
    kv.snapshot_slots = snapshot_slots;
  }
  // A host tier holds a slot for every device slot, from its budget too.
  if (kv.linear_layers > 0 && host_bytes > 0) {
    if (kv.StateBytes() >= host_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host KV budget (--cpu-offload-bytes) of ", host_bytes,
          " bytes holds no block beside ", kv.state_slots,
          " host state slots of ", kv.linear_layers, " linear layers (",
          kv.StateBytes(), " bytes at pp ", spec.pp_rank, " tp ", spec.tp_rank,
          "); raise it or lower --max-seqs"));
    }
    kv.host_state_slots = kv.state_slots;
    host_bytes -= kv.StateBytes();
  }
  const int64_t device_state =
      kv.StateBytes(kv.state_slots + kv.snapshot_slots);
  if (budget_bytes > 0 && device_state >= budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache budget of ", budget_bytes, " bytes holds no block beside ",
        kv.state_slots, " state slots and ", kv.snapshot_slots,
        " prefix snapshots of ", kv.linear_layers, " linear layers (",
        device_state, " bytes at pp ", spec.pp_rank, " tp ", spec.tp_rank,
        "); lower --max-seqs or raise the budget"));
  }
  // A stage of a hybrid model may hold linear layers only: its blocks
  // cost nothing, and the other stages' counts decide (the fewest).
  constexpr int64_t kFreeBlocks = int64_t{1} << 30;
  const bool free_blocks = kv.BytesPerBlock() == 0;
  kv.num_blocks = free_blocks ? kFreeBlocks
                  : budget_bytes > 0
                      ? kv.BlocksFor(budget_bytes - device_state)
                      : (c.context_length + block_size - 1) / block_size;
  if (kv.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache budget of ", budget_bytes,
                     " bytes holds no block (one "
                     "block of the shard at pp ",
                     spec.pp_rank, " tp ", spec.tp_rank, " is ",
                     kv.BytesPerBlock(), " bytes)"));
  }
  kv.num_host_blocks =
      free_blocks && host_bytes > 0 ? kFreeBlocks : kv.BlocksFor(host_bytes);
  if (kv.num_blocks > (int64_t{1} << 30) ||
      kv.num_host_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache budget is absurdly large (", kv.num_blocks,
                     " device and ", kv.num_host_blocks, " host blocks)"));
  }
  return kv;
}

int64_t KvPool::StoredBytesPerToken() const {
  size_t bytes = 0;
  for (const auto* layers : {&k_, &v_}) {
    for (const Tensor& t : *layers) bytes += t.bytes();
  }
  const int64_t slots = config_.total_blocks() * config_.block_size;
  return slots > 0 ? static_cast<int64_t>(bytes) / slots : 0;
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(
    const KvPoolConfig& config) {
  if ((config.n_layers <= 0 && config.linear_layers <= 0) ||
      config.n_layers < 0 || config.kv_heads <= 0 || config.head_dim <= 0 ||
      config.block_size <= 0 || config.num_blocks <= 0 ||
      config.num_host_blocks < 0 || !IsCpuKvDType(config.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool needs positive sizes; got ", config.n_layers, " layers, ",
        config.kv_heads, " KV heads, head_dim ", config.head_dim,
        ", block_size ", config.block_size, ", ", config.num_blocks, " + ",
        config.num_host_blocks, " blocks of ", DTypeName(config.dtype)));
  }
  std::unique_ptr<KvPool> pool(new KvPool(config));
  const int64_t blocks = config.total_blocks();
  const Shape k_shape =
      config.latent ? LatentCacheShape(blocks, config.block_size,
                                       config.head_dim, config.dtype)
                    : KeyCacheShape(blocks, config.block_size, config.kv_heads,
                                    config.head_dim, config.dtype);
  const Shape v_shape =
      ValueCacheShape(blocks, config.block_size, config.kv_heads,
                      config.head_dim, config.dtype);
  try {
    for (int64_t l = 0; l < config.n_layers; ++l) {
      // Every slot is written before it is read, so the pages need not be
      // touched (and committed) up front.
      ASSIGN_OR_RETURN(Tensor k,
                       Tensor::HostUninitialized(config.dtype, k_shape));
      Tensor v;
      if (!config.latent) {
        ASSIGN_OR_RETURN(v, Tensor::HostUninitialized(config.dtype, v_shape));
      }
      pool->k_.push_back(std::move(k));
      pool->v_.push_back(std::move(v));
    }
    const int64_t slots = config.total_state_slots();
    for (int64_t l = 0; l < config.linear_layers; ++l) {
      // Zeroed here, and again by each sequence's first step
      // (StepInput::state_slots).
      ASSIGN_OR_RETURN(Tensor conv,
                       Tensor::Host(DType::kF32, {slots, config.conv_rows,
                                                  config.conv_channels}));
      ASSIGN_OR_RETURN(Tensor rec,
                       Tensor::Host(DType::kF32, {slots, config.state_heads,
                                                  config.k_dim, config.v_dim}));
      pool->conv_.push_back(std::move(conv));
      pool->recurrent_.push_back(std::move(rec));
    }
    if (config.checksum_host_tier) {
      pool->host_checksums_.assign(config.num_host_blocks, 0);
      if (const char* n = std::getenv(kCorruptEnv); n != nullptr) {
        pool->corrupt_countdown_ = std::atoll(n);
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV pool of ", config.total_blocks(),
                     " blocks (", pool->bytes(), " bytes)"));
  }
  return pool;
}

size_t KvPool::HeadBytes() const {
  return static_cast<size_t>(config_.BytesPerBlock() /
                             (config_.latent ? 1 : 2) / config_.n_layers /
                             config_.kv_heads);
}

void KvPool::CopyBlock(int64_t src, int64_t dst) {
  const size_t head_bytes = HeadBytes();
  const size_t head_stride = head_bytes * config_.total_blocks();
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (Tensor* t : {&k_[l], &v_[l]}) {
      if (t->empty()) continue;  // A latent pool's V.
      for (int64_t g = 0; g < config_.kv_heads; ++g) {
        char* base = t->data<char>() + g * head_stride;
        std::memcpy(base + dst * head_bytes, base + src * head_bytes,
                    head_bytes);
      }
    }
  }
}

uint32_t KvPool::BlockChecksum(int64_t block) const {
  const size_t head_bytes = HeadBytes();
  const size_t head_stride = head_bytes * config_.total_blocks();
  uint32_t crc = 0;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (const Tensor* t : {&k_[l], &v_[l]}) {
      if (t->empty()) continue;  // A latent pool's V.
      for (int64_t g = 0; g < config_.kv_heads; ++g) {
        const char* base = t->data<char>() + g * head_stride;
        crc = Crc32c(base + block * head_bytes, head_bytes, crc);
      }
    }
  }
  return crc;
}

absl::Status KvPool::TakeChecksumFailures() {
  if (checksum_failures_.empty()) return absl::OkStatus();
  const std::string blocks = absl::StrJoin(checksum_failures_, ", ");
  const size_t n = checksum_failures_.size();
  checksum_failures_.clear();
  return absl::DataLossError(absl::StrCat(
      "KV block", n == 1 ? " " : "s ", blocks,
      " of the host tier failed the checksum taken when copied there: "
      "the sequences reading them are recomputed"));
}

absl::Status KvPool::CopyStates(absl::Span<const BlockCopy> copies) {
  const int64_t slots = config_.total_state_slots();
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= slots || c.dst < 0 || c.dst >= slots ||
        c.src == c.dst) {
      return absl::InvalidArgumentError(absl::StrCat("bad state slot copy ",
                                                     c.src, " -> ", c.dst,
                                                     " of ", slots, " slots"));
    }
  }
  for (std::vector<Tensor>* layers : {&conv_, &recurrent_}) {
    for (Tensor& t : *layers) {
      const size_t slot_bytes = t.bytes() / slots;
      char* base = t.data<char>();
      for (const BlockCopy& c : copies) {
        std::memcpy(base + c.dst * slot_bytes, base + c.src * slot_bytes,
                    slot_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvPool::CopyBlocks(absl::Span<const BlockCopy> copies) {
  const int64_t total = config_.total_blocks();
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= total || c.dst < 0 || c.dst >= total ||
        c.src == c.dst) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad KV block copy ", c.src, " -> ", c.dst,
                       " in a pool of ", total, " blocks"));
    }
  }
  if (config_.n_layers == 0) return absl::OkStatus();  // Linear layers only.
  if (config_.checksum_host_tier) {
    // Block by block, in order: a block copied in may be copied out later
    // in the same list.
    for (const BlockCopy& c : copies) {
      if (IsHost(c.src) &&
          BlockChecksum(c.src) != host_checksums_[c.src - config_.num_blocks]) {
        checksum_failures_.push_back(c.src);
      }
      CopyBlock(c.src, c.dst);
      if (IsHost(c.dst)) {
        host_checksums_[c.dst - config_.num_blocks] = BlockChecksum(c.dst);
        if (corrupt_countdown_ > 0 && --corrupt_countdown_ == 0) {
          k_[0].data<char>()[c.dst * HeadBytes()] ^= 0x10;
        }
      }
    }
    return absl::OkStatus();
  }
  // Layer by layer (each copy's bytes, head by head).
  const size_t head_bytes = HeadBytes();
  const size_t head_stride = head_bytes * total;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (Tensor* t : {&k_[l], &v_[l]}) {
      if (t->empty()) continue;  // A latent pool's V.
      for (int64_t g = 0; g < config_.kv_heads; ++g) {
        char* base = t->data<char>() + g * head_stride;
        for (const BlockCopy& c : copies) {
          std::memcpy(base + c.dst * head_bytes, base + c.src * head_bytes,
                      head_bytes);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
