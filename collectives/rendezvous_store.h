// Key-value rendezvous for ranks that start without a launcher to connect
// them: each rank publishes what its peers need (a listening address, a
// communicator's unique id) and reads theirs. The cluster's store lives on
// the coordinator's control plane (worker/control_store.h); tests and
// ranks on threads use InMemoryStore.
#ifndef SHARDLM_COLLECTIVES_RENDEZVOUS_STORE_H_
#define SHARDLM_COLLECTIVES_RENDEZVOUS_STORE_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardlm {

// Values are small (an address, a 128-byte id). Thread-safe.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set;
  // DeadlineExceeded after that.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
};

// A store in this process (ranks on threads, tests).
class InMemoryStore : public RendezvousStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// The id every member of one communicator group must share (an NCCL unique
// id, which embeds its creator's bootstrap address): rank 0 of the group
// makes it with `make` and publishes it under `key`; the other ranks read
// it, waiting up to `timeout`. Every member calls this with the same key.
// Errors name the group (`group`, e.g. "tp group of stage 1") and the key:
// `make`'s own, or DeadlineExceeded when rank 0 never published.
absl::StatusOr<std::string> AgreeOnGroupId(
    RendezvousStore& store, const std::string& key, const std::string& group,
    int rank, const std::function<absl::StatusOr<std::string>()>& make,
    absl::Duration timeout);

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_RENDEZVOUS_STORE_H_
