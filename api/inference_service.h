// The public gRPC API (DESIGN.md section 6): shardlm.v1.Inference over an
// Engine. api/api_server.h hosts it (and the HTTP API).
#ifndef SHARDLM_API_INFERENCE_SERVICE_H_
#define SHARDLM_API_INFERENCE_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/grpc_request_scan.h"
#include "engine/engine.h"
#include "grpcpp/support/byte_buffer.h"
#include "http/memory_budget.h"
#include "http/tls.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "shardlm/v1/inference.grpc.pb.h"

namespace shardlm {

// absl and gRPC share their status codes; this keeps code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

class EngineRequestBuilder;
class OpenAiApi;

struct ServiceOptions {
  // Reported by GetModelInfo: how the engine's model is sharded.
  int tp = 1;
  int pp = 1;
  int cp = 1;
  // max_tokens when a request leaves it at 0.
  int32_t default_max_tokens = 16;
  // Longest prompt (Generate) or text (Tokenize) accepted, checked before
  // tokenizing: 1 MiB is ~250K tokens, 30 times SmolLM2's context (longer
  // prompts are useful only with truncate_prompt_tokens).
  size_t max_prompt_bytes = 1 << 20;
  // When not empty, every call needs metadata "authorization: Bearer
  // <api_key>" (UNAUTHENTICATED otherwise).
  std::string api_key;
  // The highest priority a client may ask for (higher: InvalidArgument).
  // Priorities above another request's preempt it, so by default (0) no
  // client outranks the default; negative priorities are always allowed.
  int32_t max_client_priority = 0;
  // When set (not owned), each request takes its share of it before it is
  // tokenized and holds it while it is queued and runs (issue 39).
  MemoryBudget* memory_budget = nullptr;
  // A Jinja chat template to use instead of the model's (--chat-template);
  // empty: the model's.
  std::string chat_template;
};

// The functions whose calls the output of `request` is parsed for, if the
// model's template renders tools: its tools' names, or only
// tool_choice_function's; none when it has no tools or tool_choice is
// "none". (InferenceService::ToolCallNames adds the template's check; the
// router, which has no template, forwards to replicas that refuse tools
// their template cannot render.)
std::vector<std::string> RequestedToolCallNames(
    const v1::GenerateRequest& request);

// Serves Generate, Tokenize and GetModelInfo. `engine` and `tokenizer` are
// not owned and must outlive the service. All methods are thread-safe.
//
// Each Generate call submits its request to the engine's scheduler, which
// batches it with every other request in flight, and streams the tokens as
// the loop produces them (with their log-probabilities when asked; text
// that could start a stop string is held back until it is resolved). A
// client that cancels (or whose stream breaks) cancels its request; the
// client's deadline becomes the request's (DEADLINE_EXCEEDED); a full queue
// is RESOURCE_EXHAUSTED.
class SequenceGroup;

class InferenceService final : public v1::Inference::Service {
 public:
  InferenceService(Engine* engine, const Tokenizer* tokenizer,
                   std::string model_name, ServiceOptions options);
  ~InferenceService() override;

  grpc::Status Generate(
      grpc::ServerContext* context, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context,
                        const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;

  // Generate and Tokenize on the request's bytes as received (ApiServer
  // registers these): the API key is checked and the message's share of
  // the memory budget taken before anything is parsed; then the wire format
  // is scanned (api/grpc_request_scan.h: counts, unknown fields,
  // UTF-8 naming the field) and only then parsed.
  grpc::Status GenerateWire(grpc::ServerContext* context,
                            const grpc::ByteBuffer& request,
                            grpc::ServerWriter<v1::GenerateResponse>* writer);
  grpc::Status TokenizeWire(grpc::ServerContext* context,
                            const grpc::ByteBuffer& request,
                            v1::TokenizeResponse* response);
  // gRPC requests refused for invalid UTF-8 in a string field.
  int64_t invalid_utf8() const { return invalid_utf8_.load(); }

  // Generate without gRPC (the HTTP API uses it): runs `request` until it
  // ends, handing each response to `write` (false: the client is gone, the
  // request is cancelled) and polling `cancelled` between tokens. OK once
  // the last response (with finish_reason and usage) was written;
  // Cancelled when the client went away; otherwise the error (validation,
  // queue, deadline, a lost rank), before or after some responses. `api`
  // labels the request in the metrics.
  //
  // request.n > 1: n sequences, each response tagged with its `index`
  // (calls to `write` are serialized, from several threads). Sequence i
  // samples with seed + i. Sequence 0 runs first; the others are submitted
  // once its first token is back, when its prompt's full blocks are in the
  // prefix cache, so they share those blocks (reference-counted) and
  // compute only the prompt's last, partial block. The first error of any
  // sequence is the request's.
  absl::Status Run(
      const v1::GenerateRequest& request, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<bool(const v1::GenerateResponse&)>& write,
      RequestApi api = RequestApi::kGrpc);

  // The engine request for `request` (tokenized, cut to its last
  // truncate_prompt_tokens, defaults applied, stop tokens added), or
  // InvalidArgument naming the field. Checks what the engine cannot see
  // (sampling fields, token ranges, stop strings, which the service
  // matches itself); the engine checks context and KV capacity.
  // (api/engine_request_builder.h builds it.)
  absl::StatusOr<GenerateRequest> ToEngineRequest(
      const v1::GenerateRequest& request) const;

  // The functions whose calls the output of `request` is parsed for (by
  // ToolCallStream): its tools' names, or only tool_choice_function's;
  // none when it has no tools, tool_choice is "none", or the model's
  // template renders no tools.
  std::vector<std::string> ToolCallNames(
      const v1::GenerateRequest& request) const;
  // How the model's output is read: its calls and channels (kNone: the
  // template renders no tools) and its reasoning.
  ToolCallFormat tool_call_format() const;
  ReasoningFormat reasoning_format() const;

  // Draining: from now on Run (both APIs) refuses new requests with
  // Unavailable; those already in it run to their end. Not undone.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  // Requests inside Run now (tokenizing, queued or generating).
  int64_t in_flight() const { return in_flight_.load(); }
  const ServiceOptions& options() const { return options_; }
  // The model's chat format (ChatTemplate::ForModel), or why chat requests
  // are refused.
  const absl::StatusOr<ChatTemplate>& chat_template() const {
    return chat_template_;
  }

 private:
  absl::Status CheckApiKey(const grpc::ServerContext& context) const;
  // Run for one sequence (request.n ignored); with a group, the sequence
  // enters the scheduler with the group's others (SequenceGroup).
  absl::Status RunOne(
      const v1::GenerateRequest& request, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<bool(const v1::GenerateResponse&)>& write,
      RequestApi api, SequenceGroup* group = nullptr);
  // RunOne's engine request, admitted: the memory its tokenizing may take
  // (held in `share` while the request runs, cut to its prompt once built),
  // the request built (ToEngineRequest), the cluster healthy and the
  // priority allowed.
  absl::StatusOr<GenerateRequest> Admit(const v1::GenerateRequest& request,
                                        absl::Time deadline, RequestApi api,
                                        MemoryShare& share) const;
  // A share of options_.memory_budget (an empty one without a budget).
  absl::StatusOr<MemoryShare> TakeMemory(int64_t bytes,
                                         absl::string_view what) const;
  // The raw request's share of the budget, then its bytes flattened, and
  // `scan` run on them: the flat bytes, or the scan's refusal.
  absl::StatusOr<std::string> ReadWire(
      const grpc::ByteBuffer& request,
      absl::Status (*scan)(absl::string_view, const GrpcScanLimits&),
      MemoryShare* share);

  Engine* engine_;              // Not owned.
  const Tokenizer* tokenizer_;  // Not owned.
  absl::StatusOr<ChatTemplate> chat_template_;
  std::string model_name_;
  ServiceOptions options_;
  // Turns requests into the engine's (thread-safe; it holds the compiled
  // grammars of structured outputs).
  std::unique_ptr<EngineRequestBuilder> request_builder_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> invalid_utf8_{0};
};

// The largest gRPC message a legitimate request needs: a prompt of
// max_prompt_bytes and, beside it, 2^18 prompt_token_ids of at most 5 bytes
// each (token ids take precedence over text, so both may come), 8 stop
// strings of 256 bytes, 256 stop_token_ids and the scalars, each with its
// tag and length; rounded up to 64 KiB. A chat request (1 MiB of messages,
// which exclude prompt and token ids) needs less. gRPC refuses a larger
// message (RESOURCE_EXHAUSTED) before parsing it.
size_t MaxGrpcRequestBytes(size_t max_prompt_bytes);

}  // namespace shardlm

#endif  // SHARDLM_API_INFERENCE_SERVICE_H_
