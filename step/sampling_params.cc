#include "step/sampling_params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

// Ascending and distinct.
bool Increasing(const std::vector<int32_t>& ids) {
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] <= ids[i - 1]) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0, got ", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  // Written so that NaN fails every range.
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "presence_penalty must be in [-2, 2], got ", p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frequency_penalty must be in [-2, 2], got ", p.frequency_penalty));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0 and finite, got ",
                     p.repetition_penalty));
  }
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxLogitBias,
                                                   " logit_bias entries, got ",
                                                   p.logit_bias.size()));
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBias& b = p.logit_bias[i];
    if (b.token < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ", b.token, " is not a token id (negative)"));
    }
    if (!(b.bias >= -100.0f && b.bias <= 100.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", b.token,
                       " must be in [-100, 100], got ", b.bias));
    }
    if (i > 0 && b.token <= p.logit_bias[i - 1].token) {
      return absl::InvalidArgumentError(
          "logit_bias must hold distinct tokens in ascending order");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSampleHistory(const SamplingParams& params,
                                   const SampleHistory& h, int64_t vocab) {
  for (const LogitBias& b : params.logit_bias) {
    if (b.token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias token ", b.token,
                       " is outside the vocabulary of ", vocab));
    }
  }
  if (h.counts.size() != h.tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample history has ", h.tokens.size(), " tokens but ",
                     h.counts.size(), " counts"));
  }
  if (!Increasing(h.tokens) || !Increasing(h.masked)) {
    return absl::InvalidArgumentError(
        "sample history tokens must be distinct and ascending");
  }
  const auto outside = [&](const std::vector<int32_t>& ids) {
    return !ids.empty() && (ids.front() < 0 || ids.back() >= vocab);
  };
  if (outside(h.tokens) || outside(h.masked)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample history names a token outside the vocabulary of ", vocab));
  }
  for (int32_t c : h.counts) {
    if (c < 0) {
      return absl::InvalidArgumentError("sample history has a negative count");
    }
  }
  if (!h.allowed.empty()) {
    if (static_cast<int64_t>(h.allowed.size()) != (vocab + 63) / 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample history's allowed mask has ", h.allowed.size(),
                       " words for a vocabulary of ", vocab));
    }
    const uint64_t tail = vocab % 64 == 0 ? 0 : ~0ull << (vocab % 64);
    if ((h.allowed.back() & tail) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample history allows a token outside the vocabulary of ", vocab));
    }
    if (std::all_of(h.allowed.begin(), h.allowed.end(),
                    [](uint64_t w) { return w == 0; })) {
      return absl::InvalidArgumentError(
          "sample history's allowed mask allows no token");
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
