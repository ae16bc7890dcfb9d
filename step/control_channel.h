// The control plane's transport, shared by its two ends (the coordinator's
// ControlService and the workers' agent and rendezvous store): where the
// cluster token travels, and optional mutual TLS (DESIGN.md section 6a).
#ifndef SHARDLM_STEP_CONTROL_CHANNEL_H_
#define SHARDLM_STEP_CONTROL_CHANNEL_H_

#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "step/cluster_token.h"

namespace shardlm {

// Mutual TLS on the control plane, as PEM texts; all empty: plaintext.
// The coordinator presents `cert_chain_pem` as the server and requires
// every worker to present a certificate that `ca_pem` signed; a worker
// presents its own and requires the coordinator's to chain to `ca_pem`.
struct ControlTls {
  std::string ca_pem;          // The cluster CA (one or more certificates).
  std::string cert_chain_pem;  // This end's certificate (and chain).
  std::string private_key_pem;
  // Workers: the name (DNS or IP subject alternative name) the
  // coordinator's certificate must carry; empty: the host part of the
  // address dialed.
  std::string server_name;

  bool enabled() const { return !cert_chain_pem.empty(); }
};

// A channel to the coordinator at `address` (host:port) with `args`:
// TLS with this worker's certificate when tls.enabled(), else plaintext.
std::shared_ptr<grpc::Channel> NewControlChannel(const std::string& address,
                                                 const ControlTls& tls,
                                                 grpc::ChannelArguments args);

// Why a channel to `address` never became ready although a plain TCP
// connection to it succeeds (tried here, within a second): the handshake
// failed, e.g. TLS on one end only or a certificate the other end does not
// trust. A clause for an error message; "" when TCP does not connect
// either (then the coordinator is not there yet).
std::string ControlHandshakeHint(const std::string& address,
                                 const ControlTls& tls);

// The coordinator's listening credentials: TLS requiring (and verifying
// against tls.ca_pem) a client certificate when tls.enabled(), else
// plaintext.
std::shared_ptr<grpc::ServerCredentials> ControlServerCredentials(
    const ControlTls& tls);

}  // namespace shardlm

#endif  // SHARDLM_STEP_CONTROL_CHANNEL_H_
