#include "worker/kv_pool.h"

#include <cstring>
#include <vector>

#include "engine/step_executor.h"
#include "gtest/gtest.h"
#include "kernels/attention/latent_attention.h"
#include "model/model_config.h"
#include "testing/random_tensors.h"
#include "testing/status.h"
#include "worker/llama_weights.h"

namespace shardlm {
namespace {

using testing_util::RandomTensor;

// A DeepSeek-shaped config: 4 layers of 8 heads over a latent of 32 and a
// RoPE key of 8 (heads of 16 + 8).
ModelConfig LatentConfig() {
  ModelConfig c;
  c.architecture = "deepseek2";
  c.n_layers = 4;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.n_heads = c.n_kv_heads = 8;
  c.head_dim = 24;
  c.rope_dims = 8;
  c.kv_lora_rank = 32;
  c.v_head_dim = 16;
  c.vocab_size = 100;
  c.context_length = 256;
  return c;
}

// The pool of a latent model holds one entry of kv_lora_rank + rope_dims
// per token and layer, not a K and a V per head: its budget, its blocks
// and its measured bytes agree, and at TP 2 each rank holds all of it.
TEST(KvPoolTest, ALatentPoolHoldsOneEntryPerTokenAndLayer) {
  const ModelConfig c = LatentConfig();
  ASSERT_OK(c.Validate());
  for (DType t : {DType::kF32, DType::kF16, DType::kI8}) {
    const int64_t entry = t == DType::kI8 ? 40 + 4 : 40 * BlockBytes(t);
    EXPECT_EQ(KvBytesPerToken(c, t), 4 * entry) << DTypeName(t);
    ShardSpec spec = WholeModelSpec(c);
    spec.tp_size = 2;
    spec.head_begin = spec.kv_head_begin = 4;  // TP rank 1 of 2.
    ASSERT_OK_AND_ASSIGN(KvPoolConfig kv,
                         PoolConfigForShard(c, spec, 16, t, 16 * 10 * 4 * entry,
                                            16 * 3 * 4 * entry));
    EXPECT_TRUE(kv.latent);
    EXPECT_EQ(kv.num_blocks, 10);
    EXPECT_EQ(kv.num_host_blocks, 3);
    ASSERT_OK_AND_ASSIGN(auto pool, KvPool::Create(kv));
    EXPECT_EQ(pool->StoredBytesPerToken(), 4 * entry) << DTypeName(t);
    EXPECT_TRUE(pool->v(0).empty());
  }
}

// Blocks copied to the host tier and back (as a preempted sequence's are)
// keep every layer's entries, checksummed on the way.
TEST(KvPoolTest, LatentBlocksSurviveTheHostTier) {
  const ModelConfig c = LatentConfig();
  ASSERT_OK_AND_ASSIGN(
      KvPoolConfig kv,
      PoolConfigForShard(c, WholeModelSpec(c), 4, DType::kF16, 0, 0));
  kv.num_blocks = 3;
  kv.num_host_blocks = 2;
  kv.checksum_host_tier = true;
  ASSERT_OK_AND_ASSIGN(auto pool, KvPool::Create(kv));
  // Four tokens into block 1 of every layer.
  const std::vector<int32_t> pos = {0, 1, 2, 3}, seq = {0, 0, 0, 0},
                             table = {1};
  AttentionBatch batch{.positions = pos, .token_seq = seq};
  batch.block_tables.push_back(table);
  std::vector<std::vector<char>> want;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Tensor rope = RandomTensor({4, 8}, 10 + l);
    const Tensor latent = RandomTensor({4, 32}, 20 + l);
    ASSERT_OK(WriteLatent(rope, latent, batch, pool->k(l)));
    const char* b1 = pool->k(l).data<char>() + 4 * 40 * 2;
    want.emplace_back(b1, b1 + 4 * 40 * 2);
  }
  ASSERT_OK(pool->CopyBlocks({{1, 4}}));  // Out to the host tier.
  ASSERT_OK(pool->CopyBlocks({{4, 0}}));  // And back, elsewhere.
  ASSERT_OK(pool->TakeChecksumFailures());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(
        std::memcmp(pool->k(l).data<char>(), want[l].data(), want[l].size()), 0)
        << "layer " << l;
  }
}

}  // namespace
}  // namespace shardlm
