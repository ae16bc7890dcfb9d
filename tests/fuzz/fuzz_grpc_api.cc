// One gRPC request's bytes through the path InferenceService::GenerateWire
// and TokenizeWire take (issue 39): the wire scan
// (api/grpc_request_scan.h), then libprotobuf's parse, which must
// succeed whenever the scan passed, then the service (tokenizing, the
// engine request, a generation over a tiny random model with SmolLM2's
// tokenizer; the GGUF at $SHARDLM_MODEL, else the repository's models/
// copy). The first byte picks Generate or Tokenize. The heap each input
// costs is metered (alloc_meter.h): at most 32 times its size plus
// kAllowance.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "api/grpc_request_scan.h"
#include "api/inference_service.h"
#include "engine/engine.h"
#include "model/in_memory_weights.h"
#include "model/tokenizer.h"
#include "shardlm/v1/inference.pb.h"
#include "tests/fuzz/alloc_meter.h"
#include "tests/fuzz/tiny_service.h"

namespace {

using namespace shardlm;

using fuzzing::TinyService;

TinyService& Tiny() {
  static TinyService* service = fuzzing::NewTinyService("fuzz_grpc_api");
  return *service;
}

// As fuzz_http_api's: a generation's fixed parts over the 48-token context.
constexpr int64_t kAllowance = 4 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  TinyService& server = Tiny();
  const shardlm::fuzz::AllocMeter meter;
  const bool tokenize = (data[0] & 1) != 0;
  const absl::string_view wire(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (tokenize) {
    if (ScanTokenizeRequest(wire).ok()) {
      v1::TokenizeRequest request;
      if (!request.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
        std::abort();  // The scan passed what libprotobuf refuses.
      }
      if (request.text().size() <= server.service->options().max_prompt_bytes) {
        (void)server.tokenizer->Encode(request.text());
      }
    }
  } else if (ScanGenerateRequest(wire).ok()) {
    v1::GenerateRequest request;
    if (!request.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
      std::abort();  // The scan passed what libprotobuf refuses.
    }
    int responses = 0;
    (void)server.service->Run(
        request, absl::InfiniteFuture(), [] { return false; },
        [&](const v1::GenerateResponse&) {
          ++responses;
          return true;
        });
  }
  meter.Check(size, kAllowance, "fuzz_grpc_api");
  return 0;
}
