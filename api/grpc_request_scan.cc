#include "api/grpc_request_scan.h"

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLength = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Reads protobuf fields off `wire`, one at a time.
class WireReader {
 public:
  explicit WireReader(absl::string_view wire) : wire_(wire) {}

  bool done() const { return pos_ >= wire_.size(); }
  size_t pos() const { return pos_; }

  // The next field's number and wire type; for a length-delimited field
  // its bytes, for a varint its value. False when the bytes are malformed.
  bool Next(uint32_t* number, uint32_t* type, absl::string_view* bytes,
            uint64_t* value) {
    uint64_t tag;
    if (!Varint(&tag)) return false;
    *number = static_cast<uint32_t>(tag >> 3);
    *type = static_cast<uint32_t>(tag & 7);
    if (*number == 0 || (tag >> 3) > 0x1FFFFFFF) return false;
    switch (*type) {
      case kVarint:
        return Varint(value);
      case kFixed64:
        return Skip(8);
      case kFixed32:
        return Skip(4);
      case kLength: {
        uint64_t n;
        if (!Varint(&n) || n > wire_.size() - pos_) return false;
        *bytes = wire_.substr(pos_, n);
        pos_ += n;
        return true;
      }
      default:  // Groups: no client of this API sends them.
        return false;
    }
  }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= wire_.size()) return false;
      const uint8_t b = static_cast<uint8_t>(wire_[pos_++]);
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

 private:
  bool Skip(size_t n) {
    if (n > wire_.size() - pos_) return false;
    pos_ += n;
    return true;
  }

  absl::string_view wire_;
  size_t pos_ = 0;
};

absl::Status Malformed(absl::string_view message, size_t at) {
  return absl::InternalError(absl::StrCat(
      "the request is not a valid ", message, " (malformed at byte ", at, ")"));
}

// One field of a message on the wire; `end` is the offset just past it.
struct WireField {
  uint32_t number = 0, type = 0;
  absl::string_view bytes;  // kLength.
  uint64_t value = 0;       // kVarint, kFixed32, kFixed64.
  size_t end = 0;
};

// Calls f(field) for each field of `wire` in order, stopping at the first
// error f returns; a field that does not parse is `message` malformed.
template <typename F>
absl::Status ForEachField(absl::string_view wire, absl::string_view message,
                          F&& f) {
  WireReader r(wire);
  while (!r.done()) {
    WireField field;
    if (!r.Next(&field.number, &field.type, &field.bytes, &field.value)) {
      return Malformed(message, r.pos());
    }
    field.end = r.pos();
    if (absl::Status s = f(field); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckUtf8(absl::string_view s, absl::string_view field) {
  const size_t bad = FirstInvalidUtf8(s);
  if (bad == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is not valid UTF-8 (byte ", bad, ")"));
}

// Counts the varints of a packed repeated field; false when malformed: the
// last varint cut short, or one longer than 10 bytes (which libprotobuf
// refuses: the fuzzer found one that this scan passed).
bool CountPacked(absl::string_view bytes, int64_t* count) {
  int run = 0;  // Bytes of the varint being read.
  for (const char c : bytes) {
    if (++run > 10) return false;
    if ((static_cast<uint8_t>(c) & 0x80) == 0) {
      ++*count;
      run = 0;
    }
  }
  return run == 0;
}

struct Budget {
  const GrpcScanLimits& limits;
  int unknown = 0;
  // False once there are too many.
  bool AddUnknown() { return ++unknown <= limits.max_unknown_fields; }
  absl::Status TooManyUnknown() const {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", limits.max_unknown_fields,
                     " unknown fields in the request"));
  }
};

// A message of string fields (`names[i]` is field i + 1's; an empty name:
// a field of another kind), `path` naming it in errors: its wire and its
// strings' UTF-8 as libprotobuf's parse checks them (a nested message's bytes
// are parsed too: the fuzzer found a ToolCall of bytes that were none). Other
// fields, and known ones of another wire type, are unknown fields.
absl::Status ScanStrings(absl::string_view wire, absl::string_view message,
                         absl::string_view path,
                         std::initializer_list<absl::string_view> names,
                         Budget& budget) {
  return ForEachField(wire, message, [&](const WireField& f) {
    if (f.number >= 1 && f.number <= static_cast<int>(names.size())) {
      const absl::string_view name = names.begin()[f.number - 1];
      if (name.empty()) return absl::OkStatus();  // Not a string.
      if (f.type == kLength) {
        return CheckUtf8(f.bytes, absl::StrCat(path, ".", name));
      }
    }
    return budget.AddUnknown() ? absl::OkStatus() : budget.TooManyUnknown();
  });
}

// A ChatMessage (role 1, content 2, tool_calls 3, tool_call_id 4) at
// messages[index].
absl::Status ScanChatMessage(absl::string_view wire, int64_t index,
                             Budget& budget) {
  int64_t call = 0;
  const std::string path = absl::StrCat("messages[", index, "]");
  return ForEachField(wire, "shardlm.v1.ChatMessage", [&](const WireField& f) {
    if ((f.number == 1 || f.number == 2 || f.number == 4) &&
        f.type == kLength) {
      return CheckUtf8(f.bytes, absl::StrCat(path, ".",
                                             f.number == 1   ? "role"
                                             : f.number == 2 ? "content"
                                                             : "tool_call_id"));
    }
    if (f.number == 3 && f.type == kLength) {
      return ScanStrings(f.bytes, "shardlm.v1.ToolCall",
                         absl::StrCat(path, ".tool_calls[", call++, "]"),
                         {"id", "name", "arguments"}, budget);
    }
    return budget.AddUnknown() ? absl::OkStatus() : budget.TooManyUnknown();
  });
}

// A logit_bias map entry: key 1 (varint), value 2 (fixed32).
absl::Status ScanBiasEntry(absl::string_view wire, Budget& budget) {
  return ForEachField(
      wire, "shardlm.v1.SamplingParams.LogitBiasEntry",
      [&](const WireField& f) {
        const bool known = (f.number == 1 && f.type == kVarint) ||
                           (f.number == 2 && f.type == kFixed32);
        return known || budget.AddUnknown() ? absl::OkStatus()
                                            : budget.TooManyUnknown();
      });
}

// SamplingParams: temperature 1, top_p 3 and the penalties 5 to 7
// (fixed32), top_k 2 and seed 4 (varint), logit_bias 8 (map entries,
// counted against max_logit_bias before any is read); anything else is
// unknown.
absl::Status ScanSampling(absl::string_view wire, Budget& budget) {
  int64_t bias = 0;
  RETURN_IF_ERROR(
      ForEachField(wire, "shardlm.v1.SamplingParams", [&](const WireField& f) {
        const bool fixed =
            f.number == 1 || f.number == 3 || (f.number >= 5 && f.number <= 7);
        const bool known =
            (fixed && f.type == kFixed32) ||
            ((f.number == 2 || f.number == 4) && f.type == kVarint) ||
            (f.number == 8 && f.type == kLength);
        bias += f.number == 8 && known;
        return known || budget.AddUnknown() ? absl::OkStatus()
                                            : budget.TooManyUnknown();
      }));
  if (bias > budget.limits.max_logit_bias) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: at most ", budget.limits.max_logit_bias,
                     " logit_bias entries, got ", bias));
  }
  if (bias == 0) return absl::OkStatus();
  return ForEachField(wire, "shardlm.v1.SamplingParams",
                      [&](const WireField& f) {
                        return f.number == 8 && f.type == kLength
                                   ? ScanBiasEntry(f.bytes, budget)
                                   : absl::OkStatus();
                      });
}

// The counts of a GenerateRequest's repeated fields.
struct GenerateCounts {
  int64_t messages = 0, stops = 0, prompt_ids = 0, stop_ids = 0, resume_ids = 0;
};

constexpr absl::string_view kGenerate = "shardlm.v1.GenerateRequest";

// GenerateRequest's first pass: each known field's wire type, the repeated
// ones counted into `counts`, unknown fields against the budget.
absl::Status CountGenerateFields(absl::string_view wire, Budget& budget,
                                 GenerateCounts& counts) {
  return ForEachField(wire, kGenerate, [&](const WireField& f) {
    const uint32_t number = f.number, type = f.type;
    bool known = true;
    switch (number) {
      case 1:  // prompt
      case 4:  // sampling
        known = type == kLength;
        break;
      case 2:     // prompt_token_ids
      case 5:     // stop_token_ids
      case 20: {  // resume_token_ids
        int64_t* count = number == 2   ? &counts.prompt_ids
                         : number == 5 ? &counts.stop_ids
                                       : &counts.resume_ids;
        if (type == kLength) {
          if (!CountPacked(f.bytes, count)) return Malformed(kGenerate, f.end);
        } else if (type == kVarint) {
          ++*count;
        } else {
          known = false;
        }
        break;
      }
      case 3:   // max_tokens
      case 6:   // ignore_eos
      case 7:   // priority
      case 9:   // logprobs
      case 10:  // truncate_prompt_tokens
      case 12:  // min_tokens
      case 21:  // resume_position
      case 25:  // n
      case 26:  // prompt_logprobs
      case 28:  // enable_thinking
        known = type == kVarint;
        break;
      case 8:  // stop
        known = type == kLength;
        counts.stops += known;
        break;
      case 11:  // messages
        known = type == kLength;
        counts.messages += known;
        break;
      case 13:  // constraint (its sizes are checked after the parse)
      case 22:  // tools (counted and sized after the parse)
      case 23:  // tool_choice
      case 24:  // tool_choice_function
        known = type == kLength;
        break;
      default:
        known = false;
    }
    return known || budget.AddUnknown() ? absl::OkStatus()
                                        : budget.TooManyUnknown();
  });
}

// The counts against the limits, in the words of the service's checks.
absl::Status CheckGenerateCounts(const GenerateCounts& counts,
                                 const GrpcScanLimits& limits) {
  const auto too_many = [](int64_t got, int limit, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", limit, " ", what, ", got ", got));
  };
  if (counts.stops > limits.max_stop) {
    return too_many(counts.stops, limits.max_stop, "stop strings");
  }
  if (counts.prompt_ids > limits.max_prompt_token_ids) {
    return too_many(counts.prompt_ids, limits.max_prompt_token_ids,
                    "prompt_token_ids");
  }
  if (counts.resume_ids > limits.max_prompt_token_ids) {
    return too_many(counts.resume_ids, limits.max_prompt_token_ids,
                    "resume_token_ids");
  }
  if (counts.stop_ids > limits.max_stop_token_ids) {
    return too_many(counts.stop_ids, limits.max_stop_token_ids,
                    "stop_token_ids");
  }
  if (counts.messages > limits.max_messages) {
    return too_many(counts.messages, limits.max_messages, "messages");
  }
  return absl::OkStatus();
}

// GenerateRequest's second pass: its strings' UTF-8 and nested messages.
absl::Status ScanGenerateStrings(absl::string_view wire, Budget& budget) {
  int64_t message = 0, stop = 0, tool = 0;
  return ForEachField(wire, kGenerate, [&](const WireField& f) {
    if (f.type != kLength) return absl::OkStatus();
    switch (f.number) {
      case 1:
        return CheckUtf8(f.bytes, "prompt");
      case 8:
        return CheckUtf8(f.bytes, absl::StrCat("stop[", stop++, "]"));
      case 11:
        return ScanChatMessage(f.bytes, message++, budget);
      case 4:
        return ScanSampling(f.bytes, budget);
      case 13:  // OutputConstraint: json_object 1 (a bool), then strings.
        return ScanStrings(f.bytes, "shardlm.v1.OutputConstraint", "constraint",
                           {"", "json_schema", "grammar"}, budget);
      case 22:
        return ScanStrings(f.bytes, "shardlm.v1.Tool",
                           absl::StrCat("tools[", tool++, "]"),
                           {"name", "description", "parameters"}, budget);
      case 23:
        return CheckUtf8(f.bytes, "tool_choice");
      case 24:
        return CheckUtf8(f.bytes, "tool_choice_function");
      default:
        return absl::OkStatus();
    }
  });
}

}  // namespace

size_t FirstInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = p[i];
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;  // Overlong.
      if (b0 == 0xED) hi = 0x9F;  // Surrogates.
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;  // Overlong.
      if (b0 == 0xF4) hi = 0x8F;  // Past U+10FFFF.
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return absl::string_view::npos;
}

absl::Status ScanGenerateRequest(absl::string_view wire,
                                 const GrpcScanLimits& limits) {
  Budget budget{limits};
  GenerateCounts counts;
  // Counts first, cheaply; the strings' UTF-8 afterwards, so that a huge
  // count is refused without reading every element's bytes.
  RETURN_IF_ERROR(CountGenerateFields(wire, budget, counts));
  RETURN_IF_ERROR(CheckGenerateCounts(counts, limits));
  return ScanGenerateStrings(wire, budget);
}

absl::Status ScanTokenizeRequest(absl::string_view wire,
                                 const GrpcScanLimits& limits) {
  Budget budget{limits};
  return ForEachField(
      wire, "shardlm.v1.TokenizeRequest", [&](const WireField& f) {
        if (f.number == 1 && f.type == kLength) {
          return CheckUtf8(f.bytes, "text");
        }
        return budget.AddUnknown() ? absl::OkStatus() : budget.TooManyUnknown();
      });
}

}  // namespace shardlm
