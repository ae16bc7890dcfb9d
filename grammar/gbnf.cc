// ParseGbnf: the `grammar` extension's text format (grammar.h).
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "grammar/grammar.h"

namespace shardlm {
namespace {

// Limits on the text itself, before any rule is built.
constexpr size_t kMaxGbnfBytes = 64 * 1024;
constexpr int kMaxGbnfNesting = 32;  // Parenthesised groups.

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Run() {
    SkipSpace(true);
    while (pos_ < text_.size()) {
      std::string name;
      if (!Name(name)) return Error("a rule name");
      SkipSpace(false);
      if (text_.substr(pos_, 3) != "::=") return Error("'::='");
      pos_ += 3;
      const uint32_t rule = RuleId(name);
      if (defined_.contains(name)) {
        return Error(absl::StrCat("one definition of '", name, "'"));
      }
      defined_[name] = true;
      if (absl::Status s = Alternatives(rule, 0); !s.ok()) return s;
      if (pos_ < text_.size() && text_[pos_] != '\n') {
        return Error("the end of the line");
      }
      SkipSpace(true);
      if (absl::Status s = b_.CheckSize(); !s.ok()) return s;
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.contains("root")) {
      return absl::InvalidArgumentError("grammar: no rule named 'root'");
    }
    for (const auto& [name, id] : ids_) {
      if (!defined_.contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: rule '", name, "' is used but not defined"));
      }
    }
    absl::StatusOr<Grammar> g = std::move(b_).Build(root->second);
    if (!g.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: ", g.status().message()));
    }
    return g;
  }

 private:
  absl::Status Error(absl::string_view expected) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i)
      line += text_[i] == '\n';
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: line ", line, ": expected ", expected));
  }

  // Spaces, tabs and comments; newlines too when `newlines` (between
  // rules) or when the next non-space is a continuation ('|' or more
  // symbols are written on the next line, indented).
  void SkipSpace(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' ||
                 (c == '\n' && (newlines || Continues()))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  // After a newline: is the next line indented (a continuation)?
  bool Continues() const {
    const size_t next = pos_ + 1;
    return next < text_.size() && (text_[next] == ' ' || text_[next] == '\t');
  }

  bool Name(std::string& out) {
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
            text_[pos_] == '-' || text_[pos_] == '_')) {
      ++pos_;
    }
    out = std::string(text_.substr(start, pos_ - start));
    return !out.empty();
  }

  uint32_t RuleId(const std::string& name) {
    auto [it, inserted] = ids_.try_emplace(name, 0);
    if (inserted) it->second = b_.NewRule(name);
    return it->second;
  }

  // One byte of a literal or class, escapes decoded.
  absl::StatusOr<uint8_t> Char() {
    if (pos_ >= text_.size()) return Error("a character");
    const char c = text_[pos_++];
    if (c != '\\') return static_cast<uint8_t>(c);
    if (pos_ >= text_.size()) return Error("an escape");
    const char e = text_[pos_++];
    switch (e) {
      case 'n':
        return uint8_t{'\n'};
      case 't':
        return uint8_t{'\t'};
      case 'r':
        return uint8_t{'\r'};
      case '\\':
      case '"':
      case ']':
      case '[':
      case '-':
      case '^':
        return static_cast<uint8_t>(e);
      case 'x': {
        if (pos_ + 2 > text_.size() ||
            !std::isxdigit(static_cast<unsigned char>(text_[pos_])) ||
            !std::isxdigit(static_cast<unsigned char>(text_[pos_ + 1]))) {
          return Error("two hex digits after \\x");
        }
        const uint8_t v = static_cast<uint8_t>(
            std::stoi(std::string(text_.substr(pos_, 2)), nullptr, 16));
        pos_ += 2;
        return v;
      }
      default:
        return Error("a known escape (\\n \\t \\r \\\\ \\\" \\xHH)");
    }
  }

  absl::Status Alternatives(uint32_t rule, int nesting) {
    if (nesting > kMaxGbnfNesting) return Error("fewer nested groups");
    while (true) {
      std::vector<GrammarSymbol> seq;
      if (absl::Status s = Sequence(seq, nesting); !s.ok()) return s;
      b_.AddAlt(rule, std::move(seq));
      SkipSpace(false);
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        continue;
      }
      return absl::OkStatus();
    }
  }

  absl::Status Sequence(std::vector<GrammarSymbol>& seq, int nesting) {
    while (true) {
      SkipSpace(false);
      if (pos_ >= text_.size()) return absl::OkStatus();
      const char c = text_[pos_];
      GrammarSymbol sym;
      if (c == '"') {
        ++pos_;
        std::vector<GrammarSymbol> lit;
        while (pos_ < text_.size() && text_[pos_] != '"') {
          absl::StatusOr<uint8_t> b = Char();
          if (!b.ok()) return b.status();
          lit.push_back(b_.Byte(*b));
        }
        if (pos_ >= text_.size()) return Error("a closing '\"'");
        ++pos_;
        sym = b_.Seq(std::move(lit), "literal");
      } else if (c == '[') {
        ++pos_;
        const bool negate = pos_ < text_.size() && text_[pos_] == '^';
        if (negate) ++pos_;
        ByteSet set;
        while (pos_ < text_.size() && text_[pos_] != ']') {
          if (static_cast<unsigned char>(text_[pos_]) >= 0x80) {
            return Error("ASCII or \\xHH in a character class");
          }
          absl::StatusOr<uint8_t> lo = Char();
          if (!lo.ok()) return lo.status();
          uint8_t hi = *lo;
          if (pos_ + 1 < text_.size() && text_[pos_] == '-' &&
              text_[pos_ + 1] != ']') {
            ++pos_;
            absl::StatusOr<uint8_t> h = Char();
            if (!h.ok()) return h.status();
            hi = *h;
            if (hi < *lo) return Error("a range from low to high");
          }
          set.AddRange(*lo, hi);
        }
        if (pos_ >= text_.size()) return Error("a closing ']'");
        ++pos_;
        if (negate) {
          for (uint64_t& w : set.bits) w = ~w;
        }
        sym = b_.Bytes(set);
      } else if (c == '(') {
        ++pos_;
        const uint32_t group = b_.NewRule("group");
        if (absl::Status s = Alternatives(group, nesting + 1); !s.ok()) {
          return s;
        }
        SkipSpace(false);
        if (pos_ >= text_.size() || text_[pos_] != ')') return Error("')'");
        ++pos_;
        sym = b_.Ref(group);
      } else if (std::isalpha(static_cast<unsigned char>(c))) {
        std::string name;
        Name(name);
        sym = b_.Ref(RuleId(name));
      } else {
        return absl::OkStatus();  // '|', ')', a newline: the caller's.
      }
      if (pos_ < text_.size() &&
          (text_[pos_] == '*' || text_[pos_] == '+' || text_[pos_] == '?')) {
        const char op = text_[pos_++];
        sym = b_.Repeat(sym, op == '+' ? 1 : 0, op == '?' ? 1 : -1, "repeat");
      }
      seq.push_back(sym);
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
  absl::flat_hash_map<std::string, bool> defined_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(std::string_view text) {
  if (text.size() > kMaxGbnfBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: the grammar is ", text.size(),
                     " bytes; at most ", kMaxGbnfBytes, " are accepted"));
  }
  return GbnfParser(text).Run();
}

}  // namespace shardlm
