#include "api/openai_request_scan.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;

// Labels that name a container by where it sits: "stop",
// "messages[].content", ...; only containers in the first levels are
// labelled, deeper ones share "nested" (their limit is the generic one).
constexpr size_t kLabelledDepth = 4;
constexpr size_t kMaxKeyInLabel = 64;

// A SAX handler that counts and keeps nothing but one frame per open
// container (at most max_depth of them).
class CountingHandler {
 public:
  explicit CountingHandler(const OpenAiScanLimits& limits) : limits_(limits) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(Json::number_integer_t) { return Value(); }
  bool number_unsigned(Json::number_unsigned_t) { return Value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) {
    return Value();
  }
  bool string(Json::string_t&) { return Value(); }
  bool binary(Json::binary_t&) { return Value(); }
  bool start_object(size_t) { return Open(/*object=*/true); }
  bool end_object() { return Close(); }
  bool start_array(size_t) { return Open(/*object=*/false); }
  bool end_array() { return Close(); }
  bool key(Json::string_t& k) {
    Frame& f = frames_.back();
    if (++f.count > f.limit) return Refuse(f);
    if (frames_.size() < kLabelledDepth) {
      f.key.assign(k, 0, std::min(k.size(), kMaxKeyInLabel));
    }
    return true;
  }
  bool parse_error(size_t, const std::string&,
                   const nlohmann::detail::exception&) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError("the body is not a JSON object");
    }
    return false;
  }

  const absl::Status& status() const { return status_; }
  const OpenAiScanStats& stats() const { return stats_; }

 private:
  struct Frame {
    bool object;
    size_t count = 0;  // Keys of an object, elements of an array.
    size_t limit;
    const char* noun;  // What a refusal calls the elements; null: generic.
    std::string label;
    std::string key;  // An object's current key (labelled levels only).
  };

  // Counts one value in the whole body and, in an array, in its parent
  // (an object's values were counted by their keys).
  bool Value() {
    if (++stats_.values > limits_.max_values) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          "at most ", limits_.max_values, " JSON values in the body"));
      return false;
    }
    if (!frames_.empty() && !frames_.back().object) {
      Frame& f = frames_.back();
      if (++f.count > f.limit) return Refuse(f);
    }
    return true;
  }

  bool Open(bool object) {
    if (!Value()) return false;
    if (static_cast<int>(frames_.size()) >= limits_.max_depth) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("the body nests deeper than ", limits_.max_depth));
      return false;
    }
    std::string label;
    if (frames_.empty()) {
      label = "";  // The body itself.
    } else if (frames_.size() >= kLabelledDepth) {
      label = "nested";
    } else {
      const Frame& p = frames_.back();
      label = p.object ? (p.label.empty() ? p.key
                                          : absl::StrCat(p.label, ".", p.key))
                       : absl::StrCat(p.label, "[]");
    }
    const char* noun;
    const size_t limit = LimitFor(label, &noun);
    frames_.push_back({object, 0, limit, noun, std::move(label), {}});
    stats_.max_depth =
        std::max(stats_.max_depth, static_cast<int>(frames_.size()));
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  // The limit of a container labelled `label`, and what its elements are
  // called in a refusal (the gRPC API's words where it has the same limit).
  size_t LimitFor(const std::string& label, const char** noun) const {
    *noun = nullptr;
    if (label == "stop") return *noun = "stop strings", limits_.max_stop;
    if (label == "messages") return *noun = "messages", limits_.max_messages;
    if (label == "prompt")
      return *noun = "prompt token ids", limits_.max_prompt;
    if (label == "logit_bias") {
      return *noun = "logit_bias entries", limits_.max_logit_bias;
    }
    if (label == "tools") return *noun = "tools", limits_.max_tools;
    if (label == "messages[].content") {
      return *noun = "content parts", limits_.max_content_parts;
    }
    return limits_.max_container;
  }

  bool Refuse(const Frame& f) {
    if (f.label.empty()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("at most ", f.limit, " fields in the body"));
    } else {
      const char* noun = f.noun ? f.noun : f.object ? "entries" : "items";
      status_ = absl::InvalidArgumentError(
          absl::StrCat("at most ", f.limit, " ", noun, " in '", f.label, "'"));
    }
    return false;
  }

  const OpenAiScanLimits& limits_;
  std::vector<Frame> frames_;
  OpenAiScanStats stats_;
  absl::Status status_;
};

}  // namespace

absl::Status ScanOpenAiRequest(absl::string_view body,
                               const OpenAiScanLimits& limits,
                               OpenAiScanStats* stats) {
  CountingHandler handler(limits);
  const bool ok = Json::sax_parse(body.begin(), body.end(), &handler,
                                  Json::input_format_t::json, /*strict=*/true);
  if (stats != nullptr) *stats = handler.stats();
  if (!handler.status().ok()) return handler.status();
  if (!ok) return absl::InvalidArgumentError("the body is not a JSON object");
  return absl::OkStatus();
}

}  // namespace shardlm
