#include "worker/control_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "shardlm/v1/control.grpc.pb.h"
#include "step/control_channel.h"

namespace shardlm {

struct ControlPlaneStore::Stub {
  std::unique_ptr<v1::Control::Stub> stub;
};

namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

ControlPlaneStore::ControlPlaneStore(std::shared_ptr<grpc::Channel> channel,
                                     std::string coordinator,
                                     std::string cluster_token)
    : stub_(new Stub{v1::Control::NewStub(std::move(channel))}),
      coordinator_(std::move(coordinator)),
      token_(std::move(cluster_token)) {}

ControlPlaneStore::~ControlPlaneStore() = default;

absl::Status ControlPlaneStore::Set(const std::string& key,
                                    const std::string& value) {
  v1::StoreSetRequest request;
  request.set_cluster_token(token_);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  grpc::ClientContext context;
  context.AddMetadata(kClusterTokenMetadata, token_);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  const grpc::Status s = stub_->stub->StoreSet(&context, request, &response);
  if (!s.ok()) {
    return FromGrpc(s, absl::StrCat("publishing '", key,
                                    "' at the coordinator ", coordinator_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ControlPlaneStore::Get(const std::string& key,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration wait = std::clamp(
        deadline - absl::Now(), absl::ZeroDuration(), absl::Seconds(10));
    v1::StoreGetRequest request;
    request.set_cluster_token(token_);
    request.set_key(key);
    request.set_wait_ms(absl::ToInt64Milliseconds(wait));
    v1::StoreGetResponse response;
    grpc::ClientContext context;
    context.AddMetadata(kClusterTokenMetadata, token_);
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
    const grpc::Status s = stub_->stub->StoreGet(&context, request, &response);
    if (s.ok()) return std::string(response.value());
    if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
      return FromGrpc(s, absl::StrCat("reading '", key, "' at the coordinator ",
                                      coordinator_));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' was not set within ",
                       absl::FormatDuration(timeout), " (the coordinator ",
                       coordinator_, " has not heard from that rank)"));
    }
  }
}

}  // namespace shardlm
