// The API key check shared by the gRPC and HTTP front ends (DESIGN.md
// section 6a): one comparison, in constant time.
#ifndef SHARDLM_API_API_KEY_H_
#define SHARDLM_API_API_KEY_H_

#include "absl/strings/string_view.h"

namespace shardlm {

// Whether `authorization` (an HTTP Authorization header or gRPC
// "authorization" metadata value) is exactly "Bearer <key>". An empty key
// accepts anything. The time taken depends on the lengths only, never on
// where the bytes differ.
bool ApiKeyMatches(absl::string_view authorization, absl::string_view key);

}  // namespace shardlm

#endif  // SHARDLM_API_API_KEY_H_
