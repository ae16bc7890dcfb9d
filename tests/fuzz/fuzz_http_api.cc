// One HTTP request (head, blank line, body) through the head check the
// server runs on every request (ParseHttpHead: the bytes, the framing) and
// the OpenAI-style handlers (/v1/completions, chat, Anthropic's messages,
// models, tokenize, metrics, probes) over a tiny random model with
// SmolLM2's tokenizer (the GGUF at $SHARDLM_MODEL, else the repository's
// models/ copy). Every request gets one well-formed response; none may
// crash. The heap each input costs is
// metered (alloc_meter.h): at most 32 times its size plus kAllowance.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "api/inference_service.h"
#include "api/openai_api.h"
#include "engine/engine.h"
#include "http/http_server.h"
#include "model/in_memory_weights.h"
#include "model/tokenizer.h"
#include "tests/fuzz/alloc_meter.h"
#include "tests/fuzz/tiny_service.h"

namespace {

using namespace shardlm;

class Collect : public HttpResponse {
 public:
  bool Send(int status, const std::string& content_type,
            const std::string& body) override {
    Check(status);
    ++responses_;
    bytes_ += body.size() + content_type.size();
    return true;
  }
  bool Start(int status, const std::string& content_type) override {
    Check(status);
    ++responses_;
    return true;
  }
  bool Write(const std::string& data) override {
    bytes_ += data.size();
    return true;
  }
  void AddHeader(std::string name, std::string value) override {}
  bool ClientGone() const override { return false; }
  int responses() const { return responses_; }

 private:
  static void Check(int status) {
    if (status < 200 || status > 599) std::abort();
  }
  int responses_ = 0;
  size_t bytes_ = 0;
};

// The tiny service and the OpenAI API over it.
struct Server {
  fuzzing::TinyService* tiny;
  std::unique_ptr<OpenAiApi> api;
};

Server& Tiny() {
  static Server* server = [] {
    auto* s = new Server{fuzzing::NewTinyService("fuzz_http_api")};
    s->api = std::make_unique<OpenAiApi>(
        s->tiny->engine.get(), s->tiny->service.get(),
        OpenAiApiOptions{.model_name = "tiny"});
    return s;
  }();
  return *server;
}

}  // namespace

// What any request may cost beyond 32 bytes per byte of it: a generation's
// fixed parts (the engine's per-request state and step buffers for at most
// the 48-token context, the response's JSON), and the 256-byte echoes.
constexpr int64_t kAllowance = 4 << 20;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server& server = Tiny();
  const shardlm::fuzz::AllocMeter meter;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t end = input.find("\r\n\r\n");
  if (end == std::string::npos) return 0;
  HttpRequest request;
  uint64_t length = 0;
  const auto [status, why] =
      ParseHttpHead(input.substr(0, end), request, &length);
  if (status != 0) {
    if (status < 400 || status > 599 || why == nullptr) std::abort();
    return 0;
  }
  // The server reads exactly the declared length (none: no body).
  request.body = input.substr(end + 4, length);
  Collect response;
  server.api->Handle(request, response);
  if (response.responses() != 1) std::abort();
  meter.Check(size, kAllowance, "fuzz_http_api");
  return 0;
}
