#include "launch/control_tls_flags.h"

#include "absl/strings/str_cat.h"
#include "http/tls.h"

namespace shardlm {

void ControlTlsFlags::Register(FlagSet& flags) {
  flags.Add("control-tls-cert", &cert,
            "PEM certificate (chain) this process shows on the control "
            "plane (coordinator <-> workers); with --control-tls-key and "
            "--control-tls-ca the control plane is mutual TLS, and every "
            "process of the cluster needs them");
  flags.Add("control-tls-key", &key, "PEM private key of --control-tls-cert");
  flags.Add("control-tls-ca", &ca,
            "PEM CA of the cluster: the coordinator's and every worker's "
            "certificate must chain to it (the cluster token is still "
            "required)");
}

void ControlTlsFlags::RegisterServerName(FlagSet& flags) {
  flags.Add("control-tls-server-name", &server_name,
            "name (DNS or IP subject alternative name) the coordinator's "
            "control-plane certificate must carry; default: the host "
            "workers dial");
}

absl::Status ControlTlsFlags::Load() {
  loaded = ControlTls();
  if (cert.empty() && key.empty() && ca.empty()) {
    if (!server_name.empty()) {
      return absl::InvalidArgumentError(
          "--control-tls-server-name needs --control-tls-cert, "
          "--control-tls-key and --control-tls-ca");
    }
    return absl::OkStatus();
  }
  if (cert.empty() || key.empty() || ca.empty()) {
    return absl::InvalidArgumentError(
        "--control-tls-cert, --control-tls-key and --control-tls-ca go "
        "together (mutual TLS): give all three or none");
  }
  const std::string cert_what = absl::StrCat("--control-tls-cert '", cert, "'");
  const std::string key_what = absl::StrCat("--control-tls-key '", key, "'");
  const std::string ca_what = absl::StrCat("--control-tls-ca '", ca, "'");
  absl::StatusOr<std::string> cert_pem =
      ReadPemFile(cert, "--control-tls-cert");
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile(key, "--control-tls-key");
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> ca_pem = ReadPemFile(ca, "--control-tls-ca");
  if (!ca_pem.ok()) return ca_pem.status();
  if (absl::Status s = CheckKeyPair(*cert_pem, *key_pem, cert_what, key_what);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCertificates(*ca_pem, ca_what); !s.ok()) return s;
  loaded.cert_chain_pem = *std::move(cert_pem);
  loaded.private_key_pem = *std::move(key_pem);
  loaded.ca_pem = *std::move(ca_pem);
  loaded.server_name = server_name;
  return absl::OkStatus();
}

}  // namespace shardlm
