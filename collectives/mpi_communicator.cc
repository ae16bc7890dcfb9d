#include "collectives/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "collectives/arg_checks.h"
#include "collectives/reduce.h"
#include "core/status.h"

namespace shardlm {
namespace {

constexpr int kTag = 7301;  // Point-to-point tag of every Send/Recv.

std::string ErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    return absl::StrCat("MPI error ", code);
  }
  return std::string(text, len);
}

// Requests abandoned on timeout, with the buffers MPI may still touch.
// Never freed: MPI forbids freeing a pending collective request, and the
// buffers must outlive it.
struct Abandoned {
  std::mutex mu;
  std::vector<std::pair<MPI_Request, std::shared_ptr<std::vector<char>>>>
      requests;
};
Abandoned& AbandonedRequests() {
  static Abandoned* abandoned = new Abandoned;
  return *abandoned;
}

absl::Status CheckCount(const std::string& group, const char* op,
                        size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": ", op, " of ", bytes,
                     " bytes is over MPI's int count limit"));
  }
  return absl::OkStatus();
}

std::shared_ptr<std::vector<char>> NewBuffer(size_t bytes) {
  return std::make_shared<std::vector<char>>(bytes);
}

}  // namespace

absl::Status EnsureMpiInitialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return absl::OkStatus();
  // Open MPI moves a TCP message's queued fragments only while its process
  // calls MPI. A worker goes idle (waiting for the coordinator's next plan)
  // as soon as its sends complete locally, so without a progress thread a
  // peer on another host can wait forever for the rest of an activation
  // (seen as a hang of TP=2 x PP=2 across hosts, tests/multinode). Ask for
  // the TCP transport's progress thread unless the user chose otherwise;
  // shared memory (one host) ignores it.
  setenv("OMPI_MCA_btl_tcp_progress_thread", "1", /*overwrite=*/0);
  int provided = 0;
  const int rc =
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("MPI_Init_thread failed: ", ErrorString(rc)));
  }
  return absl::OkStatus();
}

absl::Status FinalizeMpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return absl::OkStatus();
  const int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("MPI_Finalize failed: ", ErrorString(rc)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MpiRuntime>> MpiRuntime::Start() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  RETURN_IF_ERROR(EnsureMpiInitialized());
  int level = 0;
  MPI_Query_thread(&level);
  return std::unique_ptr<MpiRuntime>(new MpiRuntime(!initialized, level));
}

MpiRuntime::~MpiRuntime() {
  if (owns_) FinalizeMpi().IgnoreError();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 CommOptions options)
    : comm_(comm), name_(std::move(name)), options_(options) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing is deferred by MPI until abandoned requests on it complete.
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Wrap(
    MPI_Comm comm, std::string name, CommOptions options) {
  std::unique_ptr<MpiCommunicator> c(
      new MpiCommunicator(comm, std::move(name), options));
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &c->rank_);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &c->size_);
  if (rc != MPI_SUCCESS) return c->MpiError(rc, "setting up the communicator");
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(c->size_);
  for (int r = 0; r < c->size_; ++r) ranks[r] = r;
  c->world_ranks_.resize(c->size_);
  rc = MPI_Group_translate_ranks(group, c->size_, ranks.data(), world,
                                 c->world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) return c->MpiError(rc, "translating ranks");
  return c;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World(
    CommOptions options) {
  RETURN_IF_ERROR(EnsureMpiInitialized());
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm comm;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("world: MPI_Comm_dup failed: ", ErrorString(rc)));
  }
  return Wrap(comm, "world", options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Split(
    int color, int key, std::string name) {
  RETURN_IF_ERROR(Usable());
  if (color < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": Split color ", color, " must be >= 0"));
  }
  MPI_Comm comm;
  const int rc = MPI_Comm_split(comm_, color, key, &comm);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_split");
  return Wrap(comm, std::move(name), options_);
}

absl::Status MpiCommunicator::Usable() const { return dead_; }

absl::Status MpiCommunicator::MpiError(int code, const char* what) const {
  return absl::InternalError(absl::StrCat(name_, ": rank ", rank_, ": ", what,
                                          ": ", ErrorString(code)));
}

std::string MpiCommunicator::MembersString() const {
  return absl::StrCat("world ranks ", absl::StrJoin(world_ranks_, ", "));
}

absl::Status MpiCommunicator::Wait(MPI_Request& request, const char* op,
                                   const std::string& waiting_for, Buffer keep,
                                   MPI_Status* status) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc =
        MPI_Test(&request, &done, status ? status : MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      int error_class = 0;
      MPI_Error_class(rc, &error_class);
      if (error_class == MPI_ERR_TRUNCATE) {  // Only a Recv can truncate.
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": ", op, " on rank ", rank_, ": ", waiting_for,
                         " sent more bytes than the buffer"));
      }
      return MpiError(rc, op);
    }
    if (done) return absl::OkStatus();
    if (absl::Now() > deadline) break;
    // Spin briefly for low latency, then sleep so that oversubscribed
    // ranks sharing a core can make progress.
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  {
    Abandoned& a = AbandonedRequests();
    std::lock_guard lock(a.mu);
    a.requests.emplace_back(request, std::move(keep));
  }
  const std::string what = absl::StrCat(
      name_, ": ", op, " on rank ", rank_, " (world rank ", world_ranks_[rank_],
      ") timed out after ", absl::FormatDuration(options_.timeout),
      " waiting for ", waiting_for);
  dead_ = absl::UnavailableError(
      absl::StrCat(name_, ": rank ", rank_,
                   " is unusable after an earlier timeout (", what, ")"));
  return absl::DeadlineExceededError(what);
}

absl::Status MpiCommunicator::AllReduce(const Tensor& send, Tensor& recv,
                                        ReduceOp op) {
  RETURN_IF_ERROR(CheckAllReduceArgs(name_, Reach::kHost, send, recv));
  RETURN_IF_ERROR(CheckReducible(name_, send.dtype(), /*allow_half=*/false));
  RETURN_IF_ERROR(CheckCount(name_, "AllReduce", send.bytes()));
  RETURN_IF_ERROR(Usable());
  // Gather every input, then reduce in rank order (see the header).
  const size_t bytes = send.bytes();
  Buffer all = NewBuffer(bytes * size_);
  std::memcpy(all->data() + bytes * rank_, send.raw(), bytes);
  MPI_Request request;
  const int rc =
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all->data(),
                     static_cast<int>(bytes), MPI_BYTE, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Iallgather");
  RETURN_IF_ERROR(Wait(request, "AllReduce",
                       absl::StrCat("the group (", MembersString(), ")"), all));
  ReduceInRankOrder(all->data(), size_, send.dtype(), send.numel(), op,
                    recv.raw());
  bytes_sent_.all_reduce += ToPeers(bytes);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGather(const Tensor& send, Tensor& recv) {
  RETURN_IF_ERROR(CheckAllGatherArgs(name_, Reach::kHost, size_, send, recv));
  RETURN_IF_ERROR(CheckCount(name_, "AllGather", recv.bytes()));
  RETURN_IF_ERROR(Usable());
  const size_t bytes = send.bytes();
  Buffer all = NewBuffer(recv.bytes());
  std::memcpy(all->data() + bytes * rank_, send.raw(), bytes);
  MPI_Request request;
  const int rc =
      MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all->data(),
                     static_cast<int>(bytes), MPI_BYTE, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Iallgather");
  RETURN_IF_ERROR(Wait(request, "AllGather",
                       absl::StrCat("the group (", MembersString(), ")"), all));
  std::memcpy(recv.raw(), all->data(), recv.bytes());
  bytes_sent_.all_gather += ToPeers(bytes);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Broadcast(Tensor& data, int root) {
  RETURN_IF_ERROR(CheckBroadcastArgs(name_, Reach::kHost, size_, data, root));
  RETURN_IF_ERROR(CheckCount(name_, "Broadcast", data.bytes()));
  RETURN_IF_ERROR(Usable());
  Buffer buf = NewBuffer(data.bytes());
  if (rank_ == root) std::memcpy(buf->data(), data.raw(), data.bytes());
  MPI_Request request;
  const int rc = MPI_Ibcast(buf->data(), static_cast<int>(data.bytes()),
                            MPI_BYTE, root, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibcast");
  RETURN_IF_ERROR(Wait(
      request, "Broadcast",
      absl::StrCat("root ", root, " and the group (", MembersString(), ")"),
      buf));
  if (rank_ != root) std::memcpy(data.raw(), buf->data(), data.bytes());
  if (rank_ == root) bytes_sent_.broadcast += ToPeers(data.bytes());
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Send(const Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kHost, "Send", rank_, size_, data, peer));
  RETURN_IF_ERROR(CheckCount(name_, "Send", data.bytes()));
  RETURN_IF_ERROR(Usable());
  Buffer buf = NewBuffer(data.bytes());
  std::memcpy(buf->data(), data.raw(), data.bytes());
  MPI_Request request;
  const int rc = MPI_Isend(buf->data(), static_cast<int>(data.bytes()),
                           MPI_BYTE, peer, kTag, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Isend");
  RETURN_IF_ERROR(Wait(
      request, "Send",
      absl::StrCat("rank ", peer, " (world rank ", world_ranks_[peer], ")"),
      buf));
  bytes_sent_.send += static_cast<int64_t>(data.bytes());
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Recv(Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kHost, "Recv", rank_, size_, data, peer));
  RETURN_IF_ERROR(CheckCount(name_, "Recv", data.bytes()));
  RETURN_IF_ERROR(Usable());
  Buffer buf = NewBuffer(data.bytes());
  MPI_Request request;
  int rc = MPI_Irecv(buf->data(), static_cast<int>(data.bytes()), MPI_BYTE,
                     peer, kTag, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Irecv");
  MPI_Status status;
  absl::Status s = Wait(
      request, "Recv",
      absl::StrCat("rank ", peer, " (world rank ", world_ranks_[peer], ")"),
      buf, &status);
  RETURN_IF_ERROR(s);
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (static_cast<size_t>(count) != data.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": rank ", peer, " sent ", count, " bytes but rank ", rank_,
        " receives into ", data.DebugString(), " (", data.bytes(), " bytes)"));
  }
  std::memcpy(data.raw(), buf->data(), data.bytes());
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Barrier() {
  RETURN_IF_ERROR(Usable());
  MPI_Request request;
  const int rc = MPI_Ibarrier(comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibarrier");
  return Wait(request, "Barrier",
              absl::StrCat("the group (", MembersString(), ")"), nullptr);
}

}  // namespace shardlm
