#include "collectives/staged_communicator.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what) {
  // This thread's own stream, waited for: the data is in place on return.
  cudaError_t e =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("staging ", what, ": ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

bool OnDevice(const Tensor& t) { return t.memory() == MemoryType::kDevice; }

// A host tensor of t's dtype and shape, holding t's data when `fill`.
absl::StatusOr<Tensor> Stage(const Tensor& t, bool fill) {
  ASSIGN_OR_RETURN(Tensor h, Tensor::HostUninitialized(t.dtype(), t.shape()));
  if (fill) RETURN_IF_ERROR(Copy(h.raw(), t.raw(), t.bytes(), "to the host"));
  return h;
}

class StagedCommunicator : public Communicator {
 public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host)
      : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  absl::Status AllReduce(const Tensor& send, Tensor& recv,
                         ReduceOp op) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return host_->AllReduce(send, recv, op);
    }
    ASSIGN_OR_RETURN(Tensor s, Stage(send, true));
    ASSIGN_OR_RETURN(Tensor r, Stage(recv, false));
    RETURN_IF_ERROR(host_->AllReduce(s, r, op));
    return Back(r, recv);
  }
  absl::Status AllGather(const Tensor& send, Tensor& recv) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return host_->AllGather(send, recv);
    }
    ASSIGN_OR_RETURN(Tensor s, Stage(send, true));
    ASSIGN_OR_RETURN(Tensor r, Stage(recv, false));
    RETURN_IF_ERROR(host_->AllGather(s, r));
    return Back(r, recv);
  }
  absl::Status Broadcast(Tensor& data, int root) override {
    if (!OnDevice(data)) return host_->Broadcast(data, root);
    ASSIGN_OR_RETURN(Tensor d, Stage(data, true));
    RETURN_IF_ERROR(host_->Broadcast(d, root));
    return Back(d, data);
  }
  absl::Status Send(const Tensor& data, int peer) override {
    if (!OnDevice(data)) return host_->Send(data, peer);
    ASSIGN_OR_RETURN(Tensor d, Stage(data, true));
    return host_->Send(d, peer);
  }
  absl::Status Recv(Tensor& data, int peer) override {
    if (!OnDevice(data)) return host_->Recv(data, peer);
    ASSIGN_OR_RETURN(Tensor d, Stage(data, false));
    RETURN_IF_ERROR(host_->Recv(d, peer));
    return Back(d, data);
  }
  absl::Status Barrier() override { return host_->Barrier(); }

 private:
  static absl::Status Back(const Tensor& host, Tensor& t) {
    if (!OnDevice(t)) return absl::OkStatus();
    return Copy(t.raw(), host.raw(), t.bytes(), "back to the device");
  }

  std::unique_ptr<Communicator> host_;
};

}  // namespace

std::unique_ptr<Communicator> StageThroughHost(
    std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedCommunicator>(std::move(host));
}

}  // namespace shardlm
