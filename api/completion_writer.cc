#include "api/completion_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "http/http_message.h"

namespace shardlm {
namespace {

using openai_wire::AppendLogprobs;
using openai_wire::Dump;
using openai_wire::EmptyLogprobs;
using openai_wire::Json;
using openai_wire::PromptLogprobsJson;
using openai_wire::UsageJson;
using openai_wire::VllmPromptLogprobsJson;

// The calls of the service's last response, as OpenAI's message shows them.
Json CallsJson(const v1::GenerateResponse& r) {
  Json calls = Json::array();
  for (int i = 0; i < r.tool_calls_size(); ++i) {
    const v1::ToolCall& c = r.tool_calls(i);
    calls.push_back(
        {{"id", c.id()},
         {"type", "function"},
         {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
  }
  return calls;
}

}  // namespace

CompletionWriter::CompletionWriter(bool chat, bool stream, int n,
                                   const openai_wire::ResponseShape& shape,
                                   const Parsing& parsing, Head head,
                                   std::string call_id_prefix,
                                   HttpResponse& response)
    : chat_(chat),
      stream_(stream),
      n_(n),
      shape_(shape),
      top_n_(shape.top_n),
      echo_logprobs_(shape.echo && shape.top_n >= 0),
      head_(std::move(head)),
      call_id_prefix_(std::move(call_id_prefix)),
      response_(response),
      choices_(n) {
  for (Choice& c : choices_) {
    c.text = shape_.echo_text;  // Streamed, it leads the choice's first chunk.
    c.text_offset = static_cast<int64_t>(shape_.echo_text.size());
    c.logprobs = EmptyLogprobs(chat_);
    // Reasoning (harmony's channels, Qwen3's <think>) is split whether or
    // not tools are asked for.
    if (!parsing.names.empty() ||
        (chat_ && (parsing.format == ToolCallFormat::kHarmony ||
                   parsing.reasoning != ReasoningFormat::kNone))) {
      c.tool_filter.emplace(parsing.names, parsing.format, parsing.reasoning);
    }
  }
}

bool CompletionWriter::Write(const v1::GenerateResponse& r) {
  if (r.index() < 0 || r.index() >= n_) return false;
  Choice& c = choices_[r.index()];
  Json lead = Lead(r, c);
  if (r.has_usage()) c.usage = r.usage();
  if (!r.finish_reason().empty()) c.finish_reason = r.finish_reason();
  ToolCallEvents piece;
  piece.content = r.text();
  if (c.tool_filter) piece = openai_wire::ParsePiece(*c.tool_filter, r);
  if (!stream_) {
    Accumulate(r, c, piece, std::move(lead));
    return true;
  }
  return StreamChunks(r, c, piece, std::move(lead));
}

Json CompletionWriter::Lead(const v1::GenerateResponse& r, Choice& c) {
  if (r.prompt_logprobs_size() > 0) {
    if (echo_logprobs_) prompt_logprobs_ = PromptLogprobsJson(r, top_n_);
    if (shape_.prompt_top_n >= 0) {
      vllm_prompt_logprobs_ = VllmPromptLogprobsJson(r, shape_.prompt_top_n);
    }
  }
  Json lead = EmptyLogprobs(chat_);
  if (echo_logprobs_ && !c.echoed_logprobs && prompt_logprobs_.is_object()) {
    c.echoed_logprobs = true;
    lead = prompt_logprobs_;
  }
  return lead;
}

void CompletionWriter::Accumulate(const v1::GenerateResponse& r, Choice& c,
                                  const ToolCallEvents& piece, Json lead) {
  c.text += piece.content;
  c.reasoning += piece.reasoning;
  if (r.tool_calls_size() > 0) c.tool_calls = CallsJson(r);
  if (top_n_ < 0) return;
  if (!chat_ && !lead["tokens"].empty()) {
    for (const char* key :
         {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (Json& v : lead[key]) c.logprobs[key].push_back(std::move(v));
    }
  }
  AppendLogprobs(r, chat_, top_n_, c.logprobs, &c.text_offset);
}

std::vector<Json> CompletionWriter::CallDeltas(
    const v1::GenerateResponse& r, Choice& c,
    const ToolCallEvents& piece) const {
  // Tool calls stream as OpenAI's do: a call's first delta carries its
  // index, id, type, name and empty arguments, the next its arguments.
  // Each call is sent when its </tool_call> arrives, arguments whole: a
  // malformed call must come back as content, which is known only then.
  std::vector<Json> call_deltas;
  for (const ChatToolCall& call : piece.calls) {
    const int k = c.streamed_calls++;
    call_deltas.push_back(
        {{"index", k},
         {"id", absl::StrCat(call_id_prefix_, r.index(), "_", k)},
         {"type", "function"},
         {"function", {{"name", call.name}, {"arguments", ""}}}});
    call_deltas.push_back(
        {{"index", k}, {"function", {{"arguments", call.arguments}}}});
  }
  return call_deltas;
}

bool CompletionWriter::StreamChunks(const v1::GenerateResponse& r, Choice& c,
                                    const ToolCallEvents& piece, Json lead) {
  Json choice = {
      {"index", r.index()},
      {"finish_reason",
       r.finish_reason().empty() ? Json() : Json(r.finish_reason())}};
  if (top_n_ >= 0) {
    Json lp = std::move(lead);
    AppendLogprobs(r, chat_, top_n_, lp, &c.text_offset);
    choice["logprobs"] = lp;
  } else {
    choice["logprobs"] = Json();
  }
  const std::vector<Json> call_deltas = CallDeltas(r, c, piece);
  // One chunk per delta: the text first (with the logprobs), then the
  // call deltas; the last chunk has the finish_reason and usage.
  const size_t chunks = chat_ ? 1 + call_deltas.size() : 1;
  for (size_t i = 0; i < chunks; ++i) {
    Json one = choice;
    if (i > 0 && top_n_ >= 0) one["logprobs"] = EmptyLogprobs(chat_);
    if (i + 1 < chunks) one["finish_reason"] = Json();
    if (chat_) {
      Json delta = Json::object();
      if (i == 0 && !piece.reasoning.empty()) {
        delta["reasoning_content"] = piece.reasoning;
      }
      if (i == 0) delta["content"] = piece.content;
      if (c.first_chunk) delta["role"] = "assistant";
      if (i > 0) delta["tool_calls"] = Json::array({call_deltas[i - 1]});
      one["delta"] = std::move(delta);
    } else {
      one["text"] = c.first_chunk ? shape_.echo_text + r.text() : r.text();
    }
    c.first_chunk = false;
    // The text chunk of a piece that was all tool-call markup is empty:
    // skipped when call deltas follow.
    if (chat_ && i == 0 && chunks > 1 && piece.content.empty() &&
        !one["delta"].contains("role") && top_n_ < 0) {
      continue;
    }
    Json chunk = Envelope(Json::array({one}));
    // With n > 1 the request's usage is in the include_usage chunk only.
    if (r.has_usage() && n_ == 1 && i + 1 == chunks) {
      chunk["usage"] = UsageJson(r.usage());
    }
    if (!Send(chunk)) return false;
  }
  return true;
}

bool CompletionWriter::Send(const Json& chunk) {
  if (!started_) {
    started_ = true;
    if (!response_.Start(200, "text/event-stream")) return false;
  }
  return response_.Write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
}

Json CompletionWriter::Envelope(Json choices) const {
  return {{"id", head_.id},
          {"object", head_.object},
          {"created", head_.created},
          {"model", head_.model},
          {"system_fingerprint", head_.fingerprint},
          {"choices", std::move(choices)}};
}

v1::Usage CompletionWriter::TotalUsage() const {
  v1::Usage u = choices_[0].usage;
  for (int i = 1; i < n_; ++i) {
    u.set_completion_tokens(u.completion_tokens() +
                            choices_[i].usage.completion_tokens());
  }
  return u;
}

Json CompletionWriter::UsageChunk() const {
  Json last = Envelope(Json::array());
  last["usage"] = UsageJson(TotalUsage());
  return last;
}

Json CompletionWriter::Body() const {
  Json out_choices = Json::array();
  for (int i = 0; i < n_; ++i) {
    const Choice& c = choices_[i];
    Json choice = {{"index", i},
                   {"finish_reason", c.finish_reason},
                   {"logprobs", top_n_ >= 0 ? c.logprobs : Json()}};
    if (chat_) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      // The reasoning (harmony's analysis channel) in the field DeepSeek's
      // API and vLLM use.
      if (!c.reasoning.empty()) {
        choice["message"]["reasoning_content"] = c.reasoning;
      }
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = Json();
        choice["message"]["tool_calls"] = c.tool_calls;
      }
    } else {
      choice["text"] = c.text;
      // vLLM puts a completion's prompt_logprobs in each choice.
      if (shape_.prompt_top_n >= 0) {
        choice["prompt_logprobs"] = vllm_prompt_logprobs_;
      }
    }
    out_choices.push_back(std::move(choice));
  }
  Json out = Envelope(std::move(out_choices));
  out["usage"] = UsageJson(TotalUsage());
  // ... and a chat's beside the choices.
  if (chat_ && shape_.prompt_top_n >= 0) {
    out["prompt_logprobs"] = vllm_prompt_logprobs_;
  }
  return out;
}

}  // namespace shardlm
