#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("rope_scaling: ", Sv(field), " ", Sv(why)));
}

bool PositiveFinite(double v) { return v > 0 && std::isfinite(v); }

// YaRN's correction dimension: the pair index whose wavelength fits
// `rotations` turns into the original context.
double CorrectionDim(double rotations, int64_t head_dim, double theta,
                     int64_t original_context) {
  return head_dim *
         std::log(original_context / (rotations * 2 * std::numbers::pi)) /
         (2 * std::log(theta));
}

}  // namespace

const char* RopeScalingName(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
    case RopeScalingType::kDynamic:
      return "dynamic";
  }
  return "?";
}

absl::StatusOr<RopeScalingType> ParseRopeScalingType(std::string_view name) {
  if (name == "none" || name == "default") return RopeScalingType::kNone;
  if (name == "linear") return RopeScalingType::kLinear;
  if (name == "llama3") return RopeScalingType::kLlama3;
  if (name == "yarn") return RopeScalingType::kYarn;
  if (name == "dynamic") return RopeScalingType::kDynamic;
  return absl::NotFoundError(absl::StrCat(
      "RoPE scaling type '", Sv(name),
      "' is not supported (linear, llama3, yarn and dynamic are; longrope "
      "is not yet)"));
}

absl::Status ValidateRopeScaling(const RopeScaling& s, int64_t head_dim) {
  if (s.type != RopeScalingType::kNone &&
      (!PositiveFinite(s.factor) || s.factor < 1 || s.factor > 1e4)) {
    return Bad("factor", absl::StrCat("= ", s.factor, " is outside [1, 1e4]"));
  }
  if (s.type == RopeScalingType::kLlama3 || s.type == RopeScalingType::kYarn ||
      s.type == RopeScalingType::kDynamic) {
    if (s.original_context < 1 || s.original_context > (int64_t{1} << 24)) {
      return Bad(
          "original_max_position_embeddings",
          absl::StrCat("= ", s.original_context, " is outside [1, 2^24]"));
    }
  }
  if (s.type == RopeScalingType::kLlama3 &&
      !(PositiveFinite(s.low_freq_factor) &&
        PositiveFinite(s.high_freq_factor) &&
        s.high_freq_factor > s.low_freq_factor)) {
    return Bad("low_freq_factor/high_freq_factor",
               absl::StrCat("= ", s.low_freq_factor, "/", s.high_freq_factor,
                            ": both must be positive, high above low"));
  }
  if (s.type == RopeScalingType::kDynamic && head_dim <= 2) {
    // The exponent d / (d - 2).
    return Bad("type",
               absl::StrCat("dynamic needs head_dim > 2, not ", head_dim));
  }
  if (s.type == RopeScalingType::kYarn) {
    if (!(PositiveFinite(s.beta_fast) && PositiveFinite(s.beta_slow))) {
      return Bad("beta_fast/beta_slow", "must be positive");
    }
    if (!(s.attention_factor >= 0 && std::isfinite(s.attention_factor))) {
      return Bad("attention_factor", "must be positive");
    }
  }
  if (!s.freq_factors.empty()) {
    if (static_cast<int64_t>(s.freq_factors.size()) != head_dim / 2) {
      return Bad("freq_factors", absl::StrCat("has ", s.freq_factors.size(),
                                              " values; the head has ",
                                              head_dim / 2, " pairs"));
    }
    for (float f : s.freq_factors) {
      if (!PositiveFinite(f)) {
        return Bad("freq_factors", absl::StrCat("holds ", f));
      }
    }
  }
  return absl::OkStatus();
}

RopeTable MakeRopeTable(RopeStyle style, float theta, int64_t head_dim,
                        const RopeScaling& s) {
  RopeTable t{.style = style, .theta = theta};
  const int64_t half = head_dim / 2;
  double base = theta;
  if (s.type == RopeScalingType::kDynamic) {
    // transformers' _compute_dynamic_ntk_parameters at seq_len = the
    // longest sequence served, factor * original_context:
    // (factor * seq_len / original - (factor - 1)) = factor^2 - factor + 1.
    const double d = static_cast<double>(head_dim);
    base *= std::pow(s.factor * s.factor - (s.factor - 1), d / (d - 2));
    t.theta = static_cast<float>(base);
  }
  t.inv_freq.resize(half);
  for (int64_t k = 0; k < half; ++k) {
    t.inv_freq[k] = std::pow(base, -2.0 * k / head_dim);
  }
  switch (s.type) {
    case RopeScalingType::kNone:
    case RopeScalingType::kDynamic:  // The base is scaled above.
      break;
    case RopeScalingType::kLinear:
      for (double& f : t.inv_freq) f /= s.factor;
      break;
    case RopeScalingType::kLlama3: {
      const double low_wavelen = s.original_context / s.low_freq_factor;
      const double high_wavelen = s.original_context / s.high_freq_factor;
      for (double& f : t.inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (s.original_context / wavelen - s.low_freq_factor) /
              (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScalingType::kYarn: {
      double low =
          CorrectionDim(s.beta_fast, head_dim, base, s.original_context);
      double high =
          CorrectionDim(s.beta_slow, head_dim, base, s.original_context);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(0.0, low);
      high = std::min(static_cast<double>(head_dim - 1), high);
      if (high == low) high += 0.001;
      for (int64_t k = 0; k < half; ++k) {
        // 1 keeps the trained frequency (fast rotations), 0 interpolates.
        const double extrapolate =
            1 - std::clamp((k - low) / (high - low), 0.0, 1.0);
        const double f = t.inv_freq[k];
        t.inv_freq[k] = f / s.factor * (1 - extrapolate) + f * extrapolate;
      }
      t.mscale = s.attention_factor > 0 ? s.attention_factor
                                        : 0.1 * std::log(s.factor) + 1.0;
      break;
    }
  }
  for (size_t k = 0; k < s.freq_factors.size() && k < t.inv_freq.size(); ++k) {
    t.inv_freq[k] /= s.freq_factors[k];
  }
  t.plain = (s.type == RopeScalingType::kNone ||
             s.type == RopeScalingType::kDynamic) &&
            s.freq_factors.empty();
  return t;
}

}  // namespace shardlm
