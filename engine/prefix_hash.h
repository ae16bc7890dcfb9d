// The keys of the prefix cache's full KV blocks (DESIGN.md section 4), in
// one place so that the block manager and anything that predicts its hits
// (the router's index, the simulator) compute them the same way.
//
// Block k of a token sequence is keyed by a hash of (block k-1's key, the
// block's block_size tokens); block 0's parent is a fixed root. A key thus
// names a whole prefix, not one block's tokens. Keys are 64-bit hashes;
// the block manager still compares the tokens of a hit (a collision is a
// miss there), while a predictor can only be wrong by one such collision.
#ifndef SHARDLM_ENGINE_PREFIX_HASH_H_
#define SHARDLM_ENGINE_PREFIX_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace shardlm {

// The parent key of block 0.
inline constexpr uint64_t kPrefixRootKey = 0x9e3779b97f4a7c15ull;

// The key of a full block: its parent's key and its tokens.
uint64_t PrefixBlockKey(uint64_t parent, absl::Span<const int32_t> tokens);

// The keys of the full blocks of `tokens` (tokens.size() / block_size of
// them), block 0 first. block_size must be positive.
std::vector<uint64_t> PrefixBlockKeys(absl::Span<const int32_t> tokens,
                                      int32_t block_size);

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_PREFIX_HASH_H_
