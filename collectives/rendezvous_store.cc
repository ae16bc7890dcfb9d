#include "collectives/rendezvous_store.h"

#include "absl/strings/str_cat.h"

namespace shardlm {

absl::Status InMemoryStore::Set(const std::string& key,
                                const std::string& value) {
  {
    std::lock_guard lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key,
                                               absl::Duration timeout) {
  std::unique_lock lock(mu_);
  auto it = values_.end();
  const bool found =
      changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
        it = values_.find(key);
        return it != values_.end();
      });
  if (!found) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key '", key, "' was not set within ",
                     absl::FormatDuration(timeout)));
  }
  return it->second;
}

absl::StatusOr<std::string> AgreeOnGroupId(
    RendezvousStore& store, const std::string& key, const std::string& group,
    int rank, const std::function<absl::StatusOr<std::string>()>& make,
    absl::Duration timeout) {
  if (rank == 0) {
    absl::StatusOr<std::string> id = make();
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat(group,
                                       ": rank 0 cannot make the "
                                       "group's id: ",
                                       id.status().message()));
    }
    if (absl::Status s = store.Set(key, *id); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(group, ": publishing '", key,
                                                 "': ", s.message()));
    }
    return id;
  }
  absl::StatusOr<std::string> id = store.Get(key, timeout);
  if (!id.ok()) {
    return absl::Status(
        id.status().code(),
        absl::StrCat(group, ": rank ", rank, " waited for rank 0's id ('", key,
                     "'): ", id.status().message()));
  }
  return id;
}

}  // namespace shardlm
