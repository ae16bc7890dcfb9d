// A context-free grammar over bytes and its recognizer: what constrained
// decoding (response_format, the `grammar` field) checks output against.
//
// A grammar is a list of rules; a rule is a list of alternatives; an
// alternative is a sequence of symbols, each a byte set or a reference to a
// rule. The recognizer is a pushdown automaton in llama.cpp's style: a
// parse position is a stack of symbol positions whose top is the byte set
// to match next (or empty when the input may end there), and a recognizer
// state is the set of such stacks (several while alternatives are
// ambiguous). Left-recursive grammars are refused when built (their
// expansion would not terminate); everything else, recursion included, is
// recognized exactly.
#ifndef SHARDLM_GRAMMAR_GRAMMAR_H_
#define SHARDLM_GRAMMAR_GRAMMAR_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace shardlm {

// A set of bytes.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  friend bool operator==(const ByteSet&, const ByteSet&) = default;
};

// One symbol of an alternative, while a grammar is being built.
struct GrammarSymbol {
  bool is_rule = false;
  uint32_t id = 0;  // A rule id, or a byte-set id.
};

// Limits that keep a grammar's recognizer bounded whatever it is built
// from (a client's schema or grammar text).
inline constexpr int kMaxGrammarRules = 20'000;
inline constexpr int kMaxGrammarSymbols = 200'000;
// Stacks in one recognizer state, and symbols in one stack: beyond them a
// state is treated as a dead end (documented in docs/api.md).
inline constexpr size_t kMaxGrammarStacks = 512;
inline constexpr size_t kMaxGrammarStackDepth = 4096;

// An immutable, validated grammar (Build() refused left recursion, rules
// without alternatives and references to unknown rules). Thread-safe.
class Grammar {
 public:
  // A position: the index of a symbol in the flattened alternatives.
  using Stack = std::vector<uint32_t>;
  // A recognizer state: distinct stacks, sorted. Empty: a dead end (no
  // input is acceptable). An empty stack among them: the input so far is
  // a complete sentence.
  using State = std::vector<Stack>;

  // The state before any input.
  State Start() const;
  // The state after `byte`, appended to `out` (cleared first).
  void Advance(const State& state, uint8_t byte, State& out) const;
  // After `bytes`, in place; false (state left a dead end) when they do
  // not extend a valid prefix.
  bool AdvanceBytes(State& state, std::string_view bytes) const;
  // Advances one stack by a byte, appending the resulting stacks to `out`
  // unsorted (callers that need a State call Normalize).
  void AdvanceStack(const Stack& stack, uint8_t byte, State& out) const;
  static void Normalize(State& state);

  static bool IsComplete(const State& state);
  // Whether `text` is a whole sentence of the grammar.
  bool Accepts(std::string_view text) const;
  // Whether `text` is a prefix of some sentence.
  bool AcceptsPrefix(std::string_view text) const;

  int rules() const { return static_cast<int>(rule_alts_.size()); }
  int symbols() const { return static_cast<int>(symbols_.size()); }

 private:
  friend class GrammarBuilder;
  // A flattened symbol: a byte set, a rule reference, or the end of an
  // alternative.
  struct Symbol {
    enum Kind : uint8_t { kBytes, kRule, kEnd } kind = kEnd;
    uint32_t id = 0;
  };
  // Expands `stack` until its top is a byte set (or it is empty), appending
  // every result to `out`.
  void Expand(Stack& stack, State& out) const;

  std::vector<Symbol> symbols_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<uint32_t>> rule_alts_;  // Start of each alt.
  uint32_t root_ = 0;
};

// Builds a Grammar. Rules may be referenced before they are defined.
class GrammarBuilder {
 public:
  // A new rule with no alternatives yet; `name` is for error messages.
  uint32_t NewRule(std::string name);
  void AddAlt(uint32_t rule, std::vector<GrammarSymbol> alt);

  GrammarSymbol Bytes(const ByteSet& set);
  GrammarSymbol Byte(uint8_t b);
  GrammarSymbol Ref(uint32_t rule) { return {.is_rule = true, .id = rule}; }
  // A rule matching `text` literally.
  GrammarSymbol Literal(std::string_view text);
  // Appends the bytes of `text` to `alt`.
  void AppendLiteral(std::vector<GrammarSymbol>& alt, std::string_view text);
  // A rule: one alternative per entry.
  GrammarSymbol Choice(const std::vector<GrammarSymbol>& options,
                       std::string name = "choice");
  // A rule: `sym` repeated min..max times (max < 0: unbounded).
  GrammarSymbol Repeat(GrammarSymbol sym, int min, int max,
                       std::string name = "repeat");
  // A rule: `item` (sep item)* with min..max items (max < 0: unbounded).
  GrammarSymbol List(GrammarSymbol item, GrammarSymbol sep, int min, int max,
                     std::string name = "list");
  GrammarSymbol Empty();
  // A rule with the one alternative `seq`.
  GrammarSymbol Seq(std::vector<GrammarSymbol> seq, std::string name = "seq");

  int rules() const { return static_cast<int>(alts_.size()); }
  // Fails once the grammar outgrows kMaxGrammarRules or kMaxGrammarSymbols
  // (callers building from client input check it as they go).
  absl::Status CheckSize() const;

  // The grammar whose sentences are those of `root`; InvalidArgument for a
  // rule with no alternatives, an unknown reference, left recursion, or a
  // grammar over the size limits.
  absl::StatusOr<Grammar> Build(uint32_t root) &&;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<std::vector<GrammarSymbol>>> alts_;
  std::vector<ByteSet> byte_sets_;
  int64_t symbols_ = 0;
};

// Parses a GBNF-like grammar (llama.cpp's format, a subset):
//   root  ::= "{" ws item ("," ws item)* "}"   # comments
//   item  ::= [a-z]+ | "null"
// Rules `name ::= alternatives`; alternatives separated by `|`; a sequence
// of "literal" (escapes \n \t \r \\ \" \xHH), [byte class] (ranges, ^ to
// negate, the same escapes), rule names, ( groups ), each optionally
// followed by *, + or ?. The rule named `root` is the start. Classes and
// literals are over bytes (UTF-8 text in a literal is its bytes; a
// non-ASCII character in a class is refused). InvalidArgument naming the
// line for anything else.
absl::StatusOr<Grammar> ParseGbnf(std::string_view text);

}  // namespace shardlm

#endif  // SHARDLM_GRAMMAR_GRAMMAR_H_
