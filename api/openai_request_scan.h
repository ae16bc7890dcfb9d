#ifndef SHARDLM_API_OPENAI_REQUEST_SCAN_H_
#define SHARDLM_API_OPENAI_REQUEST_SCAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardlm {

// Count limits on an OpenAI request body, checked while the JSON is read and
// before any DOM is built: a DOM costs tens of bytes per element however
// small the element is in the text (`{}` is 2 bytes of text and ~16 of
// DOM, plus its slot in the parent), so an 8 MiB body of millions of empty
// objects would cost gigabytes. Each limit is at least what the API accepts
// after the parse (InferenceService's limits), so a body it refuses here is
// one it would refuse later anyway.
struct OpenAiScanLimits {
  int max_depth = 32;                   // Nesting of arrays and objects.
  size_t max_stop = 8;                  // "stop" strings.
  size_t max_messages = 256;            // "messages".
  size_t max_prompt = size_t{1} << 18;  // "prompt" token ids.
  size_t max_logit_bias = 300;          // "logit_bias" entries.
  size_t max_tools = 128;               // "tools".
  size_t max_content_parts = 256;       // "messages[i].content" parts.
  size_t max_container = 1024;  // Elements of any other array or object.
  size_t max_values = 327'680;  // Values of any kind in the whole body.
};

// What a scan saw, for sizing the parse that follows.
struct OpenAiScanStats {
  size_t values = 0;  // Scalars, arrays and objects.
  int max_depth = 0;
};

// Reads `body` as JSON without keeping it, and returns INVALID_ARGUMENT
// naming the field and its limit when a count exceeds `limits`, or saying
// that the body is not JSON. Memory: the parser's stack (one bit per level)
// and its current token, at most the size of the largest string in `body`.
// Thread-safe (no shared state).
absl::Status ScanOpenAiRequest(absl::string_view body,
                               const OpenAiScanLimits& limits = {},
                               OpenAiScanStats* stats = nullptr);

}  // namespace shardlm

#endif  // SHARDLM_API_OPENAI_REQUEST_SCAN_H_
