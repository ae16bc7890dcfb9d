#include "launch/flags.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardlm {

void FlagSet::Add(std::string name, std::string* value, std::string help) {
  flags_.push_back({std::move(name), value, std::move(help),
                    value->empty() ? "" : absl::StrCat("\"", *value, "\"")});
}
void FlagSet::Add(std::string name, int64_t* value, std::string help) {
  flags_.push_back(
      {std::move(name), value, std::move(help), absl::StrCat(*value)});
}
void FlagSet::Add(std::string name, double* value, std::string help) {
  flags_.push_back(
      {std::move(name), value, std::move(help), absl::StrCat(*value)});
}
void FlagSet::Add(std::string name, bool* value, std::string help) {
  flags_.push_back(
      {std::move(name), value, std::move(help), *value ? "true" : "false"});
}

void FlagSet::Add(std::string name, std::vector<std::string>* values,
                  std::string help) {
  flags_.push_back({std::move(name), values,
                    absl::StrCat(std::move(help), "; repeatable"), ""});
}

absl::Status FlagSet::Set(Flag& flag, const std::string& text) {
  const auto bad = [&](const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, ": '", text, "' is not ", want));
  };
  if (auto* s = std::get_if<std::string*>(&flag.value)) {
    **s = text;
  } else if (auto* i = std::get_if<int64_t*>(&flag.value)) {
    if (!absl::SimpleAtoi(text, *i)) return bad("an integer");
  } else if (auto* d = std::get_if<double*>(&flag.value)) {
    if (!absl::SimpleAtod(text, *d) || !std::isfinite(**d)) {
      return bad("a number");
    }
  } else if (auto* b = std::get_if<bool*>(&flag.value)) {
    if (!absl::SimpleAtob(text, *b)) return bad("true or false");
  } else if (auto* v = std::get_if<std::vector<std::string>*>(&flag.value)) {
    (*v)->push_back(text);
  }
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = nullptr;
    for (Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (std::holds_alternative<bool*>(flag->value)) {
        value = "true";  // A bare boolean flag switches it on.
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Set(*flag, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat(usage_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, absl::StrFormat("  --%-22s %s", f.name, f.help));
    if (!f.default_text.empty()) {
      absl::StrAppend(&out, " (default ", f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace shardlm
