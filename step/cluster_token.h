// Where a cluster's workers carry its token (the coordinator's control
// plane checks it; front ends that start clusters set it).
#ifndef SHARDLM_STEP_CLUSTER_TOKEN_H_
#define SHARDLM_STEP_CLUSTER_TOKEN_H_

namespace shardlm {

// The gRPC metadata key of the cluster token, sent by workers on every
// control-plane call. The coordinator checks it when the call arrives,
// before it reads any message of the call, so that a peer without the
// token never gets a message buffered or parsed. A binary ("-bin") key:
// gRPC base64-encodes it on the wire, so any token bytes are allowed.
inline constexpr char kClusterTokenMetadata[] = "shardlm-cluster-token-bin";

}  // namespace shardlm

#endif  // SHARDLM_STEP_CLUSTER_TOKEN_H_
