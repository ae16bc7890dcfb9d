#include "collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/arg_checks.h"
#include "core/status.h"

namespace shardlm {
namespace {

absl::Status CudaError(const std::string& where, cudaError_t e) {
  return absl::InternalError(absl::StrCat(where, ": ", cudaGetErrorName(e),
                                          ": ", cudaGetErrorString(e)));
}

absl::Status NcclError(const std::string& where, ncclResult_t r,
                       ncclComm_t comm) {
  std::string text = absl::StrCat(where, ": ", ncclGetErrorString(r));
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0')
      absl::StrAppend(&text, " (", last, ")");
  }
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(text);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(text);
    default:
      return absl::InternalError(text);
  }
}

// Spins briefly, then sleeps, so that polling threads leave the CPU to
// the ones doing work.
void Backoff(int polls) {
  if (polls < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Polls a non-blocking communicator until its pending call (init, enqueue,
// finalize) settles. Returns ncclInProgress when the deadline passes.
ncclResult_t Settle(ncclComm_t comm, absl::Time deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (absl::Now() > deadline) return ncclInProgress;
    Backoff(polls);
  }
}

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    default:
      return ncclFloat32;
  }
}

}  // namespace

// Owned NCCL and CUDA handles, released on `device`.
struct NcclCommunicator::Impl {
  int device = 0;
  absl::Duration timeout;
  // Guards `comm` between the owner's calls and the watchdog's thread
  // (asynchronous mode), which polls its async error and aborts it.
  std::mutex comm_mu;
  ncclComm_t comm = nullptr;  // Null once aborted.
  cudaStream_t stream = nullptr;
  bool owns_stream = true;   // Else the caller's compute stream.
  float* scratch = nullptr;  // [1] on the device, for Barrier.
  // Events the watchdog is done with (asynchronous mode), for reuse.
  std::mutex events_mu;
  std::vector<cudaEvent_t> free_events;

  // Aborts the communicator unless it is aborted already; any thread.
  void Abort() {
    std::lock_guard<std::mutex> lock(comm_mu);
    if (comm == nullptr) return;
    cudaSetDevice(device);
    ncclCommAbort(comm);
    comm = nullptr;
  }

  // An event of `device` (the caller's current device).
  absl::StatusOr<cudaEvent_t> TakeEvent() {
    {
      std::lock_guard<std::mutex> lock(events_mu);
      if (!free_events.empty()) {
        cudaEvent_t e = free_events.back();
        free_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess) return CudaError("cudaEventCreateWithFlags", r);
    return e;
  }
  void GiveEvent(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(events_mu);
    free_events.push_back(e);
  }

  ~Impl() {
    cudaSetDevice(device);
    if (comm != nullptr) {
      // Flush, bounded by the timeout; abort if the peers never settle.
      ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        r = Settle(comm, absl::Now() + timeout);
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    for (cudaEvent_t e : free_events) cudaEventDestroy(e);
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr && owns_stream) cudaStreamDestroy(stream);
  }
};

bool NcclAsyncRequested() {
  const char* v = std::getenv("SHARDLM_NCCL_ASYNC");
  return v != nullptr && std::string_view(v) == "1";
}

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

NcclCommunicator::NcclCommunicator(const NcclConfig& config,
                                   std::unique_ptr<Impl> impl)
    : name_(config.name),
      options_(config.options),
      rank_(config.rank),
      size_(config.size),
      device_(config.device),
      impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  if (watchdog_ != nullptr) {
    // The watched work finishes or meets its deadline (and the abort)
    // before the watchdog goes, and with it every event back to the pool.
    watchdog_->Wait().IgnoreError();  // Nobody to tell.
    watchdog_.reset();
  }
}

void NcclCommunicator::set_timeout(absl::Duration timeout) {
  options_.timeout = timeout;
  impl_->timeout = timeout;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclConfig& config) {
  const std::string& name = config.name;
  ncclUniqueId id;
  if (config.unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": NCCL unique id has ", config.unique_id.size(),
                     " bytes, not ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, config.unique_id.data(), sizeof(id.internal));
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": rank ", config.rank, " of a group of ", config.size));
  }
  const std::string where =
      absl::StrCat(name, ": rank ", config.rank, " on device ", config.device);
  auto impl = std::make_unique<Impl>();
  impl->device = config.device;
  impl->timeout = config.options.timeout;
  cudaError_t e = cudaSetDevice(config.device);
  if (e != cudaSuccess) return CudaError(where, e);
  if (config.stream != nullptr) {
    impl->stream = static_cast<cudaStream_t>(config.stream);
    impl->owns_stream = false;
  } else {
    e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaError(where, e);
  }
  e = cudaMalloc(&impl->scratch, sizeof(float));
  if (e != cudaSuccess) return CudaError(where, e);
  // Barrier sums this float: make it a number rather than whatever was there.
  e = cudaMemset(impl->scratch, 0, sizeof(float));
  if (e != cudaSuccess) return CudaError(where, e);

  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 0;  // Init and enqueues return ncclInProgress.
  const absl::Time deadline = absl::Now() + config.options.timeout;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, config.size, id,
                                          config.rank, &nccl_config);
  if (r == ncclSuccess || r == ncclInProgress) r = Settle(impl->comm, deadline);
  if (r == ncclInProgress) {
    ncclCommAbort(impl->comm);
    impl->comm = nullptr;
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": NCCL init timed out after ",
        absl::FormatDuration(config.options.timeout), " waiting for the other ",
        config.size - 1, " ranks of the group"));
  }
  if (r != ncclSuccess) {
    absl::Status s =
        NcclError(absl::StrCat(where, ": NCCL init"), r, impl->comm);
    if (impl->comm != nullptr) ncclCommAbort(impl->comm);
    impl->comm = nullptr;
    return s;
  }
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(config, std::move(impl)));
  if (config.asynchronous) {
    Impl* owned = comm->impl_.get();
    comm->watchdog_ = std::make_unique<CollectiveWatchdog>(WatchdogOptions{
        .name = name,
        .interval = config.watchdog_interval,
        .async_error = [owned, where]() -> absl::Status {
          // Skipped while a call holds the communicator (it polls the same
          // error itself) or after the abort.
          std::unique_lock<std::mutex> lock(owned->comm_mu, std::try_to_lock);
          if (!lock.owns_lock() || owned->comm == nullptr) return {};
          ncclResult_t state = ncclSuccess;
          ncclResult_t r = ncclCommGetAsyncError(owned->comm, &state);
          if (r == ncclSuccess && state != ncclInProgress) r = state;
          if (r == ncclSuccess) return {};
          return NcclError(absl::StrCat(where, ": NCCL async error"), r,
                           owned->comm);
        },
        .abort = [owned](const absl::Status&) { owned->Abort(); }});
  }
  return comm;
}

absl::Status NcclCommunicator::Usable() {
  if (!dead_.ok()) return dead_;
  if (watchdog_ == nullptr) return absl::OkStatus();
  absl::Status failed = watchdog_->status();
  if (failed.ok()) return failed;
  dead_ = absl::UnavailableError(absl::StrCat(
      name_, ": rank ", rank_, " is unusable after an earlier error (",
      failed.message(), ")"));
  return failed;
}

absl::StatusOr<bool> NcclCommunicator::capturing() const {
  cudaStreamCaptureStatus state = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(impl_->stream, &state);
  if (e != cudaSuccess) {
    return CudaError(absl::StrCat(name_, ": cudaStreamIsCapturing"), e);
  }
  return state != cudaStreamCaptureStatusNone;
}

absl::Status NcclCommunicator::WatchStream(std::string what,
                                           absl::Time deadline) {
  ASSIGN_OR_RETURN(const bool in_capture, capturing());
  if (in_capture) return absl::OkStatus();  // The replay is tracked.
  ASSIGN_OR_RETURN(cudaEvent_t event, impl_->TakeEvent());
  const cudaError_t e = cudaEventRecord(event, impl_->stream);
  if (e != cudaSuccess) {
    impl_->GiveEvent(event);
    return CudaError(absl::StrCat(what, ": cudaEventRecord"), e);
  }
  Impl* impl = impl_.get();
  return watchdog_->Watch(
      {.what = std::move(what),
       .deadline = deadline,
       .timeout = options_.timeout,
       .done = [event, device = device_]() -> absl::StatusOr<bool> {
         // The watchdog's thread: on another device's context by default
         // (device 0, whose context it would otherwise create there).
         if (const cudaError_t d = cudaSetDevice(device); d != cudaSuccess) {
           return CudaError("cudaSetDevice", d);
         }
         const cudaError_t q = cudaEventQuery(event);
         if (q == cudaSuccess) return true;
         if (q == cudaErrorNotReady) return false;
         return CudaError("cudaEventQuery", q);
       },
       .release = [impl, event] { impl->GiveEvent(event); }});
}

absl::Status NcclCommunicator::Track(const std::string& what) {
  if (watchdog_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(Usable());
  const cudaError_t e = cudaSetDevice(device_);
  if (e != cudaSuccess) return CudaError(name_, e);
  return WatchStream(absl::StrCat(name_, ": ", what, " on rank ", rank_,
                                  " (device ", device_, ")"),
                     absl::Now() + options_.timeout);
}

absl::Status NcclCommunicator::Synchronize() {
  if (watchdog_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool in_capture, capturing());
  if (in_capture) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": Synchronize while the stream is captured"));
  }
  RETURN_IF_ERROR(Track("the work queued before Synchronize"));
  watchdog_->Wait().IgnoreError();  // Usable() reports it.
  return Usable();
}

template <typename Enqueue>
absl::Status NcclCommunicator::Run(const char* op,
                                   const std::string& waiting_for,
                                   Enqueue enqueue) {
  RETURN_IF_ERROR(Usable());
  const std::string where = absl::StrCat(name_, ": ", op, " on rank ", rank_,
                                         " (device ", device_, ")");
  cudaError_t e = cudaSetDevice(device_);
  if (e != cudaSuccess) return CudaError(where, e);
  const absl::Time deadline = absl::Now() + options_.timeout;
  // Held while this call uses the communicator: the watchdog's abort waits
  // for the enqueue to settle (bounded by the same deadline).
  std::unique_lock<std::mutex> lock(impl_->comm_mu);
  ncclComm_t comm = impl_->comm;
  if (comm == nullptr) {  // The watchdog aborted it since Usable().
    lock.unlock();
    RETURN_IF_ERROR(Usable());
    return absl::UnavailableError(
        absl::StrCat(where, ": the communicator was aborted"));
  }
  auto fail = [&](absl::Status s) {
    // The communicator's state is unknown after an error: abort it.
    lock.unlock();
    impl_->Abort();
    if (watchdog_ != nullptr) watchdog_->Fail(s).IgnoreError();
    dead_ = absl::UnavailableError(absl::StrCat(
        name_, ": rank ", rank_, " is unusable after an earlier error (",
        s.message(), ")"));
    return s;
  };
  auto timed_out = [&] {
    return fail(absl::DeadlineExceededError(absl::StrCat(
        where, " timed out after ", absl::FormatDuration(options_.timeout),
        " waiting for ", waiting_for)));
  };

  ncclResult_t r = enqueue(comm, impl_->stream);
  if (r == ncclInProgress) r = Settle(comm, deadline);
  if (r == ncclInProgress) return timed_out();
  // Even an argument NCCL rejects ends the communicator: on a non-blocking
  // one, its enqueue stores the error as the communicator's async error,
  // which fails every later call. (Our own checks reject the arguments we
  // know of, as InvalidArgument, before NCCL sees them.)
  if (r != ncclSuccess) return fail(NcclError(where, r, comm));

  if (watchdog_ != nullptr) {
    absl::Status watched = WatchStream(
        absl::StrCat(where, ", waiting for ", waiting_for), deadline);
    if (!watched.ok()) return fail(watched);
    return absl::OkStatus();
  }
  for (int polls = 0;; ++polls) {
    e = cudaStreamQuery(impl_->stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return fail(CudaError(where, e));
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &state);
    if (r == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      r = state;
    }
    if (r != ncclSuccess) return fail(NcclError(where, r, comm));
    if (absl::Now() > deadline) return timed_out();
    Backoff(polls);
  }
}

absl::Status NcclCommunicator::AllReduce(const Tensor& send, Tensor& recv,
                                         ReduceOp op) {
  RETURN_IF_ERROR(CheckAllReduceArgs(name_, Reach::kDevice, send, recv));
  RETURN_IF_ERROR(CheckReducible(name_, send.dtype(), /*allow_half=*/true));
  const ncclRedOp_t nccl_op = op == ReduceOp::kSum ? ncclSum : ncclMax;
  return Run("AllReduce", "the other ranks of the group",
             [&](ncclComm_t comm, cudaStream_t stream) {
               return ncclAllReduce(send.raw(), recv.raw(), send.numel(),
                                    NcclType(send.dtype()), nccl_op, comm,
                                    stream);
             });
}

absl::Status NcclCommunicator::AllGather(const Tensor& send, Tensor& recv) {
  RETURN_IF_ERROR(CheckAllGatherArgs(name_, Reach::kDevice, size_, send, recv));
  // NCCL handles in place only as send == this rank's slice of recv.
  const char* s = static_cast<const char*>(send.raw());
  const char* r = static_cast<const char*>(recv.raw());
  const bool overlap = s < r + recv.bytes() && r < s + send.bytes();
  if (overlap && s != r + rank_ * send.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": AllGather: send overlaps recv other than as rank ", rank_,
        "'s slice"));
  }
  return Run("AllGather", "the other ranks of the group",
             [&](ncclComm_t comm, cudaStream_t stream) {
               return ncclAllGather(send.raw(), recv.raw(), send.bytes(),
                                    ncclUint8, comm, stream);
             });
}

absl::Status NcclCommunicator::Broadcast(Tensor& data, int root) {
  RETURN_IF_ERROR(CheckBroadcastArgs(name_, Reach::kDevice, size_, data, root));
  return Run("Broadcast", absl::StrCat("root ", root, " and the group"),
             [&](ncclComm_t comm, cudaStream_t stream) {
               return ncclBroadcast(data.raw(), data.raw(), data.bytes(),
                                    ncclUint8, root, comm, stream);
             });
}

absl::Status NcclCommunicator::Send(const Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kDevice, "Send", rank_, size_, data, peer));
  return Run("Send", absl::StrCat("rank ", peer),
             [&](ncclComm_t comm, cudaStream_t stream) {
               // Point-to-point calls go in a group (NCCL's rule for
               // send/recv, so that paired calls cannot deadlock).
               ncclResult_t r = ncclGroupStart();
               if (r != ncclSuccess) return r;
               r = ncclSend(data.raw(), data.bytes(), ncclUint8, peer, comm,
                            stream);
               const ncclResult_t end = ncclGroupEnd();
               return r != ncclSuccess ? r : end;
             });
}

absl::Status NcclCommunicator::Recv(Tensor& data, int peer) {
  RETURN_IF_ERROR(
      CheckPeerArgs(name_, Reach::kDevice, "Recv", rank_, size_, data, peer));
  return Run("Recv", absl::StrCat("rank ", peer),
             [&](ncclComm_t comm, cudaStream_t stream) {
               // Point-to-point calls go in a group (NCCL's rule for
               // send/recv, so that paired calls cannot deadlock).
               ncclResult_t r = ncclGroupStart();
               if (r != ncclSuccess) return r;
               r = ncclRecv(data.raw(), data.bytes(), ncclUint8, peer, comm,
                            stream);
               const ncclResult_t end = ncclGroupEnd();
               return r != ncclSuccess ? r : end;
             });
}

absl::Status NcclCommunicator::Barrier() {
  RETURN_IF_ERROR(Run("Barrier", "the other ranks of the group",
                      [&](ncclComm_t comm, cudaStream_t stream) {
                        return ncclAllReduce(impl_->scratch, impl_->scratch, 1,
                                             ncclFloat32, ncclSum, comm,
                                             stream);
                      }));
  return Synchronize();
}

}  // namespace shardlm
