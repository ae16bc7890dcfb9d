#include "api/replica_state_service.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "api/api_key.h"

namespace shardlm {
namespace {

// The load part of an update, to tell whether it changed.
bool SameLoad(const v1::ReplicaStateUpdate& a,
              const v1::ReplicaStateUpdate& b) {
  return a.ready() == b.ready() && a.running() == b.running() &&
         a.waiting() == b.waiting() && a.kv_used_blocks() == b.kv_used_blocks();
}

}  // namespace

grpc::Status ReplicaStateService::WatchState(
    grpc::ServerContext* context, const v1::WatchStateRequest* request,
    grpc::ServerWriter<v1::ReplicaStateUpdate>* writer) {
  const std::string& key = inference_->options().api_key;
  if (!key.empty()) {
    const auto& metadata = context->client_metadata();
    const auto it = metadata.find("authorization");
    if (it == metadata.end() ||
        !ApiKeyMatches(absl::string_view(it->second.data(), it->second.size()),
                       key)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong API key (metadata authorization: "
                          "Bearer <key>)");
    }
  }
  if (request->interval_ms() < 0 || request->interval_ms() > 1000 ||
      (request->interval_ms() > 0 && request->interval_ms() < 5) ||
      request->heartbeat_ms() < 0 || request->heartbeat_ms() > 10000 ||
      (request->heartbeat_ms() > 0 && request->heartbeat_ms() < 10)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "interval_ms must be 0 or 5..1000 and heartbeat_ms 0 "
                        "or 10..10000");
  }
  const absl::Duration interval = absl::Milliseconds(
      request->interval_ms() > 0 ? request->interval_ms() : 20);
  const absl::Duration heartbeat = absl::Milliseconds(
      request->heartbeat_ms() > 0 ? request->heartbeat_ms() : 250);
  const BlockManager& blocks = engine_->blocks();

  std::optional<uint64_t> cursor;
  v1::ReplicaStateUpdate last;
  absl::Time last_sent = absl::InfinitePast();
  // Executor health costs a call on remote executors: looked at as often
  // as the API server's own health service would, at most.
  bool healthy = true;
  absl::Time health_at = absl::InfinitePast();
  while (!context->IsCancelled()) {
    const absl::Time now = absl::Now();
    if (now - health_at >= absl::Milliseconds(250)) {
      healthy = engine_->executor().Health().ok();
      health_at = now;
    }
    const SchedulerStats stats = engine_->stats();
    v1::ReplicaStateUpdate u;
    u.set_ready(healthy && !inference_->draining());
    u.set_running(stats.running);
    u.set_waiting(stats.waiting);
    u.set_kv_used_blocks(stats.device.used);
    u.set_kv_total_blocks(blocks.num_blocks());
    u.set_block_size(blocks.block_size());
    u.set_prefix_caching(blocks.prefix_caching());
    u.set_publishes_keys(publish_keys_);

    PrefixEventBatch batch;
    if (publish_keys_) {
      batch = engine_->prefix_events().Since(cursor);
    } else {
      batch.reset = !cursor.has_value();
    }
    cursor = batch.cursor;
    std::vector<uint64_t> inserted, evicted;
    if (batch.reset) {
      inserted = std::move(batch.inserted);
    } else {
      // The last change of each key wins; the two lists are then disjoint.
      absl::flat_hash_map<uint64_t, bool> net;
      for (const auto& [k, in] : batch.changes) net[k] = in;
      for (const auto& [k, in] : net) (in ? inserted : evicted).push_back(k);
    }
    const bool changed = batch.reset || !inserted.empty() || !evicted.empty() ||
                         !SameLoad(u, last);
    if (changed || now - last_sent >= heartbeat) {
      u.set_reset(batch.reset);
      size_t from = 0;
      do {
        const size_t to =
            std::min(inserted.size(), from + size_t{kMaxKeysPerUpdate});
        v1::ReplicaStateUpdate part = u;
        if (from > 0) part.set_reset(false);
        for (size_t i = from; i < to; ++i) part.add_inserted(inserted[i]);
        if (to == inserted.size()) {
          for (uint64_t k : evicted) part.add_evicted(k);
        }
        if (!writer->Write(part)) return grpc::Status::OK;  // Client gone.
        from = to;
      } while (from < inserted.size());
      last = u;
      last_sent = now;
    }
    absl::SleepFor(interval);
  }
  return grpc::Status::OK;
}

}  // namespace shardlm
