#include "engine/prefix_hash.h"

#include "core/check.h"

namespace shardlm {
namespace {

uint64_t Mix(uint64_t h) {  // splitmix64's finalizer.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

uint64_t PrefixBlockKey(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix(parent);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

std::vector<uint64_t> PrefixBlockKeys(absl::Span<const int32_t> tokens,
                                      int32_t block_size) {
  SHARDLM_CHECK(block_size > 0, "block_size=", block_size);
  const size_t full = tokens.size() / static_cast<size_t>(block_size);
  std::vector<uint64_t> keys;
  keys.reserve(full);
  uint64_t parent = kPrefixRootKey;
  for (size_t k = 0; k < full; ++k) {
    parent = PrefixBlockKey(parent, tokens.subspan(k * block_size, block_size));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace shardlm
