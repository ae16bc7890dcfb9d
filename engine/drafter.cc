#include "engine/drafter.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

// FNV-1a over the tokens [begin, end).
uint64_t HashOf(const int32_t* begin, const int32_t* end) {
  uint64_t h = 1469598103934665603ull;
  for (const int32_t* t = begin; t != end; ++t) {
    h ^= static_cast<uint32_t>(*t);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

NgramDrafter::NgramDrafter(int min_n, int max_n)
    : min_n_(min_n), max_n_(max_n), last_end_(max_n - min_n + 1) {}

std::vector<int32_t> NgramDrafter::Draft(absl::Span<const int32_t> tokens,
                                         int max_tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  const int32_t* t = tokens.data();
  // Index every n-gram that ends before the last token (the suffix looked
  // up below must find an earlier occurrence, not itself).
  for (int64_t e = indexed_ + 1; e < size; ++e) {
    for (int n = min_n_; n <= max_n_ && n <= e; ++n) {
      last_end_[n - min_n_][HashOf(t + e - n, t + e)] = e;
    }
  }
  indexed_ = std::max<int64_t>(indexed_, size - 1);
  if (max_tokens <= 0) return {};
  for (int n = std::min<int64_t>(max_n_, size - 1); n >= min_n_; --n) {
    const auto& index = last_end_[n - min_n_];
    const auto it = index.find(HashOf(t + size - n, t + size));
    if (it == index.end()) continue;
    const int64_t e = it->second;
    // A hash collision proposes nothing rather than a wrong guess.
    if (!std::equal(t + e - n, t + e, t + size - n)) continue;
    const int64_t end = std::min<int64_t>(size, e + max_tokens);
    return std::vector<int32_t>(t + e, t + end);
  }
  return {};
}

absl::Status SpeculationOptions::Validate() const {
  if (max_tokens < 1 || max_tokens > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-speculative-tokens must be in [1, 16], not ", max_tokens));
  }
  if (ngram_min < 1 || ngram_max < ngram_min || ngram_max > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ngram-min and --ngram-max must satisfy 1 <= min <= max <= 16, not ",
        ngram_min, " and ", ngram_max));
  }
  return absl::OkStatus();
}

std::unique_ptr<SequenceDrafter> SpeculationOptions::NewDrafter(
    const GenerateRequest& request) const {
  switch (method) {
    case Method::kNgram:
      return std::make_unique<NgramDrafter>(ngram_min, ngram_max);
    case Method::kCustom:
      return make_drafter ? make_drafter(request) : nullptr;
    case Method::kNone:
      break;
  }
  return nullptr;
}

absl::StatusOr<SpeculationOptions::Method> ParseSpeculationMethod(
    const std::string& name) {
  if (name == "none" || name.empty()) return SpeculationOptions::Method::kNone;
  if (name == "ngram") return SpeculationOptions::Method::kNgram;
  return absl::InvalidArgumentError(absl::StrCat(
      "--speculative: unknown method \"", name,
      "\" (none, ngram; a draft model and MTP heads are not built yet)"));
}

const char* SpeculationMethodName(SpeculationOptions::Method method) {
  switch (method) {
    case SpeculationOptions::Method::kNone:
      return "none";
    case SpeculationOptions::Method::kNgram:
      return "ngram";
    case SpeculationOptions::Method::kCustom:
      return "custom";
  }
  return "?";
}

}  // namespace shardlm
