// The answer to one /v1/completions or /v1/chat/completions request
// (api/openai_api.h serves them), from the service's responses: the n
// choices streamed as server-sent chunks, or accumulated into one body.
// Include only from api/*.cc.
#ifndef SHARDLM_API_COMPLETION_WRITER_H_
#define SHARDLM_API_COMPLETION_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/openai_protocol.h"
#include "model/chat_template.h"
#include "model/tool_calls.h"
#include "shardlm/v1/inference.pb.h"

namespace shardlm {

class HttpResponse;

// Calls to Write are serialized by the caller (with n > 1 they come from
// several threads); the rest runs after the request ended.
class CompletionWriter {
 public:
  // What every chunk (and the whole body) starts with.
  struct Head {
    std::string id;
    const char* object;  // "text_completion", "chat.completion(.chunk)".
    int64_t created;     // Unix seconds.
    std::string model;
    // What computed the answer (OpenAI's system_fingerprint).
    std::string fingerprint;
  };
  // How a chat's output is parsed (OpenAiApi::ParsingFor): the tools it may
  // call (none for completions) and the template's formats.
  struct Parsing {
    std::vector<std::string> names;
    ToolCallFormat format = ToolCallFormat::kHermes;
    ReasoningFormat reasoning = ReasoningFormat::kNone;
  };

  // `response` is not owned and must outlive the writer; streamed chunks
  // go to it, the first one starting it (200, text/event-stream). Streamed
  // tool calls are named `call_id_prefix`, the choice and their index.
  CompletionWriter(bool chat, bool stream, int n,
                   const openai_wire::ResponseShape& shape,
                   const Parsing& parsing, Head head,
                   std::string call_id_prefix, HttpResponse& response);

  // One response of the service (a CompletionRunner's `write`): false when
  // its index is out of range or the client is gone.
  bool Write(const v1::GenerateResponse& r);

  // Whether the stream's status line went out (an error then goes in the
  // stream).
  bool started() const { return started_; }
  // include_usage's last chunk: no choices, the request's usage.
  openai_wire::Json UsageChunk() const;
  // The whole answer, when not streamed.
  openai_wire::Json Body() const;

 private:
  // What each of the n choices accumulates (the whole answer when not
  // streamed). Tool calls: the service parses them (the last response
  // carries them); the same parser here keeps their markup out of the
  // content.
  struct Choice {
    std::string text;
    openai_wire::Json logprobs;
    int64_t text_offset = 0;
    std::string finish_reason;
    bool first_chunk = true;
    std::optional<ToolCallStream> tool_filter;
    std::string reasoning;  // Unstreamed answers' reasoning.
    openai_wire::Json tool_calls = openai_wire::Json::array();
    int streamed_calls = 0;        // Tool calls sent as deltas so far.
    bool echoed_logprobs = false;  // The prompt's logprobs are in.
    v1::Usage usage;
  };
  // Each takes `piece`: `r`'s text (content), reasoning (harmony's
  // analysis, Qwen3's <think>) and the calls whose </tool_call> came with
  // it, as the choice's parser split them.
  //
  // The logprobs `r`'s piece of choice `c` starts from: the prompt's first
  // (echo with logprobs), else none.
  openai_wire::Json Lead(const v1::GenerateResponse& r, Choice& c);
  // Not streamed: the piece joins the choice.
  void Accumulate(const v1::GenerateResponse& r, Choice& c,
                  const ToolCallEvents& piece, openai_wire::Json lead);
  // Streamed: the piece as chunks, the text first (with the logprobs),
  // then the call deltas; the last chunk has the finish_reason and usage.
  bool StreamChunks(const v1::GenerateResponse& r, Choice& c,
                    const ToolCallEvents& piece, openai_wire::Json lead);
  // The deltas of the calls that closed with `r`, as OpenAI streams them.
  std::vector<openai_wire::Json> CallDeltas(const v1::GenerateResponse& r,
                                            Choice& c,
                                            const ToolCallEvents& piece) const;
  // `chunk` as a server-sent event (the stream started first); false when
  // the client is gone.
  bool Send(const openai_wire::Json& chunk);
  // The fields of Head, with `choices`.
  openai_wire::Json Envelope(openai_wire::Json choices) const;
  // One usage for the request: the prompt once, every choice's tokens.
  v1::Usage TotalUsage() const;

  const bool chat_;
  const bool stream_;
  const int n_;
  const openai_wire::ResponseShape shape_;
  const int top_n_;
  // echo with logprobs: the prompt's, from the request's first response
  // (whichever choice's), lead every choice's logprobs.
  const bool echo_logprobs_;
  const Head head_;
  const std::string call_id_prefix_;
  HttpResponse& response_;
  std::vector<Choice> choices_;
  bool started_ = false;
  // The prompt's logprobs (echo) and vLLM's prompt_logprobs, from the
  // request's first response.
  openai_wire::Json prompt_logprobs_, vllm_prompt_logprobs_;
};

}  // namespace shardlm

#endif  // SHARDLM_API_COMPLETION_WRITER_H_
