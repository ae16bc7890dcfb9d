// Mutual TLS on the control plane (coordinator <-> workers): the flags that
// `launch`, `coordinator` and `worker` share. They are the control plane's
// own, apart from the public API's --tls-*: a cluster's processes trust a
// cluster CA of their own, which clients never see.
#ifndef SHARDLM_LAUNCH_CONTROL_TLS_FLAGS_H_
#define SHARDLM_LAUNCH_CONTROL_TLS_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "launch/flags.h"
#include "step/control_channel.h"

namespace shardlm {

struct ControlTlsFlags {
  std::string cert, key, ca;
  std::string server_name;  // Only where workers dial (launch, worker).
  ControlTls loaded;        // What the files hold, after Load().

  // Adds --control-tls-cert, --control-tls-key and --control-tls-ca.
  void Register(FlagSet& flags);
  // Adds --control-tls-server-name (where workers dial: launch, worker).
  void RegisterServerName(FlagSet& flags);
  // Reads and checks the files into `loaded` (plaintext when none is
  // given), once at start: all three or none; the certificate and key must
  // parse and match, the CA file hold certificates that parse. Errors name
  // the flag and the file, and leave `loaded` empty.
  absl::Status Load();
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_CONTROL_TLS_FLAGS_H_
