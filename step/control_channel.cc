#include "step/control_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace shardlm {
namespace {

// Whether a TCP connection to `address` (host:port, [v6]:port) succeeds
// within `timeout_ms`.
bool TcpConnects(const std::string& address, int timeout_ms) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
    return false;
  }
  bool connected = false;
  for (addrinfo* ai = found; ai != nullptr && !connected; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{.fd = fd, .events = POLLOUT};
      int error = 0;
      socklen_t len = sizeof(error);
      connected = poll(&p, 1, timeout_ms) == 1 &&
                  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
                  error == 0;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return connected;
}

}  // namespace

std::string ControlHandshakeHint(const std::string& address,
                                 const ControlTls& tls) {
  if (!TcpConnects(address, 1000)) return "";
  if (tls.enabled()) {
    return " (its port accepts connections but the TLS handshake fails: "
           "the coordinator needs --control-tls-* too, with a certificate "
           "for that address (or --control-tls-server-name) that this "
           "worker's --control-tls-ca signed, and must trust the CA of this "
           "worker's certificate)";
  }
  return " (its port accepts connections but no gRPC connection comes up: "
         "if its control plane is on TLS, this worker needs "
         "--control-tls-cert, --control-tls-key and --control-tls-ca)";
}

std::shared_ptr<grpc::Channel> NewControlChannel(const std::string& address,
                                                 const ControlTls& tls,
                                                 grpc::ChannelArguments args) {
  if (!tls.enabled()) {
    return grpc::CreateCustomChannel(address,
                                     grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_cert_chain = tls.cert_chain_pem;
  options.pem_private_key = tls.private_key_pem;
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options),
                                   args);
}

std::shared_ptr<grpc::ServerCredentials> ControlServerCredentials(
    const ControlTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back(
      {.private_key = tls.private_key_pem, .cert_chain = tls.cert_chain_pem});
  return grpc::SslServerCredentials(options);
}

}  // namespace shardlm
