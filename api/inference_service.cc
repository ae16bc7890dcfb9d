#include "api/inference_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/api_key.h"
#include "api/engine_request_builder.h"
#include "api/text_stream.h"
#include "core/status.h"
#include "grammar/json_schema.h"
#include "step/kv_cache.h"
#include "step/sampling_params.h"

namespace shardlm {
namespace {

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// Parallel sampling: at most this many sequences per request (`n`).
constexpr int kMaxN = 16;

// What tokenizing costs at most per byte of text: the token ids (up to 4
// bytes per byte, twice that while their vector grows) and the merge state
// of one 16 KiB cut (under 1 MiB); the pre-tokenizer keeps nothing.
// model/tokenizer_memory_test holds Encode to 8 bytes per byte + 1 MiB.
// And what a queued request holds besides its prompt's ids.
constexpr int64_t kTokenizeBytesPerByte = 10;
constexpr int64_t kQueuedRequestBytes = 4096;
// A parsed request beyond its wire bytes: the objects of at most 256
// messages, 8 stop strings and 256 unknown fields (~100 bytes each), and the
// 4-byte slots of up to 2^18 + 256 token ids (varints of 1 byte or more).
constexpr int64_t kParsedMessageBytes = 256 * 1024 + 4 * (1 << 18);

}  // namespace

size_t MaxGrpcRequestBytes(size_t max_prompt_bytes) {
  // Each field: its bytes plus at most 16 of tag and length.
  const size_t bytes =
      (max_prompt_bytes + 16) + (size_t{kMaxPromptTokenIds} * 5 + 16) +
      kMaxStopStrings * (kMaxStopStringBytes + 16) +
      (size_t{kMaxStopTokenIds} * 5 + 16) +
      size_t{kMaxLogitBias} * 16 +  // Entries: tag, length, key, value.
      (kMaxJsonSchemaBytes + 32) +  // constraint: a schema or grammar.
      1024;                         // Scalars, sampling.
  constexpr size_t kRound = 64 * 1024;
  return (bytes + kRound - 1) / kRound * kRound;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

InferenceService::InferenceService(Engine* engine, const Tokenizer* tokenizer,
                                   std::string model_name,
                                   ServiceOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(tokenizer != nullptr
                         ? ChatTemplate::ForModel(*tokenizer, absl::Now(),
                                                  options.chat_template)
                         : absl::FailedPreconditionError("no tokenizer")),
      model_name_(std::move(model_name)),
      options_(options),
      request_builder_(std::make_unique<EngineRequestBuilder>(
          &engine->config(), tokenizer, &chat_template_,
          options_.default_max_tokens, options_.max_prompt_bytes)) {}

InferenceService::~InferenceService() = default;

std::vector<std::string> RequestedToolCallNames(
    const v1::GenerateRequest& request) {
  std::vector<std::string> names;
  if (request.tools_size() == 0 || request.tool_choice() == "none") {
    return names;
  }
  for (const v1::Tool& tool : request.tools()) {
    if (request.tool_choice_function().empty() ||
        tool.name() == request.tool_choice_function()) {
      names.push_back(tool.name());
    }
  }
  return names;
}

ToolCallFormat InferenceService::tool_call_format() const {
  if (!chat_template_.ok()) return ToolCallFormat::kNone;
  return chat_template_->output_format();
}

ReasoningFormat InferenceService::reasoning_format() const {
  return chat_template_.ok() ? chat_template_->reasoning_format()
                             : ReasoningFormat::kNone;
}

std::vector<std::string> InferenceService::ToolCallNames(
    const v1::GenerateRequest& request) const {
  if (!chat_template_.ok() ||
      chat_template_->tool_format() == ToolCallFormat::kNone) {
    return {};
  }
  return RequestedToolCallNames(request);
}

absl::StatusOr<GenerateRequest> InferenceService::ToEngineRequest(
    const v1::GenerateRequest& request) const {
  return request_builder_->Build(request);
}

// The n sequences of one request, submitted to the engine in one intake
// (Engine::SubmitGroup) once every member is ready or has left (refused
// before submitting): each member's RunOne calls Submit, which waits for
// the others, or Leave.
class SequenceGroup {
 public:
  SequenceGroup(Engine* engine, int members)
      : engine_(engine), expected_(members) {}

  absl::StatusOr<RequestId> Submit(GenerateRequest request,
                                   RequestCallbacks callbacks) {
    absl::MutexLock lock(&mu_);
    const size_t at = members_.size();
    members_.push_back({std::move(request), std::move(callbacks)});
    SubmitIfComplete();
    mu_.Await(absl::Condition(
        +[](bool* submitted) { return *submitted; }, &submitted_));
    return ids_[at];
  }

  void Leave() {
    absl::MutexLock lock(&mu_);
    ++left_;
    SubmitIfComplete();
  }

 private:
  void SubmitIfComplete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (static_cast<int>(members_.size()) + left_ < expected_) return;
    ids_ = engine_->SubmitGroup(std::move(members_));
    submitted_ = true;
  }

  Engine* const engine_;
  const int expected_;
  absl::Mutex mu_;
  std::vector<Scheduler::GroupMember> members_ ABSL_GUARDED_BY(mu_);
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::StatusOr<RequestId>> ids_ ABSL_GUARDED_BY(mu_);
};

namespace {

// What tokenizing `request` may cost, taken before ToEngineRequest: its
// text (at most twice max_prompt_bytes) at kTokenizeBytesPerByte, its token
// ids, and what a queued request holds.
int64_t TokenizeMemoryBytes(const v1::GenerateRequest& request,
                            size_t max_prompt_bytes) {
  int64_t text_bytes =
      static_cast<int64_t>(std::min(request.prompt().size(), max_prompt_bytes));
  for (const v1::ChatMessage& m : request.messages()) {
    text_bytes += static_cast<int64_t>(m.role().size() + m.content().size());
  }
  text_bytes =
      std::min<int64_t>(text_bytes, static_cast<int64_t>(max_prompt_bytes) * 2);
  return text_bytes * kTokenizeBytesPerByte +
         (std::min(request.prompt_token_ids_size(), kMaxPromptTokenIds) +
          std::min(request.resume_token_ids_size(), kMaxPromptTokenIds)) *
             int64_t{sizeof(int32_t)} +
         kQueuedRequestBytes;
}

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point t) {
  // gRPC reports "no deadline" as the far future.
  if (t >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(t);
}

}  // namespace

grpc::Status InferenceService::Generate(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  // The message as received and as parsed, held while the call runs.
  absl::StatusOr<MemoryShare> share = TakeMemory(
      static_cast<int64_t>(request->ByteSizeLong() + request->SpaceUsedLong()),
      "the gRPC message");
  if (!share.ok()) return ToGrpcStatus(share.status());
  return ToGrpcStatus(Run(
      *request, ToAbslDeadline(context->deadline()),
      [context] { return context->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }));
}

absl::Status InferenceService::Run(
    const v1::GenerateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write,
    RequestApi api) {
  const int n = request.n() == 0 ? 1 : request.n();
  if (n < 1 || n > kMaxN) {
    return Invalid("n must be 1 to ", kMaxN, ", got ", request.n());
  }
  if (n == 1) return RunOne(request, deadline, cancelled, write, api);
  if (request.resume_token_ids_size() > 0) {
    return Invalid("resume_token_ids need n = 1 (a stream is one sequence)");
  }
  absl::Mutex write_mu;
  bool writing = true;  // False once a write failed: the client is gone.
  // With prefix caching, a hidden one-token request computes the prompt
  // first: the n sequences then find its full blocks cached and compute
  // only the rest (one prefill, not n). Its cached tokens are the
  // request's (what the n found cached, it computed), and it scores the
  // prompt when prompt logprobs are asked for (then even without prefix
  // caching): they go out with the first response, whichever choice's.
  const bool prefill_first =
      engine_->blocks().prefix_caching() || request.prompt_logprobs() > 0;
  int32_t cached_tokens = -1;
  std::vector<v1::TokenLogprobs> prompt_logprobs;
  if (prefill_first) {
    v1::GenerateRequest prefill = request;
    prefill.set_n(1);
    prefill.set_max_tokens(1);
    prefill.set_min_tokens(0);
    prefill.set_logprobs(0);  // The constraint stays: a bad one fails here.
    RETURN_IF_ERROR(RunOne(
        prefill, deadline, cancelled,
        [&](const v1::GenerateResponse& r) {
          if (r.has_usage()) cached_tokens = r.usage().cached_tokens();
          prompt_logprobs.insert(prompt_logprobs.end(),
                                 r.prompt_logprobs().begin(),
                                 r.prompt_logprobs().end());
          return true;
        },
        api));
  }
  bool first = true;
  const auto indexed = [&](int index, const v1::GenerateResponse& r) {
    absl::MutexLock lock(&write_mu);
    if (!writing) return false;
    v1::GenerateResponse tagged = r;
    tagged.set_index(index);
    if (tagged.has_usage() && cached_tokens >= 0) {
      tagged.mutable_usage()->set_cached_tokens(cached_tokens);
    }
    if (first) {
      first = false;
      for (v1::TokenLogprobs& lp : prompt_logprobs) {
        *tagged.add_prompt_logprobs() = std::move(lp);
      }
    }
    writing = write(tagged);
    return writing;
  };
  // The n sequences enter the scheduler together (SequenceGroup): planned
  // from the same state in the same steps, so a seeded request's n texts
  // do not depend on when each thread got there. Sequence i samples with
  // seed + i.
  SequenceGroup group(engine_, n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest child = request;
      child.set_prompt_logprobs(0);  // The prefill request scored.
      child.mutable_sampling()->set_seed(request.sampling().seed() +
                                         static_cast<uint64_t>(i));
      statuses[i] = RunOne(
          child, deadline, cancelled,
          [&, i](const v1::GenerateResponse& r) { return indexed(i, r); }, api,
          &group);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerateRequest> InferenceService::Admit(
    const v1::GenerateRequest& request, absl::Time deadline, RequestApi api,
    MemoryShare& share) const {
  // Tokenizing is paid for before it starts; what is left of the share then
  // holds the queued request's prompt until the request ends.
  ASSIGN_OR_RETURN(
      share, TakeMemory(TokenizeMemoryBytes(request, options_.max_prompt_bytes),
                        "tokenizing the prompt"));
  absl::StatusOr<GenerateRequest> req = ToEngineRequest(request);
  if (!req.ok()) return req.status();
  share.ShrinkTo(
      static_cast<int64_t>((req->prompt.size() + req->resumed.size()) *
                           sizeof(int32_t)) +
      kQueuedRequestBytes);
  req->api = api;
  // A cluster with a lost (or not yet joined) rank: UNAVAILABLE naming it.
  if (absl::Status h = engine_->executor().Health(); !h.ok()) return h;
  if (request.priority() > options_.max_client_priority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priority ", request.priority(), " is above this server's limit ",
        options_.max_client_priority, " (--max-client-priority)"));
  }
  req->priority = request.priority();
  req->deadline = deadline;
  return req;
}

absl::Status InferenceService::RunOne(
    const v1::GenerateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write,
    RequestApi api, SequenceGroup* group) {
  // Counted before the check, so that Drain never misses one that passed.
  ++in_flight_;
  struct Leave {
    std::atomic<int64_t>& n;
    ~Leave() { --n; }
  } leave{in_flight_};
  // A member of a group that returns before submitting leaves it, so that
  // the others are not kept waiting.
  struct LeaveGroup {
    SequenceGroup* group;
    ~LeaveGroup() {
      if (group != nullptr) group->Leave();
    }
  } leave_group{group};
  if (draining_) {
    return absl::UnavailableError(
        "the server is draining (shutting down): it finishes the requests "
        "it has and takes no new ones");
  }
  MemoryShare share;
  absl::StatusOr<GenerateRequest> req = Admit(request, deadline, api, share);
  if (!req.ok()) return req.status();

  // The scheduler batches this request with every other one in flight.
  auto stream = std::make_shared<TextStream>(
      tokenizer_, *req,
      std::vector<std::string>(request.stop().begin(), request.stop().end()));
  RETURN_IF_ERROR(stream->Resume(req->resumed));
  RequestCallbacks callbacks = TextStream::Callbacks(stream);
  leave_group.group = nullptr;
  absl::StatusOr<RequestId> id =
      group != nullptr ? group->Submit(*std::move(req), std::move(callbacks))
                       : engine_->Submit(*std::move(req), std::move(callbacks));
  if (!id.ok()) return id.status();

  ToolCallWriter tool_calls(
      ToolCallNames(request), tool_call_format(),
      RequestReasoningFormat(
          reasoning_format(),
          request.has_enable_thinking()
              ? std::optional<bool>(request.enable_thinking())
              : std::nullopt),
      absl::StrCat("call_", absl::Hex(absl::ToUnixNanos(absl::Now()) ^ *id),
                   "_"),
      write);
  return stream->WriteResponses(
      cancelled, [&] { engine_->Cancel(*id); },
      [&](const v1::GenerateResponse& r) { return tool_calls.Write(r); });
}

absl::StatusOr<std::string> InferenceService::ReadWire(
    const grpc::ByteBuffer& request,
    absl::Status (*scan)(absl::string_view, const GrpcScanLimits&),
    MemoryShare* share) {
  // The bytes as gRPC holds them, the flat copy below, and the parsed
  // message: the scan bounds its counts, so it is at most about its bytes
  // plus a small overhead per element.
  const int64_t bytes = static_cast<int64_t>(request.Length());
  ASSIGN_OR_RETURN(
      *share, TakeMemory(3 * bytes + kParsedMessageBytes, "the gRPC message"));
  std::vector<grpc::Slice> slices;
  if (!request.Dump(&slices).ok()) {
    return absl::InternalError("the request's bytes could not be read");
  }
  std::string flat;
  flat.reserve(static_cast<size_t>(bytes));
  for (const grpc::Slice& slice : slices) {
    flat.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (absl::Status s = scan(flat, GrpcScanLimits{}); !s.ok()) {
    if (absl::StrContains(s.message(), "is not valid UTF-8")) ++invalid_utf8_;
    return s;
  }
  return flat;
}

grpc::Status InferenceService::GenerateWire(
    grpc::ServerContext* context, const grpc::ByteBuffer& request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  MemoryShare share;
  absl::StatusOr<std::string> wire =
      ReadWire(request, &ScanGenerateRequest, &share);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::GenerateRequest parsed;
  if (!parsed.ParseFromString(*wire)) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "the request is not a valid shardlm.v1.GenerateRequest");
  }
  *wire = std::string();
  return ToGrpcStatus(Run(
      parsed, ToAbslDeadline(context->deadline()),
      [context] { return context->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }));
}

grpc::Status InferenceService::TokenizeWire(grpc::ServerContext* context,
                                            const grpc::ByteBuffer& request,
                                            v1::TokenizeResponse* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  MemoryShare share;
  absl::StatusOr<std::string> wire =
      ReadWire(request, &ScanTokenizeRequest, &share);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::TokenizeRequest parsed;
  if (!parsed.ParseFromString(*wire)) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "the request is not a valid shardlm.v1.TokenizeRequest");
  }
  *wire = std::string();
  return Tokenize(context, &parsed, response);
}

absl::StatusOr<MemoryShare> InferenceService::TakeMemory(
    int64_t bytes, absl::string_view what) const {
  if (options_.memory_budget == nullptr) return MemoryShare();
  return options_.memory_budget->Take(bytes, what);
}

absl::Status InferenceService::CheckApiKey(
    const grpc::ServerContext& context) const {
  if (options_.api_key.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end() ||
      !ApiKeyMatches(absl::string_view(it->second.data(), it->second.size()),
                     options_.api_key)) {
    return absl::UnauthenticatedError(
        "missing or wrong API key (metadata authorization: Bearer <key>; "
        "shardlm generate reads SHARDLM_API_KEY)");
  }
  return absl::OkStatus();
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context,
                                        const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  if (request->text().size() > options_.max_prompt_bytes) {
    return ToGrpcStatus(Invalid("the text is ", request->text().size(),
                                " bytes; at most ", options_.max_prompt_bytes,
                                " are accepted"));
  }
  absl::StatusOr<MemoryShare> share = TakeMemory(
      static_cast<int64_t>(request->ByteSizeLong() + request->SpaceUsedLong()) +
          static_cast<int64_t>(request->text().size()) * kTokenizeBytesPerByte,
      "tokenizing the text");
  if (!share.ok()) return ToGrpcStatus(share.status());
  for (int32_t id : tokenizer_->Encode(request->text())) {
    response->add_token_ids(id);
  }
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetModelInfo(
    grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
    v1::ModelInfo* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  // Fixed after construction: safe to read while a Generate runs.
  const ModelConfig& config = engine_->config();
  response->set_name(model_name_);
  response->set_vocab_size(static_cast<int32_t>(config.vocab_size));
  response->set_context_length(static_cast<int32_t>(config.context_length));
  response->set_tp(options_.tp);
  response->set_pp(options_.pp);
  response->set_cp(options_.cp);
  // Per worker: the block manager's ids are the CP group's.
  const int cp = engine_->blocks().interleave();
  response->set_kv_blocks(engine_->blocks().num_blocks() / cp);
  response->set_block_size(engine_->blocks().block_size());
  response->set_host_kv_blocks(engine_->blocks().num_host_blocks() / cp);
  const DType kv_dtype = engine_->executor().kv_cache_dtype();
  response->set_kv_cache_dtype(KvCacheDTypeName(kv_dtype));
  response->set_kv_bytes_per_token(
      KvBytesPerToken(engine_->config(), kv_dtype));
  response->set_prefix_caching(engine_->blocks().prefix_caching());
  response->set_tool_call_format(ToolCallFormatName(tool_call_format()));
  response->set_reasoning_format(ReasoningFormatName(reasoning_format()));
  return grpc::Status::OK;
}

}  // namespace shardlm
