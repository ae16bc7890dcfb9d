#include "collectives/arg_checks.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

absl::Status CheckTensor(const std::string& group, Reach reach, const char* op,
                         const char* what, const Tensor& t) {
  if (t.raw() == nullptr && t.bytes() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": ", op, ": ", what, " has no data"));
  }
  if (t.raw() == nullptr && t.numel() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": ", op, ": ", what, " is an empty Tensor"));
  }
  const bool on_device = t.memory() == MemoryType::kDevice;
  if (on_device != (reach == Reach::kDevice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        group, ": ", op, ": ", what, " is in ", on_device ? "device" : "host",
        " memory but this communicator takes ",
        reach == Reach::kDevice ? "device" : "host", " memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAllReduceArgs(const std::string& group, Reach reach,
                                const Tensor& send, const Tensor& recv) {
  RETURN_IF_ERROR(CheckTensor(group, reach, "AllReduce", "send", send));
  RETURN_IF_ERROR(CheckTensor(group, reach, "AllReduce", "recv", recv));
  if (send.dtype() != recv.dtype() || send.numel() != recv.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        group, ": AllReduce: send ", send.DebugString(), " and recv ",
        recv.DebugString(), " must have the same dtype and element count"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherArgs(const std::string& group, Reach reach, int size,
                                const Tensor& send, const Tensor& recv) {
  RETURN_IF_ERROR(CheckTensor(group, reach, "AllGather", "send", send));
  RETURN_IF_ERROR(CheckTensor(group, reach, "AllGather", "recv", recv));
  if (send.dtype() != recv.dtype() || recv.numel() != size * send.numel() ||
      recv.bytes() != size * send.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": AllGather: recv ", recv.DebugString(),
                     " must hold ", size, " x send ", send.DebugString(),
                     " (same dtype, ", size * send.numel(), " elements)"));
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastArgs(const std::string& group, Reach reach, int size,
                                const Tensor& data, int root) {
  RETURN_IF_ERROR(CheckTensor(group, reach, "Broadcast", "data", data));
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": Broadcast: root ", root,
                     " is not a rank of a group of ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckPeerArgs(const std::string& group, Reach reach,
                           const char* op, int rank, int size,
                           const Tensor& data, int peer) {
  RETURN_IF_ERROR(CheckTensor(group, reach, op, "data", data));
  if (peer < 0 || peer >= size || peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": ", op, ": peer ", peer, " of rank ", rank,
                     " must be another rank of a group of ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckReducible(const std::string& group, DType dtype,
                            bool allow_half) {
  if (dtype == DType::kF32 || dtype == DType::kI32 ||
      (allow_half && (dtype == DType::kF16 || dtype == DType::kBF16))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(group, ": AllReduce does not support ", DTypeName(dtype),
                   " (F32, I32", allow_half ? ", F16, BF16" : "", " only)"));
}

}  // namespace shardlm
