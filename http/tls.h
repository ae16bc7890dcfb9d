// TLS for the public APIs (gRPC and HTTP): the server's certificate and
// key, and for mutual TLS the CA that client certificates must chain to.
#ifndef SHARDLM_HTTP_TLS_H_
#define SHARDLM_HTTP_TLS_H_

#include <string>

#include "absl/status/statusor.h"

// OpenSSL's SSL_CTX, without its headers.
typedef struct ssl_ctx_st SSL_CTX;

namespace shardlm {

// PEM texts; all empty: plaintext.
struct TlsConfig {
  std::string cert_chain_pem;  // The server's certificate (and chain).
  std::string private_key_pem;
  // Not empty: mutual TLS, clients must present a certificate this CA
  // signed.
  std::string client_ca_pem;

  bool enabled() const { return !cert_chain_pem.empty(); }
};

// The contents of a PEM file (at most 1 MiB), or NotFound /
// InvalidArgument naming `what` ("--tls-cert") and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what);

// Whether the first certificate of `cert_pem` and `key_pem` parse and
// belong together; InvalidArgument naming `cert_what` or `key_what` (the
// flag and file) otherwise.
absl::Status CheckKeyPair(const std::string& cert_pem,
                          const std::string& key_pem,
                          const std::string& cert_what,
                          const std::string& key_what);

// Whether `pem` holds one or more certificates (a CA bundle) that all
// parse; InvalidArgument naming `what` otherwise.
absl::Status CheckCertificates(const std::string& pem, const std::string& what);

// From --tls-cert, --tls-key and --tls-client-ca: all empty gives a
// plaintext config; a key without a certificate (or the other way round),
// or a client CA without both, is InvalidArgument. Whether the key matches
// the certificate is checked when a server starts with it.
absl::StatusOr<TlsConfig> LoadTlsConfig(const std::string& cert_file,
                                        const std::string& key_file,
                                        const std::string& client_ca_file);

// A server context for `tls` (enabled()): TLS 1.2 and later, its
// certificate chain and key (which must match), and with a client CA,
// peers must present a certificate it signed. Partial writes and moving
// write buffers are allowed (for non-blocking sockets). The caller owns the
// context (SSL_CTX_free). InvalidArgument naming the flag when a PEM text
// does not load.
absl::StatusOr<SSL_CTX*> NewServerTlsContext(const TlsConfig& tls);

}  // namespace shardlm

#endif  // SHARDLM_HTTP_TLS_H_
