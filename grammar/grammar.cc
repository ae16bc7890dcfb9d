#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardlm {

Grammar::State Grammar::Start() const {
  State out;
  for (uint32_t a : rule_alts_[root_]) {
    Stack s;
    if (symbols_[a].kind != Symbol::kEnd) s.push_back(a);
    Expand(s, out);
  }
  Normalize(out);
  return out;
}

void Grammar::Expand(Stack& stack, State& out) const {
  if (stack.size() > kMaxGrammarStackDepth) return;  // A dead end.
  if (stack.empty() || symbols_[stack.back()].kind == Symbol::kBytes) {
    out.push_back(stack);
    return;
  }
  const uint32_t top = stack.back();
  const uint32_t rule = symbols_[top].id;
  stack.pop_back();
  if (symbols_[top + 1].kind != Symbol::kEnd) stack.push_back(top + 1);
  const std::vector<uint32_t>& alts = rule_alts_[rule];
  for (size_t i = 0; i < alts.size(); ++i) {
    const uint32_t a = alts[i];
    const bool last = i + 1 == alts.size();
    // The last alternative takes the stack itself (no copy).
    Stack copy;
    Stack& s = last ? stack : (copy = stack);
    if (symbols_[a].kind != Symbol::kEnd) s.push_back(a);
    Expand(s, out);
  }
}

void Grammar::AdvanceStack(const Stack& stack, uint8_t byte, State& out) const {
  if (stack.empty()) return;
  const uint32_t top = stack.back();
  if (!byte_sets_[symbols_[top].id].Has(byte)) return;
  Stack next(stack.begin(), stack.end() - 1);
  if (symbols_[top + 1].kind != Symbol::kEnd) next.push_back(top + 1);
  Expand(next, out);
}

void Grammar::Normalize(State& state) {
  std::sort(state.begin(), state.end());
  state.erase(std::unique(state.begin(), state.end()), state.end());
  // Past the limit, the extra parses are dropped: fewer outputs stay
  // possible, never an invalid one.
  if (state.size() > kMaxGrammarStacks) state.resize(kMaxGrammarStacks);
}

void Grammar::Advance(const State& state, uint8_t byte, State& out) const {
  out.clear();
  for (const Stack& s : state) AdvanceStack(s, byte, out);
  Normalize(out);
}

bool Grammar::AdvanceBytes(State& state, std::string_view bytes) const {
  State next;
  for (char c : bytes) {
    Advance(state, static_cast<uint8_t>(c), next);
    state.swap(next);
    if (state.empty()) return false;
  }
  return true;
}

bool Grammar::IsComplete(const State& state) {
  return std::any_of(state.begin(), state.end(),
                     [](const Stack& s) { return s.empty(); });
}

bool Grammar::Accepts(std::string_view text) const {
  State s = Start();
  return AdvanceBytes(s, text) && IsComplete(s);
}

bool Grammar::AcceptsPrefix(std::string_view text) const {
  State s = Start();
  return !s.empty() && AdvanceBytes(s, text);
}

uint32_t GrammarBuilder::NewRule(std::string name) {
  names_.push_back(std::move(name));
  alts_.emplace_back();
  return static_cast<uint32_t>(alts_.size() - 1);
}

void GrammarBuilder::AddAlt(uint32_t rule, std::vector<GrammarSymbol> alt) {
  symbols_ += static_cast<int64_t>(alt.size()) + 1;
  alts_[rule].push_back(std::move(alt));
}

GrammarSymbol GrammarBuilder::Bytes(const ByteSet& set) {
  for (size_t i = 0; i < byte_sets_.size(); ++i) {
    if (byte_sets_[i] == set) return {.is_rule = false, .id = uint32_t(i)};
  }
  byte_sets_.push_back(set);
  return {.is_rule = false, .id = uint32_t(byte_sets_.size() - 1)};
}

GrammarSymbol GrammarBuilder::Byte(uint8_t b) {
  ByteSet set;
  set.Add(b);
  return Bytes(set);
}

void GrammarBuilder::AppendLiteral(std::vector<GrammarSymbol>& alt,
                                   std::string_view text) {
  for (char c : text) alt.push_back(Byte(static_cast<uint8_t>(c)));
}

GrammarSymbol GrammarBuilder::Literal(std::string_view text) {
  std::vector<GrammarSymbol> alt;
  AppendLiteral(alt, text);
  return Seq(std::move(alt), "literal");
}

GrammarSymbol GrammarBuilder::Seq(std::vector<GrammarSymbol> seq,
                                  std::string name) {
  const uint32_t r = NewRule(std::move(name));
  AddAlt(r, std::move(seq));
  return Ref(r);
}

GrammarSymbol GrammarBuilder::Empty() { return Seq({}, "empty"); }

GrammarSymbol GrammarBuilder::Choice(const std::vector<GrammarSymbol>& options,
                                     std::string name) {
  const uint32_t r = NewRule(std::move(name));
  for (const GrammarSymbol& o : options) AddAlt(r, {o});
  return Ref(r);
}

GrammarSymbol GrammarBuilder::Repeat(GrammarSymbol sym, int min, int max,
                                     std::string name) {
  std::vector<GrammarSymbol> seq(static_cast<size_t>(std::max(min, 0)), sym);
  if (max < 0) {
    // tail ::= sym tail | (empty)
    const uint32_t tail = NewRule(name + "-tail");
    AddAlt(tail, {sym, Ref(tail)});
    AddAlt(tail, {});
    seq.push_back(Ref(tail));
  } else if (max > min) {
    // opt_k ::= sym opt_(k-1) | (empty), opt_0 ::= (empty): up to k more.
    uint32_t opt = NewRule(name + "-opt");
    AddAlt(opt, {});
    for (int k = 1; k <= max - min; ++k) {
      const uint32_t next = NewRule(name + "-opt");
      AddAlt(next, {sym, Ref(opt)});
      AddAlt(next, {});
      opt = next;
    }
    seq.push_back(Ref(opt));
  }
  return Seq(std::move(seq), std::move(name));
}

GrammarSymbol GrammarBuilder::List(GrammarSymbol item, GrammarSymbol sep,
                                   int min, int max, std::string name) {
  if (max == 0) return Empty();
  const GrammarSymbol more =
      Repeat(Seq({sep, item}, name + "-item"), std::max(min - 1, 0),
             max < 0 ? -1 : max - 1, name + "-more");
  const GrammarSymbol some = Seq({item, more}, name);
  return min > 0 ? some : Choice({some, Empty()}, name);
}

absl::Status GrammarBuilder::CheckSize() const {
  if (alts_.size() > kMaxGrammarRules || symbols_ > kMaxGrammarSymbols) {
    return absl::InvalidArgumentError(
        absl::StrCat("the grammar is too large (", alts_.size(), " rules, ",
                     symbols_, " symbols; at most ", kMaxGrammarRules, " and ",
                     kMaxGrammarSymbols, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Grammar> GrammarBuilder::Build(uint32_t root) && {
  if (absl::Status s = CheckSize(); !s.ok()) return s;
  const size_t n = alts_.size();
  if (root >= n) return absl::InvalidArgumentError("no root rule");
  for (size_t r = 0; r < n; ++r) {
    if (alts_[r].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule '", names_[r], "' is used but never defined"));
    }
    for (const auto& alt : alts_[r]) {
      for (const GrammarSymbol& s : alt) {
        if (s.is_rule ? s.id >= n : s.id >= byte_sets_.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("rule '", names_[r], "' refers to an unknown rule"));
        }
      }
    }
  }
  // Which rules can match nothing (to a fixed point).
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : alts_[r]) {
        if (std::all_of(alt.begin(), alt.end(), [&](const GrammarSymbol& s) {
              return s.is_rule && nullable[s.id];
            })) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a rule reachable from itself through leftmost
  // references (past nullable ones) would expand forever.
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done.
  std::string cycle;
  std::function<bool(size_t)> visit = [&](size_t r) {
    color[r] = 1;
    for (const auto& alt : alts_[r]) {
      for (const GrammarSymbol& s : alt) {
        if (!s.is_rule) break;
        if (color[s.id] == 1) {
          cycle = names_[s.id];
          return false;
        }
        if (color[s.id] == 0 && !visit(s.id)) return false;
        if (!nullable[s.id]) break;
      }
    }
    color[r] = 2;
    return true;
  };
  for (size_t r = 0; r < n; ++r) {
    if (color[r] == 0 && !visit(r)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rule '", cycle,
          "' is left-recursive (it can reach itself before any byte)"));
    }
  }
  Grammar g;
  g.byte_sets_ = std::move(byte_sets_);
  g.rule_alts_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : alts_[r]) {
      g.rule_alts_[r].push_back(static_cast<uint32_t>(g.symbols_.size()));
      for (const GrammarSymbol& s : alt) {
        g.symbols_.push_back({.kind = s.is_rule ? Grammar::Symbol::kRule
                                                : Grammar::Symbol::kBytes,
                              .id = s.id});
      }
      g.symbols_.push_back({.kind = Grammar::Symbol::kEnd, .id = 0});
    }
  }
  g.root_ = root;
  return g;
}

}  // namespace shardlm
