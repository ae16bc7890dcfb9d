#include "coordinator/api_key.h"

#include <cstddef>

namespace shardlm {

bool ApiKeyMatches(absl::string_view authorization, absl::string_view key) {
  if (key.empty()) return true;
  constexpr absl::string_view kScheme = "Bearer ";
  if (authorization.size() != kScheme.size() + key.size()) return false;
  unsigned char diff = 0;  // No early exit: every byte is compared.
  for (size_t i = 0; i < authorization.size(); ++i) {
    const char want = i < kScheme.size() ? kScheme[i] : key[i - kScheme.size()];
    diff |= static_cast<unsigned char>(authorization[i] ^ want);
  }
  return diff == 0;
}

}  // namespace shardlm
