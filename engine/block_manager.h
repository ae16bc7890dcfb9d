// Block manager: the only owner of KV block tables (DESIGN.md section 4).
//
// Plain bookkeeping with no device or network dependency. Block ids index
// every worker's KV pool identically, in one address space over two tiers:
// ids [0, device_blocks) are the device pool, ids [device_blocks,
// device_blocks + host_blocks) the host (CPU offload) pool. A table may
// mix tiers; new blocks are always taken from the device.
//
// Data moves between tiers only through BlockCopy operations, which this
// class records in order and the caller hands to the workers with the next
// step (TakeCopies); workers run them in that order before the step's
// compute. Two rules make every order safe: a block freed while building a
// plan is reused only after its copies ran (host blocks freed here are held
// back until TakeCopies), and a device block is reused only after the copy
// that reads it (copies run in the order they were recorded).
//
// Prefix caching: a full block is keyed by a hash of (its parent block's
// key, its tokens) (engine/prefix_hash.h). A freed block that has a key
// stays cached, least recently used first out; a device block evicted while the
// host has room (free, or cached blocks older than it) spills there before
// being dropped.
//
// Context parallel (set_interleave): block id g lives on CP rank g % cp in
// either tier, and every copy between tiers (swap out, swap in, spill, a
// host prefix hit promoted to the device) goes to a block of the same rank,
// so that each rank copies only within its own pool. Where the source's
// rank has no block to give, the copy is not made: fewer blocks move, a
// spilled block is dropped, a host prefix hit stays attached in the host.
#ifndef SHARDLM_ENGINE_BLOCK_MANAGER_H_
#define SHARDLM_ENGINE_BLOCK_MANAGER_H_

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/prefix_events.h"
#include "step/step.h"

namespace shardlm {

// Cumulative counters.
struct BlockCounters {
  int64_t swapped_out = 0;  // Blocks copied device -> host for sequences.
  int64_t swapped_in = 0;   // Blocks copied host -> device for sequences.
  int64_t spilled = 0;      // Cached blocks moved device -> host on eviction.
  int64_t dropped = 0;      // Cached blocks dropped from the cache.
  int64_t prefix_queries = 0;     // Prompt tokens looked up.
  int64_t prefix_hit_tokens = 0;  // Of those, found in the cache.
  // Hybrid models' states copied to a host slot and back.
  int64_t states_swapped_out = 0;
  int64_t states_swapped_in = 0;
  int64_t state_snapshots = 0;  // States kept at the end of a cached block.
};

// How full each tier is. used: held by sequences; cached: unused but kept
// for prefix hits (allocatable); free: neither.
struct TierUsage {
  int32_t total = 0, used = 0, cached = 0, free = 0;
};

class BlockManager {
 public:
  BlockManager(int32_t device_blocks, int32_t block_size,
               int32_t host_blocks = 0, bool prefix_caching = false);

  // Context parallel over `cp` ranks, each holding the ids g with g % cp
  // equal to its rank (worker/model_runner.h): Reserve then takes, for
  // entry j of a table, a free device block with id % cp == j % cp when
  // there is one, so that a sequence's blocks (and its attention work)
  // alternate over the ranks. Any block is still correct, only less
  // balanced; a cached block is evicted regardless of its rank. Tier
  // copies keep a block's rank (see the file comment). With a host tier,
  // both tiers' sizes must be multiples of cp (each rank's pool is device
  // blocks, then host blocks: the executors' group counts are cp times one
  // rank's).
  void set_interleave(int cp);
  int interleave() const { return interleave_; }
  // The CP rank that holds block `b`.
  int RankOf(int32_t b) const { return b % interleave_; }

  // Hybrid models (ModelConfig::is_hybrid): `slots` recurrent-state slots
  // beside the blocks, one held by every sequence that holds a table
  // (taken by its first Reserve, returned by Free), so that the workers'
  // linear-attention layers keep each sequence's state in its own slot
  // (StepInput::state_slots). With `host_slots`, slot ids [slots, slots +
  // host_slots) are the host tier's, where a preempted sequence's state
  // waits beside its swapped blocks (SwapOutState); copies between slots
  // are recorded as blocks' are (TakeStateCopies).
  //
  // The state is in no block, so a cached prefix is usable only up to a
  // block whose state was kept: `snapshots` slots after the host ones
  // hold the state at the end of a cached block (SnapshotState), least
  // recently used out; AttachPrefix attaches up to the last such block
  // and copies its snapshot into the sequence's new slot. Without
  // snapshots prefix caching is off. Call before any Reserve.
  void set_state_slots(int32_t slots, int32_t host_slots = 0,
                       int32_t snapshots = 0);
  int32_t state_snapshots() const { return snapshot_slots_; }
  // Records, with the next step's state copies, the state of `seq` after
  // its first `tokens_at` tokens (which it has reached in a planned step,
  // exactly: a multiple of the block size) as the snapshot of that
  // prefix's last block, evicting the least recently used snapshot when
  // all are taken. No-op without snapshots, or when that block's prefix
  // has one.
  void SnapshotState(int64_t seq, absl::Span<const int32_t> tokens,
                     int64_t tokens_at);
  int32_t state_slots() const { return state_slots_; }
  int32_t host_state_slots() const { return host_state_slots_; }
  // Device slots no sequence holds.
  int32_t FreeStateSlots() const {
    return static_cast<int32_t>(free_slots_.size());
  }
  // The slot of `seq` (a host slot while its state is swapped out), or -1
  // (no table, or no slots).
  int32_t StateSlot(int64_t seq) const;
  bool IsHostSlot(int32_t slot) const { return slot >= state_slots_; }
  // Moves the state of `seq` (in a device slot) to a free host slot;
  // false, with nothing changed, when there is none (or it has none).
  bool SwapOutState(int64_t seq);
  // Moves the state of `seq` (in a host slot) to a free device slot;
  // false, with nothing changed, when there is none (or it is not out).
  bool SwapInState(int64_t seq);
  // The state copies recorded since the last call, in order (run after
  // the step's block copies, before its compute).
  std::vector<BlockCopy> TakeStateCopies();

  int32_t block_size() const { return block_size_; }
  // Device blocks (the pool every step computes in).
  int32_t num_blocks() const { return device_blocks_; }
  int32_t num_host_blocks() const { return host_blocks_; }
  bool prefix_caching() const { return prefix_caching_; }
  bool IsHost(int32_t block) const { return block >= device_blocks_; }
  // Blocks held by sequences, both tiers (cached blocks are not held).
  int32_t used_blocks() const;
  TierUsage device_usage() const;
  TierUsage host_usage() const;
  // Per CP rank (interleave() entries; the blocks with RankOf(b) == r), in
  // O(free + cached blocks). They sum to device_usage() and host_usage().
  std::vector<TierUsage> DeviceUsageByRank() const;
  std::vector<TierUsage> HostUsageByRank() const;
  const BlockCounters& counters() const { return counters_; }
  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;

  // Device blocks a Reserve can take now: free or cached.
  int32_t DeviceAvailable() const;
  // Host blocks a swap-out can take now: free (not held back) or cached.
  int32_t HostAvailable() const;
  // Whether SwapOut(seq, n) can move all n of the device blocks of `seq`:
  // each to a host block of its own CP rank (HostAvailable() >= n when
  // not context parallel).
  bool CanSwapOut(int64_t seq) const;

  // Grows the table of `seq` (created when new, with a state slot when
  // there are slots) to hold `tokens` tokens with new device blocks
  // (evicting cached ones, spilling them to the host where it has room).
  // ResourceExhausted, with nothing changed, when too few device blocks
  // (or no state slot) are available. Tables shrink only by Truncate.
  absl::Status Reserve(int64_t seq, int64_t tokens);
  // Empty for an unknown sequence.
  const std::vector<int32_t>& Table(int64_t seq) const;
  int32_t HostBlocksOf(int64_t seq) const;
  int32_t DeviceBlocksOf(int64_t seq) const;
  // Returns all blocks of `seq` (cached ones stay cached) and its state
  // slot; unknown sequences are ignored.
  void Free(int64_t seq);
  // Returns the blocks of `seq` past those that hold `tokens` tokens
  // (speculative decoding's rejected drafts filled them), newest first.
  void Truncate(int64_t seq, int64_t tokens);

  // Moves up to `max_blocks` of the device blocks of `seq`, oldest first
  // and never among its last `keep_last` table entries, to the host (each
  // to a host block of its CP rank). Returns how many moved (fewer when the
  // host, or a rank's part of it, fills up).
  int32_t SwapOut(int64_t seq, int32_t max_blocks, int32_t keep_last = 0);
  // Moves up to `max_blocks` host blocks of `seq` to the device (each to a
  // device block of its CP rank), oldest first. Returns how many moved
  // (fewer when the device, or a rank's part of it, fills up).
  int32_t SwapIn(int64_t seq, int32_t max_blocks);

  // For a sequence with no table yet: attaches the longest run of cached
  // full blocks that hold tokens[0, k * block_size) for k * block_size <=
  // max_tokens, copying host-cached ones to the device while it has room
  // and attaching the rest in the host tier. With state slots, only up to
  // the last block of the run with a snapshot, which is copied into a new
  // slot for `seq` (none attached when no device slot is free).
  // Returns the tokens attached (whose KV need not be computed). 0 when
  // prefix caching is off.
  int64_t AttachPrefix(int64_t seq, absl::Span<const int32_t> tokens,
                       int64_t max_tokens);
  // Records the full blocks of `seq` holding tokens[0, computed) (whose KV
  // is computed) in the prefix cache. No-op when prefix caching is off.
  void CacheFullBlocks(int64_t seq, absl::Span<const int32_t> tokens,
                       int64_t computed);
  // Reports every key the prefix cache gains or loses to `events` (not
  // owned; null: none), for readers on other threads.
  void set_event_log(PrefixEventLog* events) { events_ = events; }
  // Forgets every cached block (their contents may be bad after a failed
  // step).
  void DropCache();

  // The copies recorded since the last call, in order; host blocks freed
  // before this call become reusable.
  std::vector<BlockCopy> TakeCopies();
  bool has_copies() const { return !copies_.empty(); }

 private:
  struct Block {
    int32_t refs = 0;
    bool keyed = false;
    uint64_t key = 0;
    uint64_t last_use = 0;        // For LRU among cached blocks.
    std::vector<int32_t> tokens;  // Keyed blocks: their tokens (exact match).
  };
  using Lru = std::set<std::pair<uint64_t, int32_t>>;  // (last_use, block)

  // Any CP rank, for TakeDevice and TakeHost.
  static constexpr int kAnyRank = -1;
  // A block for a sequence (refs = 1) of CP rank `rank` (or any) from the
  // tier's free list or by evicting its least recently used cached block
  // of that rank; -1 when neither.
  int32_t TakeDevice(int rank = kAnyRank);
  int32_t TakeHost(int rank = kAnyRank);
  // A free device block (refs = 1) whose id % interleave_ is `rank`, the
  // most recently freed one; -1 when there is none.
  int32_t TakeFreeDeviceOf(int rank);
  // Removes and returns the last entry of `free` of CP rank `rank` (or
  // any); -1 when none.
  int32_t PopFree(std::vector<int32_t>& free, int rank);
  // The least recently used block of `lru` of CP rank `rank` (or any), or
  // lru.end().
  Lru::iterator OldestOf(Lru& lru, int rank);
  // A host block of CP rank `rank` (or any) with no reference: a free one,
  // else the least recently used cached one if it was used before
  // `used_before` (its contents dropped); -1 when neither.
  int32_t ReclaimHost(int rank, uint64_t used_before);
  // A device block just taken out of the cache: spilled to a host block
  // of its rank (free, or cached and used longer ago) or dropped.
  void EvictDevice(int32_t d);
  // Drops a reference; an unreferenced block goes to its cache or free list.
  void Unref(int32_t b);
  // Removes a cached (unreferenced, keyed) block from its cache.
  void Uncache(int32_t b);
  void Unkey(int32_t b);
  void Rekey(int32_t from, int32_t to);
  Lru& LruOf(int32_t b) { return IsHost(b) ? host_lru_ : device_lru_; }

  int32_t device_blocks_;
  int32_t host_blocks_;
  int32_t block_size_;
  bool prefix_caching_;
  int interleave_ = 1;
  uint64_t tick_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> device_free_;  // LIFO: recently freed blocks are warm.
  std::vector<int32_t> host_free_;
  std::vector<int32_t> host_held_;  // Freed host blocks until TakeCopies.
  Lru device_lru_, host_lru_;
  absl::flat_hash_map<uint64_t, int32_t> by_key_;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> tables_;
  int32_t state_slots_ = 0, host_state_slots_ = 0, snapshot_slots_ = 0;
  // Snapshots by the prefix key of the block they end, and their LRU.
  struct Snapshot {
    int32_t slot;
    uint64_t last_use;
  };
  absl::flat_hash_map<uint64_t, Snapshot> snapshots_;
  std::vector<int32_t> free_snapshots_;
  std::vector<int32_t> free_slots_;  // LIFO, like device_free_.
  std::vector<int32_t> free_host_slots_;
  std::vector<BlockCopy> state_copies_;
  absl::flat_hash_map<int64_t, int32_t> slot_of_;
  std::vector<BlockCopy> copies_;
  BlockCounters counters_;
  PrefixEventLog* events_ = nullptr;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_BLOCK_MANAGER_H_
