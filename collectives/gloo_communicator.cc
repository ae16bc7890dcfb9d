#include "collectives/gloo_communicator.h"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/arg_checks.h"
#include "collectives/reduce.h"
#include "core/status.h"
#include "gloo/allgather.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace shardlm {
namespace {

// The slot of every Send/Recv; Gloo's collectives use slots with a nonzero
// prefix in the top byte, so they never match it.
constexpr uint64_t kPointToPointSlot = 7301;

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's view of a RendezvousStore, under a prefix. Gloo expects failures
// as exceptions.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore& store, std::string prefix,
               absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s =
        store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_.Get(prefix_ + key, timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, Millis(timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      absl::StatusOr<std::string> v =
          store_.Get(prefix_ + key, absl::Milliseconds(timeout.count()));
      if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    }
  }

 private:
  RendezvousStore& store_;
  std::string prefix_;
  absl::Duration timeout_;
};

// Gloo's TCP pairs write with writev, which raises SIGPIPE when the peer
// has gone; its default action kills the process before Gloo can report the
// broken connection. A dead peer must be an error naming it, so SIGPIPE is
// ignored process-wide (unless the program installed a handler of its own;
// our sockets elsewhere send with MSG_NOSIGNAL, so nothing relies on it).
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current = {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace

absl::StatusOr<std::shared_ptr<GlooTransport>> GlooTransport::Create(
    const std::string& host, const std::string& interface) {
  IgnoreSigpipeOnce();
  gloo::transport::tcp::attr attr;
  if (!interface.empty()) {
    attr.iface = interface;
  } else {
    attr.hostname = host;
  }
  try {
    return std::shared_ptr<GlooTransport>(
        new GlooTransport(gloo::transport::tcp::CreateDevice(attr)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for peers on ",
        interface.empty() ? host : absl::StrCat("interface ", interface), ": ",
        e.what()));
  }
}

std::string GlooTransport::description() const { return device_->str(); }

GlooCommunicator::GlooCommunicator(std::string name, int rank, int size,
                                   CommOptions options,
                                   std::vector<std::string> labels)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      options_(options),
      labels_(std::move(labels)) {
  if (labels_.size() != static_cast<size_t>(size_)) {
    labels_.clear();
    for (int r = 0; r < size_; ++r) labels_.push_back(absl::StrCat("rank ", r));
  }
}

GlooCommunicator::~GlooCommunicator() = default;

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    RendezvousStore& store, const std::string& key_prefix,
    std::shared_ptr<GlooTransport> transport, std::string name, int rank,
    int size, CommOptions options, std::vector<std::string> labels) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": rank ", rank, " of ", size));
  }
  if (transport == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no transport"));
  }
  std::unique_ptr<GlooCommunicator> c(new GlooCommunicator(
      std::move(name), rank, size, options, std::move(labels)));
  c->transport_ = std::move(transport);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(Millis(options.timeout));
  StoreAdapter adapter(store, absl::StrCat(key_prefix, "/", c->name_, "/"),
                       options.timeout);
  RETURN_IF_ERROR(c->Guard("connecting", c->Others(), [&] {
    context->connectFullMesh(adapter, c->transport_->device_);
  }));
  c->context_ = std::move(context);
  return c;
}

std::string GlooCommunicator::Others() const {
  std::vector<std::string> others;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back(labels_[r]);
  }
  return others.empty() ? "nobody" : absl::StrJoin(others, ", ");
}

template <typename F>
absl::Status GlooCommunicator::Guard(const char* what,
                                     const std::string& waiting_for, F op) {
  RETURN_IF_ERROR(dead_);
  std::string error;
  try {
    op();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Gloo's messages start with the source location: keep the reason.
  if (size_t at = error.find("] "); at != std::string::npos) {
    error = error.substr(at + 2);
  }
  const bool timed_out = absl::StrContains(error, "Timed out") ||
                         absl::StrContains(error, "timed out") ||
                         absl::StrContains(error, "not set within");
  const std::string message =
      timed_out
          ? absl::StrCat(name_, ": ", what, " on ", labels_[rank_],
                         " timed out after ",
                         absl::FormatDuration(options_.timeout),
                         " waiting for ", waiting_for, " (", error, ")")
          : absl::StrCat(name_, ": ", what, " on ", labels_[rank_],
                         " failed waiting for ", waiting_for, ": ", error);
  dead_ = absl::UnavailableError(
      absl::StrCat(name_, ": ", labels_[rank_],
                   " is unusable after an earlier error (", message, ")"));
  return timed_out ? absl::DeadlineExceededError(message)
                   : absl::UnavailableError(message);
}

absl::Status GlooCommunicator::AllReduce(const Tensor& send, Tensor& recv,
                                         ReduceOp op) {
  RETURN_IF_ERROR(CheckAllReduceArgs(name_, Reach::kHost, send, recv));
  RETURN_IF_ERROR(CheckReducible(name_, send.dtype(), /*allow_half=*/false));
  RETURN_IF_ERROR(dead_);
  // Gather every input, then reduce in rank order (see the header).
  const size_t bytes = send.bytes();
  gathered_.resize(bytes * size_);
  std::memcpy(gathered_.data() + bytes * rank_, send.raw(), bytes);
  if (size_ > 1) {
    RETURN_IF_ERROR(
        Guard("AllReduce", absl::StrCat("the group (", Others(), ")"), [&] {
          gloo::AllgatherOptions opts(context_);
          opts.setOutput(gathered_.data(), gathered_.size());
          opts.setTimeout(Millis(options_.timeout));
          gloo::allgather(opts);
        }));
  }
  ReduceInRankOrder(gathered_.data(), size_, send.dtype(), send.numel(), op,
                    recv.raw());
  bytes_sent_.all_reduce += ToPeers(bytes);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const Tensor& send, Tensor& recv) {
  RETURN_IF_ERROR(CheckAllGatherArgs(name_, Reach::kHost, size_, send, recv));
  RETURN_IF_ERROR(dead_);
  // In place: this rank's slice of `recv` holds its input (memmove, since
  // `send` may be that slice), and Gloo fills the rest.
  char* out = static_cast<char*>(recv.raw());
  std::memmove(out + send.bytes() * rank_, send.raw(), send.bytes());
  if (size_ == 1) return absl::OkStatus();
  RETURN_IF_ERROR(
      Guard("AllGather", absl::StrCat("the group (", Others(), ")"), [&] {
        gloo::AllgatherOptions opts(context_);
        opts.setOutput(out, recv.bytes());
        opts.setTimeout(Millis(options_.timeout));
        gloo::allgather(opts);
      }));
  bytes_sent_.all_gather += ToPeers(send.bytes());
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(Tensor& data, int root) {
  RETURN_IF_ERROR(CheckBroadcastArgs(name_, Reach::kHost, size_, data, root));
  RETURN_IF_ERROR(dead_);
  if (size_ == 1) return absl::OkStatus();
  RETURN_IF_ERROR(Guard(
      "Broadcast",
      absl::StrCat(labels_[root], " and the group (", Others(), ")"), [&] {
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(static_cast<char*>(data.raw()), data.bytes());
        opts.setRoot(root);
        opts.setTimeout(Millis(options_.timeout));
        gloo::broadcast(opts);
      }));
  if (rank_ == root) bytes_sent_.broadcast += ToPeers(data.bytes());
  return absl::OkStatus();
}

// Every message is preceded by its byte count (8 bytes): Gloo aborts the
// process when a message is longer than the receiving buffer and silently
// fills only part of a longer one, so the receiver checks the size first.
absl::Status GlooCommunicator::Send(const Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kHost, "Send", rank_, size_, data, peer));
  RETURN_IF_ERROR(dead_);
  uint64_t bytes = data.bytes();
  RETURN_IF_ERROR(Guard("Send", labels_[peer], [&] {
    auto header = context_->createUnboundBuffer(&bytes, sizeof(bytes));
    auto buffer = context_->createUnboundBuffer(data.raw(), data.bytes());
    header->send(peer, kPointToPointSlot);
    buffer->send(peer, kPointToPointSlot);
    header->waitSend(Millis(options_.timeout));
    buffer->waitSend(Millis(options_.timeout));
  }));
  bytes_sent_.send += static_cast<int64_t>(data.bytes());
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Recv(Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kHost, "Recv", rank_, size_, data, peer));
  RETURN_IF_ERROR(dead_);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(Guard("Recv", labels_[peer], [&] {
    auto header = context_->createUnboundBuffer(&bytes, sizeof(bytes));
    header->recv(peer, kPointToPointSlot);
    header->waitRecv(Millis(options_.timeout));
  }));
  if (bytes == data.bytes()) {
    return Guard("Recv", labels_[peer], [&] {
      auto buffer = context_->createUnboundBuffer(data.raw(), data.bytes());
      buffer->recv(peer, kPointToPointSlot);
      buffer->waitRecv(Millis(options_.timeout));
    });
  }
  // Take the message anyway (so that the next one lines up), then refuse.
  std::vector<char> discard(bytes);
  RETURN_IF_ERROR(Guard("Recv", labels_[peer], [&] {
    auto buffer = context_->createUnboundBuffer(discard.data(), bytes);
    buffer->recv(peer, kPointToPointSlot);
    buffer->waitRecv(Millis(options_.timeout));
  }));
  return absl::InvalidArgumentError(
      absl::StrCat(name_, ": ", labels_[peer], " sent ", bytes, " bytes but ",
                   labels_[rank_], " receives into ", data.DebugString(), " (",
                   data.bytes(), " bytes)"));
}

absl::Status GlooCommunicator::Barrier() {
  RETURN_IF_ERROR(dead_);
  if (size_ == 1) return absl::OkStatus();
  return Guard("Barrier", absl::StrCat("the group (", Others(), ")"), [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(Millis(options_.timeout));
    gloo::barrier(opts);
  });
}

}  // namespace shardlm
