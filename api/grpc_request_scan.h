// The wire bytes of a gRPC request, checked before they are parsed (issue
// 39). Parsing a protobuf message costs tens of bytes per element however
// small the element is on the wire (an empty ChatMessage is 2 bytes there
// and ~50 parsed), so a 4 MiB message of millions of empty messages cost
// ~110 MiB before InferenceService could refuse it; and libprotobuf met
// invalid UTF-8 in a string field with INTERNAL, an empty message and a log
// line per call. This scan counts and checks without keeping anything.
#ifndef SHARDLM_API_GRPC_REQUEST_SCAN_H_
#define SHARDLM_API_GRPC_REQUEST_SCAN_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardlm {

// The same limits as InferenceService applies after the parse, so the scan
// refuses no request that would otherwise be served.
struct GrpcScanLimits {
  int max_messages = 256;
  int max_stop = 8;
  int max_prompt_token_ids = 1 << 18;
  int max_stop_token_ids = 256;
  int max_logit_bias = 300;  // sampling.logit_bias entries.
  // Fields of no known number (or the wrong wire type) in the whole
  // request, nested messages included; libprotobuf keeps each.
  int max_unknown_fields = 256;
};

// Checks a serialized shardlm.v1.GenerateRequest:
// - INVALID_ARGUMENT with InferenceService's message when a repeated field
//   has more elements than its limit ("at most 256 messages, got 300"), or
//   when there are more unknown fields than max_unknown_fields;
// - INVALID_ARGUMENT naming the field and the offset of the first bad byte
//   in it when a string field is not valid UTF-8 ("messages[1].content is
//   not valid UTF-8 (byte 0)");
// - INTERNAL when the bytes are not a protobuf message (as gRPC answered
//   an unparseable request before).
// OK means libprotobuf will parse it, and nothing in it is over a limit.
absl::Status ScanGenerateRequest(absl::string_view wire,
                                 const GrpcScanLimits& limits = {});

// The same for a shardlm.v1.TokenizeRequest (its string: "text").
absl::Status ScanTokenizeRequest(absl::string_view wire,
                                 const GrpcScanLimits& limits = {});

// The offset of the first byte of `s` that does not belong to well-formed
// UTF-8 (no overlong forms, surrogates or code points past U+10FFFF: what
// libprotobuf accepts), or npos when all of it is.
size_t FirstInvalidUtf8(absl::string_view s);

}  // namespace shardlm

#endif  // SHARDLM_API_GRPC_REQUEST_SCAN_H_
