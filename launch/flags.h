// A small command-line parser for subcommands: `--name value` or
// `--name=value`, typed, with defaults and a generated usage text. Unknown
// flags and bad values are errors that name the flag.
#ifndef SHARDLM_LAUNCH_FLAGS_H_
#define SHARDLM_LAUNCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace shardlm {

class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  // Registers a flag bound to `*value`, whose current value is the default.
  void Add(std::string name, std::string* value, std::string help);
  void Add(std::string name, int64_t* value, std::string help);
  void Add(std::string name, double* value, std::string help);
  void Add(std::string name, bool* value, std::string help);
  // Repeatable: each occurrence appends its value.
  void Add(std::string name, std::vector<std::string>* values,
           std::string help);

  // Parses argv[first..argc). Positional arguments are collected in order.
  // InvalidArgument naming the flag on unknown flags or bad values.
  absl::Status Parse(int argc, char** argv, int first);
  const std::vector<std::string>& positional() const { return positional_; }
  bool help() const { return help_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::variant<std::string*, int64_t*, double*, bool*,
                 std::vector<std::string>*>
        value;
    std::string help;
    std::string default_text;
  };
  absl::Status Set(Flag& flag, const std::string& text);

  std::string usage_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_FLAGS_H_
