#include "api/api_key.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/secret.h"

namespace shardlm {

bool ApiKeyMatches(absl::string_view authorization, absl::string_view key) {
  if (key.empty()) return true;
  return ConstantTimeEquals(authorization, absl::StrCat("Bearer ", key));
}

}  // namespace shardlm
