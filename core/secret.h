// Secrets: comparing them without leaking where they differ, and making
// them (API keys, the cluster token; DESIGN.md section 6a).
#ifndef SHARDLM_CORE_SECRET_H_
#define SHARDLM_CORE_SECRET_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardlm {

// a == b, in time that depends on the lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// `bytes` bytes from the kernel's CSPRNG (getrandom), as 2 * bytes lower-case
// hex digits. Internal error if the kernel cannot provide them.
absl::StatusOr<std::string> RandomHexToken(size_t bytes = 32);

}  // namespace shardlm

#endif  // SHARDLM_CORE_SECRET_H_
