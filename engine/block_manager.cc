#include "engine/block_manager.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "engine/prefix_hash.h"

namespace shardlm {

BlockManager::BlockManager(int32_t device_blocks, int32_t block_size,
                           int32_t host_blocks, bool prefix_caching)
    : device_blocks_(device_blocks),
      host_blocks_(host_blocks),
      block_size_(block_size),
      prefix_caching_(prefix_caching) {
  SHARDLM_CHECK(device_blocks >= 0 && host_blocks >= 0 && block_size > 0,
                "device_blocks=", device_blocks, " host_blocks=", host_blocks,
                " block_size=", block_size);
  blocks_.resize(static_cast<size_t>(device_blocks) + host_blocks);
  device_free_.reserve(device_blocks);
  for (int32_t b = device_blocks - 1; b >= 0; --b) device_free_.push_back(b);
  host_free_.reserve(host_blocks);
  for (int32_t b = device_blocks + host_blocks - 1; b >= device_blocks; --b) {
    host_free_.push_back(b);
  }
}

void BlockManager::set_interleave(int cp) {
  cp = std::max(1, cp);
  SHARDLM_CHECK(
      host_blocks_ == 0 || (device_blocks_ % cp == 0 && host_blocks_ % cp == 0),
      "a host tier under CP ", cp, " needs both tiers' sizes ",
      "multiples of it, got ", device_blocks_, " + ", host_blocks_);
  interleave_ = cp;
}

int64_t BlockManager::BlocksFor(int64_t tokens) const {
  return (tokens + block_size_ - 1) / block_size_;
}

TierUsage BlockManager::device_usage() const {
  TierUsage u{.total = device_blocks_,
              .cached = static_cast<int32_t>(device_lru_.size()),
              .free = static_cast<int32_t>(device_free_.size())};
  u.used = u.total - u.cached - u.free;
  return u;
}

TierUsage BlockManager::host_usage() const {
  TierUsage u{
      .total = host_blocks_,
      .cached = static_cast<int32_t>(host_lru_.size()),
      .free = static_cast<int32_t>(host_free_.size() + host_held_.size())};
  u.used = u.total - u.cached - u.free;
  return u;
}

namespace {
// Ids g < n with g % cp == r.
int32_t IdsOfRank(int32_t n, int cp, int r) {
  return n <= r ? 0 : (n - r + cp - 1) / cp;
}
}  // namespace

std::vector<TierUsage> BlockManager::DeviceUsageByRank() const {
  std::vector<TierUsage> u(interleave_);
  for (int r = 0; r < interleave_; ++r) {
    u[r].total = IdsOfRank(device_blocks_, interleave_, r);
  }
  for (int32_t b : device_free_) ++u[RankOf(b)].free;
  for (const auto& [use, b] : device_lru_) ++u[RankOf(b)].cached;
  for (TierUsage& t : u) t.used = t.total - t.cached - t.free;
  return u;
}

std::vector<TierUsage> BlockManager::HostUsageByRank() const {
  std::vector<TierUsage> u(interleave_);
  for (int r = 0; r < interleave_; ++r) {
    u[r].total = IdsOfRank(device_blocks_ + host_blocks_, interleave_, r) -
                 IdsOfRank(device_blocks_, interleave_, r);
  }
  for (int32_t b : host_free_) ++u[RankOf(b)].free;
  for (int32_t b : host_held_) ++u[RankOf(b)].free;
  for (const auto& [use, b] : host_lru_) ++u[RankOf(b)].cached;
  for (TierUsage& t : u) t.used = t.total - t.cached - t.free;
  return u;
}

int32_t BlockManager::used_blocks() const {
  return device_usage().used + host_usage().used;
}

int32_t BlockManager::DeviceAvailable() const {
  return static_cast<int32_t>(device_free_.size() + device_lru_.size());
}

int32_t BlockManager::HostAvailable() const {
  return static_cast<int32_t>(host_free_.size() + host_lru_.size());
}

bool BlockManager::CanSwapOut(int64_t seq) const {
  if (interleave_ == 1) return HostAvailable() >= DeviceBlocksOf(seq);
  std::vector<int32_t> need(interleave_, 0);
  for (int32_t b : Table(seq)) {
    if (!IsHost(b)) ++need[RankOf(b)];
  }
  for (int32_t b : host_free_) --need[RankOf(b)];
  for (const auto& [use, b] : host_lru_) --need[RankOf(b)];
  return std::all_of(need.begin(), need.end(),
                     [](int32_t n) { return n <= 0; });
}

void BlockManager::Unkey(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.keyed) return;
  auto it = by_key_.find(blk.key);
  if (it != by_key_.end() && it->second == b) {
    by_key_.erase(it);
    if (events_ != nullptr) events_->Evicted(blk.key);
  }
  blk.keyed = false;
  blk.tokens.clear();
}

void BlockManager::Uncache(int32_t b) {
  LruOf(b).erase({blocks_[b].last_use, b});
}

void BlockManager::Rekey(int32_t from, int32_t to) {
  Block& f = blocks_[from];
  Block& t = blocks_[to];
  t.keyed = true;
  t.key = f.key;
  t.tokens = std::move(f.tokens);
  t.last_use = f.last_use;
  f.keyed = false;
  f.tokens.clear();
  by_key_[t.key] = to;
}

int32_t BlockManager::PopFree(std::vector<int32_t>& free, int rank) {
  // The scan is short: ranks alternate through a free list.
  for (auto it = free.rbegin(); it != free.rend(); ++it) {
    if (rank != kAnyRank && RankOf(*it) != rank) continue;
    const int32_t b = *it;
    free.erase(std::next(it).base());
    return b;
  }
  return -1;
}

BlockManager::Lru::iterator BlockManager::OldestOf(Lru& lru, int rank) {
  if (rank == kAnyRank) return lru.begin();
  return std::find_if(lru.begin(), lru.end(),
                      [&](const auto& e) { return RankOf(e.second) == rank; });
}

int32_t BlockManager::ReclaimHost(int rank, uint64_t used_before) {
  const int32_t h = PopFree(host_free_, rank);
  if (h >= 0) return h;
  const auto oldest = OldestOf(host_lru_, rank);
  if (oldest == host_lru_.end() || oldest->first >= used_before) return -1;
  const int32_t cached = oldest->second;
  host_lru_.erase(oldest);
  Unkey(cached);
  ++counters_.dropped;
  return cached;
}

int32_t BlockManager::TakeHost(int rank) {
  const int32_t h = ReclaimHost(rank, std::numeric_limits<uint64_t>::max());
  if (h >= 0) blocks_[h].refs = 1;
  return h;
}

void BlockManager::EvictDevice(int32_t d) {
  // Spill to the host when its rank has a free host block or a cached one
  // used longer ago than this one; drop it otherwise.
  const int32_t h = ReclaimHost(RankOf(d), blocks_[d].last_use);
  if (h >= 0) {
    copies_.push_back({d, h});
    Rekey(d, h);
    host_lru_.insert({blocks_[h].last_use, h});
    ++counters_.spilled;
  } else {
    Unkey(d);
    ++counters_.dropped;
  }
}

int32_t BlockManager::TakeDevice(int rank) {
  int32_t d = PopFree(device_free_, rank);
  if (d < 0) {
    const auto oldest = OldestOf(device_lru_, rank);
    if (oldest == device_lru_.end()) return -1;
    d = oldest->second;
    device_lru_.erase(oldest);
    EvictDevice(d);
  }
  blocks_[d].refs = 1;
  return d;
}

void BlockManager::Unref(int32_t b) {
  Block& blk = blocks_[b];
  SHARDLM_CHECK(blk.refs > 0, "block ", b, " freed twice");
  if (--blk.refs > 0) return;
  if (blk.keyed) {
    LruOf(b).insert({blk.last_use, b});
  } else if (IsHost(b)) {
    host_held_.push_back(b);
  } else {
    device_free_.push_back(b);
  }
}

void BlockManager::set_state_slots(int32_t slots, int32_t host_slots,
                                   int32_t snapshots) {
  SHARDLM_CHECK(tables_.empty(), "state slots are set before any table");
  state_slots_ = slots;
  host_state_slots_ = host_slots;
  snapshot_slots_ = snapshots;
  free_slots_.clear();
  free_host_slots_.clear();
  free_snapshots_.clear();
  snapshots_.clear();
  for (int32_t s = slots; s-- > 0;) free_slots_.push_back(s);
  for (int32_t s = slots + host_slots; s-- > slots;) {
    free_host_slots_.push_back(s);
  }
  for (int32_t s = slots + host_slots + snapshots; s-- > slots + host_slots;) {
    free_snapshots_.push_back(s);
  }
  if (slots > 0 && snapshots == 0) prefix_caching_ = false;
}

void BlockManager::SnapshotState(int64_t seq, absl::Span<const int32_t> tokens,
                                 int64_t tokens_at) {
  if (snapshot_slots_ == 0 || !prefix_caching_ || tokens_at <= 0 ||
      tokens_at % block_size_ != 0 ||
      tokens_at > static_cast<int64_t>(tokens.size())) {
    return;
  }
  const int32_t slot = StateSlot(seq);
  if (slot < 0 || IsHostSlot(slot)) return;
  uint64_t key = kPrefixRootKey;
  for (int64_t k = 0; k < tokens_at / block_size_; ++k) {
    key = PrefixBlockKey(key, tokens.subspan(k * block_size_, block_size_));
  }
  if (auto it = snapshots_.find(key); it != snapshots_.end()) {
    it->second.last_use = ++tick_;
    return;
  }
  int32_t to = -1;
  if (!free_snapshots_.empty()) {
    to = free_snapshots_.back();
    free_snapshots_.pop_back();
  } else {
    auto oldest = snapshots_.begin();
    for (auto it = snapshots_.begin(); it != snapshots_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    to = oldest->second.slot;
    snapshots_.erase(oldest);
  }
  // With the next step's copies: after this step's compute, before the
  // next's (the sequence's next chunk included).
  state_copies_.push_back({slot, to});
  snapshots_[key] = {to, ++tick_};
  ++counters_.state_snapshots;
}

bool BlockManager::SwapOutState(int64_t seq) {
  auto it = slot_of_.find(seq);
  if (it == slot_of_.end() || IsHostSlot(it->second) ||
      free_host_slots_.empty()) {
    return false;
  }
  const int32_t host = free_host_slots_.back();
  free_host_slots_.pop_back();
  state_copies_.push_back({it->second, host});
  ++counters_.states_swapped_out;
  // Reusable at once: copies run in the order recorded, before compute.
  free_slots_.push_back(it->second);
  it->second = host;
  return true;
}

bool BlockManager::SwapInState(int64_t seq) {
  auto it = slot_of_.find(seq);
  if (it == slot_of_.end() || !IsHostSlot(it->second) || free_slots_.empty()) {
    return false;
  }
  const int32_t device = free_slots_.back();
  free_slots_.pop_back();
  state_copies_.push_back({it->second, device});
  ++counters_.states_swapped_in;
  free_host_slots_.push_back(it->second);
  it->second = device;
  return true;
}

std::vector<BlockCopy> BlockManager::TakeStateCopies() {
  std::vector<BlockCopy> out;
  out.swap(state_copies_);
  return out;
}

int32_t BlockManager::StateSlot(int64_t seq) const {
  auto it = slot_of_.find(seq);
  return it == slot_of_.end() ? -1 : it->second;
}

absl::Status BlockManager::Reserve(int64_t seq, int64_t tokens) {
  const bool needs_slot = state_slots_ > 0 && !slot_of_.contains(seq);
  if (needs_slot && free_slots_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("recurrent state: all ", state_slots_, " slots are held"));
  }
  const auto take_slot = [&] {
    if (!needs_slot) return;
    slot_of_[seq] = free_slots_.back();
    free_slots_.pop_back();
  };
  std::vector<int32_t>& table = tables_[seq];
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) {
    take_slot();
    return absl::OkStatus();
  }
  if (need > DeviceAvailable()) {
    if (table.empty()) tables_.erase(seq);
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache: ", tokens, " tokens need ", need, " more blocks of ",
        block_size_, " but only ", DeviceAvailable(), " of ", device_blocks_,
        " device blocks are available"));
  }
  for (int64_t i = 0; i < need; ++i) {
    int32_t b = -1;
    if (interleave_ > 1) {
      b = TakeFreeDeviceOf(static_cast<int>(table.size() % interleave_));
    }
    table.push_back(b >= 0 ? b : TakeDevice());
  }
  take_slot();
  return absl::OkStatus();
}

int32_t BlockManager::TakeFreeDeviceOf(int rank) {
  const int32_t d = PopFree(device_free_, rank);
  if (d >= 0) blocks_[d].refs = 1;
  return d;
}

const std::vector<int32_t>& BlockManager::Table(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmpty : it->second;
}

int32_t BlockManager::HostBlocksOf(int64_t seq) const {
  const std::vector<int32_t>& t = Table(seq);
  return static_cast<int32_t>(
      std::count_if(t.begin(), t.end(), [&](int32_t b) { return IsHost(b); }));
}

int32_t BlockManager::DeviceBlocksOf(int64_t seq) const {
  return static_cast<int32_t>(Table(seq).size()) - HostBlocksOf(seq);
}

void BlockManager::Free(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) Unref(*b);
  tables_.erase(it);
  if (auto slot = slot_of_.find(seq); slot != slot_of_.end()) {
    (IsHostSlot(slot->second) ? free_host_slots_ : free_slots_)
        .push_back(slot->second);
    slot_of_.erase(slot);
  }
}

void BlockManager::Truncate(int64_t seq, int64_t tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  std::vector<int32_t>& table = it->second;
  const size_t keep =
      static_cast<size_t>(std::max<int64_t>(0, BlocksFor(tokens)));
  while (table.size() > keep) {
    Unref(table.back());
    table.pop_back();
  }
}

int32_t BlockManager::SwapOut(int64_t seq, int32_t max_blocks,
                              int32_t keep_last) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  std::vector<int32_t>& table = it->second;
  int32_t moved = 0;
  const int64_t end = static_cast<int64_t>(table.size()) - keep_last;
  for (int64_t i = 0; i < end && moved < max_blocks; ++i) {
    const int32_t d = table[i];
    if (IsHost(d)) continue;
    const int32_t h = TakeHost(RankOf(d));
    if (h < 0) {
      if (interleave_ == 1) break;
      continue;  // Another rank's host blocks may have room.
    }
    copies_.push_back({d, h});
    table[i] = h;
    Unref(d);  // A keyed block stays cached on the device.
    ++moved;
  }
  counters_.swapped_out += moved;
  return moved;
}

int32_t BlockManager::SwapIn(int64_t seq, int32_t max_blocks) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  std::vector<int32_t>& table = it->second;
  int32_t moved = 0;
  for (size_t i = 0; i < table.size() && moved < max_blocks; ++i) {
    const int32_t h = table[i];
    if (!IsHost(h)) continue;
    const int32_t d = TakeDevice(RankOf(h));
    if (d < 0) {
      if (interleave_ == 1) break;
      continue;  // Another rank's device blocks may have room.
    }
    copies_.push_back({h, d});
    table[i] = d;
    Unref(h);
    ++moved;
  }
  counters_.swapped_in += moved;
  return moved;
}

int64_t BlockManager::AttachPrefix(int64_t seq,
                                   absl::Span<const int32_t> tokens,
                                   int64_t max_tokens) {
  if (!prefix_caching_) return 0;
  counters_.prefix_queries += static_cast<int64_t>(tokens.size());
  if (!Table(seq).empty()) return 0;
  int64_t full =
      std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size())) /
      block_size_;
  Snapshot* snapshot = nullptr;
  if (state_slots_ > 0) {
    // A hybrid model: up to the last cached block whose state was kept.
    if (StateSlot(seq) >= 0 || free_slots_.empty()) return 0;
    uint64_t key = kPrefixRootKey;
    int64_t usable = 0;
    for (int64_t k = 0; k < full; ++k) {
      const auto slice = tokens.subspan(k * block_size_, block_size_);
      key = PrefixBlockKey(key, slice);
      auto it = by_key_.find(key);
      if (it == by_key_.end() ||
          !std::equal(slice.begin(), slice.end(),
                      blocks_[it->second].tokens.begin(),
                      blocks_[it->second].tokens.end())) {
        break;
      }
      if (auto s = snapshots_.find(key); s != snapshots_.end()) {
        usable = k + 1;
        snapshot = &s->second;
      }
    }
    full = usable;
    if (full == 0) return 0;
  }
  std::vector<int32_t>& table = tables_[seq];
  uint64_t parent = kPrefixRootKey;
  for (int64_t k = 0; k < full; ++k) {
    const auto slice = tokens.subspan(k * block_size_, block_size_);
    const uint64_t key = PrefixBlockKey(parent, slice);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    int32_t b = it->second;
    Block& blk = blocks_[b];
    if (!std::equal(slice.begin(), slice.end(), blk.tokens.begin(),
                    blk.tokens.end())) {
      break;  // A key collision: treat as a miss.
    }
    if (blk.refs == 0) Uncache(b);
    ++blk.refs;  // Pinned: no eviction below may take it.
    if (IsHost(b)) {
      const int32_t d = TakeDevice(RankOf(b));
      if (d < 0) {
        // The device is full: attach the host block where it is (attention
        // reads either tier; the scheduler swaps it in when there is room,
        // or keeps it there as it does a long sequence's older blocks).
        blocks_[b].last_use = ++tick_;
        table.push_back(b);
        parent = key;
        continue;
      }
      copies_.push_back({b, d});
      Rekey(b, d);
      Unref(b);  // Unkeyed now: held back until the copy ran.
      ++counters_.swapped_in;
      b = d;
    }
    blocks_[b].last_use = ++tick_;
    table.push_back(b);
    parent = key;
  }
  if (snapshot != nullptr && static_cast<int64_t>(table.size()) != full) {
    // A block of the run was evicted while a host one came in: the
    // snapshot is of a longer prefix than the blocks held. None attached.
    for (auto b = table.rbegin(); b != table.rend(); ++b) Unref(*b);
    table.clear();
    snapshot = nullptr;
  }
  const int64_t hit = static_cast<int64_t>(table.size()) * block_size_;
  if (table.empty()) tables_.erase(seq);  // `table` dangles from here.
  if (snapshot != nullptr) {
    // The state after the attached blocks, into the sequence's own slot.
    const int32_t slot = free_slots_.back();
    free_slots_.pop_back();
    slot_of_[seq] = slot;
    state_copies_.push_back({snapshot->slot, slot});
    snapshot->last_use = ++tick_;
  }
  counters_.prefix_hit_tokens += hit;
  return hit;
}

void BlockManager::CacheFullBlocks(int64_t seq,
                                   absl::Span<const int32_t> tokens,
                                   int64_t computed) {
  if (!prefix_caching_) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& table = it->second;
  const int64_t full = std::min<int64_t>(
      std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) /
          block_size_,
      static_cast<int64_t>(table.size()));
  uint64_t parent = kPrefixRootKey;
  for (int64_t k = 0; k < full; ++k) {
    const auto slice = tokens.subspan(k * block_size_, block_size_);
    const uint64_t key = PrefixBlockKey(parent, slice);
    parent = key;
    Block& blk = blocks_[table[k]];
    blk.last_use = ++tick_;
    if (blk.keyed || by_key_.contains(key)) continue;
    blk.keyed = true;
    blk.key = key;
    blk.tokens.assign(slice.begin(), slice.end());
    by_key_[key] = table[k];
    if (events_ != nullptr) events_->Inserted(key);
  }
}

void BlockManager::DropCache() {
  for (auto& [key, b] : by_key_) {
    Block& blk = blocks_[b];
    blk.keyed = false;
    blk.tokens.clear();
    if (blk.refs == 0) {
      Uncache(b);
      if (IsHost(b)) {
        host_free_.push_back(b);
      } else {
        device_free_.push_back(b);
      }
    }
    ++counters_.dropped;
  }
  by_key_.clear();
  for (const auto& [key, s] : snapshots_) free_snapshots_.push_back(s.slot);
  snapshots_.clear();
  if (events_ != nullptr) events_->Cleared();
}

std::vector<BlockCopy> BlockManager::TakeCopies() {
  std::vector<BlockCopy> out;
  out.swap(copies_);
  host_free_.insert(host_free_.end(), host_held_.begin(), host_held_.end());
  host_held_.clear();
  return out;
}

}  // namespace shardlm
