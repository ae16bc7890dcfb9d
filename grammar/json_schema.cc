#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

// Ordered: properties are generated in the schema's order.
using Json = nlohmann::ordered_json;
using Sym = GrammarSymbol;

constexpr int kMaxIntDigits = 15;
constexpr int64_t kMaxIntMagnitude = 999'999'999'999'999;  // 15 digits.

absl::Status Refuse(const std::string& path, auto&&... parts) {
  return absl::InvalidArgumentError(
      absl::StrCat("json_schema: ", parts..., " (at ", path, ")"));
}

// The deepest nesting of arrays and objects in `text`, read without
// parsing (so that a hostile schema is refused before any recursion).
int NestingDepth(std::string_view text) {
  int depth = 0, max = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max = std::max(max, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max;
}

bool IsAnnotation(std::string_view k) {
  return k == "title" || k == "description" || k == "$schema" || k == "$id" ||
         k == "default" || k == "examples" || k == "$comment" || k == "$defs" ||
         k == "definitions" || k == "deprecated" || k == "readOnly" ||
         k == "writeOnly";
}

bool IsSupported(std::string_view k) {
  static const char* const kKeywords[] = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "anyOf",
                                          "oneOf",
                                          "$ref",
                                          "nullable",
                                          "minLength",
                                          "maxLength"};
  for (const char* s : kKeywords) {
    if (k == s) return true;
  }
  return IsAnnotation(k);
}

// JSON Pointer unescaping of one reference token.
std::string Unescape(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      out += token[i + 1] == '1' ? '/' : '~';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(&root) {}

  absl::StatusOr<Grammar> Run() {
    absl::StatusOr<Sym> top = Compile(*root_, "#", 0);
    if (!top.ok()) return top.status();
    const uint32_t root = b_.NewRule("root");
    b_.AddAlt(root, {*top});
    absl::StatusOr<Grammar> g = std::move(b_).Build(root);
    if (!g.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("json_schema: ", g.status().message()));
    }
    return g;
  }

  // Any JSON value (for schemas `{}` / `true`, and json_object's members).
  Sym AnyValue() {
    if (any_value_) return *any_value_;
    const uint32_t value = b_.NewRule("value");
    any_value_ = b_.Ref(value);
    const Sym member =
        b_.Seq({String(), Ws(), b_.Byte(':'), Ws(), *any_value_}, "member");
    b_.AddAlt(value, {AnyObject(member)});
    b_.AddAlt(value, {Bracketed('[', *any_value_, 0, -1, ']')});
    b_.AddAlt(value, {String()});
    b_.AddAlt(value, {Number()});
    b_.AddAlt(value, {b_.Literal("true")});
    b_.AddAlt(value, {b_.Literal("false")});
    b_.AddAlt(value, {b_.Literal("null")});
    return *any_value_;
  }

  Sym AnyObject(Sym member) { return Bracketed('{', member, 0, -1, '}'); }

  // open ws (item (ws "," ws item)*)? ws close, with min..max items.
  Sym Bracketed(char open, Sym item, int min, int max, char close) {
    const Sym sep = b_.Seq({Ws(), b_.Byte(','), Ws()}, "comma");
    const Sym list = b_.List(item, sep, min, max, "items");
    return b_.Seq({b_.Byte(static_cast<uint8_t>(open)), Ws(), list, Ws(),
                   b_.Byte(static_cast<uint8_t>(close))},
                  "bracketed");
  }

  // "" | " " | "\n" [ \t]{0,20}: enough for compact and pretty JSON,
  // bounded so that a model cannot spend its tokens on whitespace.
  Sym Ws() {
    if (ws_) return *ws_;
    ByteSet indent;
    indent.Add(' ');
    indent.Add('\t');
    const Sym newline =
        b_.Seq({b_.Byte('\n'), b_.Repeat(b_.Bytes(indent), 0, 20, "indent")},
               "newline");
    ws_ = b_.Choice({b_.Empty(), b_.Byte(' '), newline}, "ws");
    return *ws_;
  }

  // One character inside a JSON string: printable ASCII but `"` and `\`,
  // a well-formed UTF-8 multi-byte sequence, or an escape.
  Sym StringChar() {
    if (string_char_) return *string_char_;
    const uint32_t r = b_.NewRule("char");
    ByteSet ascii;
    ascii.AddRange(0x20, 0x7f);
    ascii.bits[0x22 >> 6] &= ~(uint64_t{1} << (0x22 & 63));
    ascii.bits[0x5c >> 6] &= ~(uint64_t{1} << (0x5c & 63));
    b_.AddAlt(r, {b_.Bytes(ascii)});
    const auto range = [&](uint8_t lo, uint8_t hi) {
      ByteSet s;
      s.AddRange(lo, hi);
      return b_.Bytes(s);
    };
    const Sym cont = range(0x80, 0xbf);
    b_.AddAlt(r, {range(0xc2, 0xdf), cont});
    b_.AddAlt(r, {b_.Byte(0xe0), range(0xa0, 0xbf), cont});
    b_.AddAlt(r, {range(0xe1, 0xec), cont, cont});
    b_.AddAlt(r, {b_.Byte(0xed), range(0x80, 0x9f), cont});
    b_.AddAlt(r, {range(0xee, 0xef), cont, cont});
    b_.AddAlt(r, {b_.Byte(0xf0), range(0x90, 0xbf), cont, cont});
    b_.AddAlt(r, {range(0xf1, 0xf3), cont, cont, cont});
    b_.AddAlt(r, {b_.Byte(0xf4), range(0x80, 0x8f), cont, cont});
    ByteSet esc;
    for (char c : std::string_view("\"\\/bfnrt")) esc.Add(c);
    b_.AddAlt(r, {b_.Byte('\\'), b_.Bytes(esc)});
    const Sym hex = Hex();
    b_.AddAlt(r, {b_.Byte('\\'), b_.Byte('u'), hex, hex, hex, hex});
    string_char_ = b_.Ref(r);
    return *string_char_;
  }

  Sym Hex() {
    ByteSet h;
    h.AddRange('0', '9');
    h.AddRange('a', 'f');
    h.AddRange('A', 'F');
    return b_.Bytes(h);
  }

  Sym Digits(char lo, char hi) {
    ByteSet d;
    d.AddRange(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    return b_.Bytes(d);
  }

  Sym String(int min = 0, int max = -1) {
    if (min == 0 && max < 0 && string_) return *string_;
    const Sym s =
        b_.Seq({b_.Byte('"'), b_.Repeat(StringChar(), min, max), b_.Byte('"')},
               "string");
    if (min == 0 && max < 0) string_ = s;
    return s;
  }

  // "-"? ("0" | [1-9][0-9]{0,14})
  Sym Integer() {
    const Sym magnitude =
        b_.Choice({b_.Literal("0"),
                   b_.Seq({Digits('1', '9'),
                           b_.Repeat(Digits('0', '9'), 0, kMaxIntDigits - 1)})},
                  "magnitude");
    return b_.Seq({b_.Repeat(b_.Byte('-'), 0, 1), magnitude}, "integer");
  }

  Sym Fraction() {
    return b_.Seq({b_.Byte('.'), b_.Repeat(Digits('0', '9'), 1, 10)},
                  "fraction");
  }

  Sym Number() {
    if (number_) return *number_;
    ByteSet e, sign;
    e.Add('e');
    e.Add('E');
    sign.Add('+');
    sign.Add('-');
    const Sym exponent = b_.Seq({b_.Bytes(e), b_.Repeat(b_.Bytes(sign), 0, 1),
                                 b_.Repeat(Digits('0', '9'), 1, 3)},
                                "exponent");
    number_ = b_.Seq(
        {Integer(), b_.Repeat(Fraction(), 0, 1), b_.Repeat(exponent, 0, 1)},
        "number");
    return *number_;
  }

  // The decimal strings of [lo, hi] (0 <= lo <= hi, same length), as a
  // rule: the classic digit-by-digit split of a numeric range.
  Sym SameLengthRange(const std::string& lo, const std::string& hi) {
    const size_t n = lo.size();
    if (n == 1) return Digits(lo[0], hi[0]);
    const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    if (lo[0] == hi[0]) {
      return b_.Seq({b_.Byte(lo[0]), SameLengthRange(lo_rest, hi_rest)},
                    "range");
    }
    const std::string zeros(n - 1, '0'), nines(n - 1, '9');
    if (lo_rest == zeros && hi_rest == nines) {
      return b_.Seq(
          {Digits(lo[0], hi[0]), b_.Repeat(Digits('0', '9'), n - 1, n - 1)},
          "range");
    }
    std::vector<Sym> options;
    options.push_back(
        b_.Seq({b_.Byte(lo[0]), SameLengthRange(lo_rest, nines)}, "range"));
    if (lo[0] + 1 <= hi[0] - 1) {
      options.push_back(b_.Seq({Digits(lo[0] + 1, hi[0] - 1),
                                b_.Repeat(Digits('0', '9'), n - 1, n - 1)},
                               "range"));
    }
    options.push_back(
        b_.Seq({b_.Byte(hi[0]), SameLengthRange(zeros, hi_rest)}, "range"));
    return b_.Choice(options, "range");
  }

  // Decimal strings, no leading zeros, of [lo, hi] (0 <= lo <= hi).
  Sym NonNegativeRange(int64_t lo, int64_t hi) {
    std::vector<Sym> options;
    int64_t low = 0;  // The smallest number with `digits` digits.
    for (int digits = 1; digits <= kMaxIntDigits; ++digits) {
      const int64_t high = low == 0 ? 9 : low * 10 - 1;
      const int64_t a = std::max(lo, low), z = std::min(hi, high);
      if (a <= z) {
        options.push_back(
            SameLengthRange(std::to_string(a), std::to_string(z)));
      }
      low = low == 0 ? 10 : low * 10;
      if (low > hi) break;
    }
    return b_.Choice(options, "range");
  }

  // Integers in [lo, hi] (within +-kMaxIntMagnitude, lo <= hi).
  Sym IntegerRange(int64_t lo, int64_t hi) {
    std::vector<Sym> options;
    if (lo < 0) {
      options.push_back(b_.Seq(
          {b_.Byte('-'), NonNegativeRange(-std::min<int64_t>(hi, -1), -lo)},
          "negative"));
    }
    if (hi >= 0)
      options.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
    return b_.Choice(options, "integer-range");
  }

  struct Bounds {
    std::optional<double> min, max;
    bool exclusive_min = false, exclusive_max = false;
  };

  absl::StatusOr<Bounds> ReadBounds(const Json& s, const std::string& path) {
    Bounds b;
    const auto number = [&](const char* key,
                            std::optional<double>& out) -> absl::Status {
      if (!s.contains(key)) return absl::OkStatus();
      if (!s[key].is_number())
        return Refuse(path, "'", key, "' must be a number");
      out = s[key].get<double>();
      if (!std::isfinite(*out))
        return Refuse(path, "'", key, "' must be finite");
      return absl::OkStatus();
    };
    std::optional<double> emin, emax;
    if (absl::Status st = number("minimum", b.min); !st.ok()) return st;
    if (absl::Status st = number("maximum", b.max); !st.ok()) return st;
    if (absl::Status st = number("exclusiveMinimum", emin); !st.ok()) return st;
    if (absl::Status st = number("exclusiveMaximum", emax); !st.ok()) return st;
    if (emin && (!b.min || *emin >= *b.min)) {
      b.min = emin;
      b.exclusive_min = true;
    }
    if (emax && (!b.max || *emax <= *b.max)) {
      b.max = emax;
      b.exclusive_max = true;
    }
    return b;
  }

  absl::StatusOr<Sym> IntegerSchema(const Json& s, const std::string& path) {
    absl::StatusOr<Bounds> b = ReadBounds(s, path);
    if (!b.ok()) return b.status();
    if (!b->min && !b->max) return Integer();
    const double m = static_cast<double>(kMaxIntMagnitude);
    double lo = -m, hi = m;
    if (b->min) {
      lo = b->exclusive_min ? std::floor(*b->min) + 1 : std::ceil(*b->min);
    }
    if (b->max) {
      hi = b->exclusive_max ? std::ceil(*b->max) - 1 : std::floor(*b->max);
    }
    lo = std::max(lo, -m);
    hi = std::min(hi, m);
    if (lo > hi) {
      return Refuse(path, "no integer of at most ", kMaxIntDigits,
                    " digits lies within minimum/maximum");
    }
    return IntegerRange(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }

  // Numbers within bounds, exactly: whole numbers in range, and a fraction
  // only on a whole part whose entire unit interval is in range (so 4.5
  // is never written for maximum 4.6; a subset, never a violation). No
  // exponent when bounded.
  absl::StatusOr<Sym> NumberSchema(const Json& s, const std::string& path) {
    absl::StatusOr<Bounds> b = ReadBounds(s, path);
    if (!b.ok()) return b.status();
    if (!b->min && !b->max) return Number();
    const double m = static_cast<double>(kMaxIntMagnitude);
    const double min = b->min.value_or(-m - 1), max = b->max.value_or(m + 1);
    // Whole numbers: [ceil(min), floor(max)], one less at an exclusive end
    // that is whole.
    double lo = std::ceil(min), hi = std::floor(max);
    if (b->exclusive_min && lo == min) lo += 1;
    if (b->exclusive_max && hi == max) hi -= 1;
    lo = std::max(lo, -m);
    hi = std::min(hi, m);
    std::vector<Sym> options;
    if (lo <= hi) {
      options.push_back(
          IntegerRange(static_cast<int64_t>(lo), static_cast<int64_t>(hi)));
    }
    // i.f for i >= 0 lies in (i, i+1): needs min <= i and i + 1 <= max.
    const double pos_lo = std::max(0.0, std::ceil(min));
    const double pos_hi = std::min(m, std::floor(max) - 1);
    if (pos_lo <= pos_hi) {
      options.push_back(b_.Seq({NonNegativeRange(static_cast<int64_t>(pos_lo),
                                                 static_cast<int64_t>(pos_hi)),
                                Fraction()},
                               "fractional"));
    }
    // -i.f lies in (-(i+1), -i): needs min <= -(i+1) and -i <= max.
    const double neg_lo = std::max(0.0, std::ceil(-max));
    const double neg_hi = std::min(m, std::floor(-min) - 1);
    if (neg_lo <= neg_hi) {
      options.push_back(b_.Seq({b_.Byte('-'),
                                NonNegativeRange(static_cast<int64_t>(neg_lo),
                                                 static_cast<int64_t>(neg_hi)),
                                Fraction()},
                               "fractional"));
    }
    if (options.empty()) {
      return Refuse(path,
                    "minimum/maximum admit no number this server can write "
                    "(bounds narrower than one whole unit are not supported)");
    }
    return b_.Choice(options, "number-range");
  }

  Sym Date() {
    const Sym d28 = b_.Choice({b_.Seq({b_.Byte('0'), Digits('1', '9')}),
                               b_.Seq({b_.Byte('1'), Digits('0', '9')}),
                               b_.Seq({b_.Byte('2'), Digits('0', '8')})},
                              "day");
    const Sym d30 = b_.Choice({d28, b_.Literal("29"), b_.Literal("30")}, "day");
    const Sym d31 = b_.Choice({d30, b_.Literal("31")}, "day");
    std::vector<Sym> months;
    for (const char* mm : {"01", "03", "05", "07", "08", "10", "12"}) {
      months.push_back(b_.Seq({b_.Literal(mm), b_.Byte('-'), d31}));
    }
    for (const char* mm : {"04", "06", "09", "11"}) {
      months.push_back(b_.Seq({b_.Literal(mm), b_.Byte('-'), d30}));
    }
    months.push_back(b_.Seq({b_.Literal("02"), b_.Byte('-'), d28}));
    // Years 0001 to 9999 (year 0 is no date in RFC 3339's validators).
    const Sym digit = Digits('0', '9'), nonzero = Digits('1', '9');
    const Sym year = b_.Choice({b_.Seq({nonzero, digit, digit, digit}),
                                b_.Seq({b_.Byte('0'), nonzero, digit, digit}),
                                b_.Seq({b_.Literal("00"), nonzero, digit}),
                                b_.Seq({b_.Literal("000"), nonzero})},
                               "year");
    return b_.Seq({year, b_.Byte('-'), b_.Choice(months, "month-day")}, "date");
  }

  Sym DateTime() {
    const Sym hh = b_.Choice({b_.Seq({Digits('0', '1'), Digits('0', '9')}),
                              b_.Seq({b_.Byte('2'), Digits('0', '3')})},
                             "hour");
    const Sym mm = b_.Seq({Digits('0', '5'), Digits('0', '9')}, "minute");
    ByteSet sign;
    sign.Add('+');
    sign.Add('-');
    const Sym offset = b_.Choice(
        {b_.Literal("Z"), b_.Seq({b_.Bytes(sign), hh, b_.Byte(':'), mm})},
        "offset");
    const Sym frac = b_.Repeat(
        b_.Seq({b_.Byte('.'), b_.Repeat(Digits('0', '9'), 1, 6)}), 0, 1);
    return b_.Seq({Date(), b_.Byte('T'), hh, b_.Byte(':'), mm, b_.Byte(':'), mm,
                   frac, offset},
                  "date-time");
  }

  Sym Uuid() {
    const Sym h = Hex();
    const auto hexes = [&](int n) { return b_.Repeat(h, n, n); };
    return b_.Seq({hexes(8), b_.Byte('-'), hexes(4), b_.Byte('-'), hexes(4),
                   b_.Byte('-'), hexes(4), b_.Byte('-'), hexes(12)},
                  "uuid");
  }

  absl::StatusOr<int> Count(const Json& s, const char* key, int fallback,
                            const std::string& path) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return Refuse(path, "'", key, "' must be a non-negative integer");
    }
    if (v.get<int64_t>() > kMaxJsonSchemaRepeat) {
      return Refuse(path, "'", key, "' above ", kMaxJsonSchemaRepeat,
                    " is not supported");
    }
    return static_cast<int>(v.get<int64_t>());
  }

  absl::StatusOr<Sym> StringSchema(const Json& s, const std::string& path) {
    if (s.contains("format")) {
      if (!s["format"].is_string())
        return Refuse(path, "'format' must be a string");
      if (s.contains("minLength") || s.contains("maxLength")) {
        return Refuse(path,
                      "'minLength'/'maxLength' with 'format' is not supported");
      }
      const std::string f = s["format"].get<std::string>();
      Sym body;
      if (f == "date") {
        body = Date();
      } else if (f == "date-time") {
        body = DateTime();
      } else if (f == "uuid") {
        body = Uuid();
      } else {
        return Refuse(path, "format '", f,
                      "' is not supported (date, date-time, uuid are)");
      }
      return b_.Seq({b_.Byte('"'), body, b_.Byte('"')}, "formatted");
    }
    absl::StatusOr<int> min = Count(s, "minLength", 0, path);
    if (!min.ok()) return min.status();
    absl::StatusOr<int> max = Count(s, "maxLength", -1, path);
    if (!max.ok()) return max.status();
    if (*max >= 0 && *max < *min)
      return Refuse(path, "'maxLength' < 'minLength'");
    return String(*min, *max);
  }

  absl::StatusOr<Sym> ArraySchema(const Json& s, const std::string& path,
                                  int depth) {
    Sym item;
    if (s.contains("items")) {
      absl::StatusOr<Sym> i =
          Compile(s["items"], absl::StrCat(path, "/items"), depth + 1);
      if (!i.ok()) return i.status();
      item = *i;
    } else {
      item = AnyValue();
    }
    absl::StatusOr<int> min = Count(s, "minItems", 0, path);
    if (!min.ok()) return min.status();
    absl::StatusOr<int> max = Count(s, "maxItems", -1, path);
    if (!max.ok()) return max.status();
    if (*max >= 0 && *max < *min)
      return Refuse(path, "'maxItems' < 'minItems'");
    return Bracketed('[', item, *min, *max, ']');
  }

  absl::StatusOr<Sym> ObjectSchema(const Json& s, const std::string& path,
                                   int depth) {
    bool closed = false;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!a.is_boolean()) {
        return Refuse(path,
                      "'additionalProperties' must be true or false (a "
                      "schema is not supported)");
      }
      closed = !a.get<bool>();
    }
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty()) {
        return Refuse(path, "'required' without 'properties' is not supported");
      }
      if (closed) return b_.Literal("{}");
      AnyValue();  // Defines the member rules it uses.
      const Sym member =
          b_.Seq({String(), Ws(), b_.Byte(':'), Ws(), *any_value_}, "member");
      return AnyObject(member);
    }
    const Json& props = s["properties"];
    if (!props.is_object())
      return Refuse(path, "'properties' must be an object");
    std::vector<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array())
        return Refuse(path, "'required' must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Refuse(path, "'required' must hold strings");
        if (!props.contains(r.get<std::string>())) {
          return Refuse(path, "'required' names '", r.get<std::string>(),
                        "', which is not in 'properties'");
        }
        required.push_back(r.get<std::string>());
      }
    }
    // kv_i ::= "name" ws ":" ws value_i
    std::vector<Sym> kv;
    std::vector<bool> needed;
    for (const auto& [name, sub] : props.items()) {
      absl::StatusOr<Sym> value =
          Compile(sub, absl::StrCat(path, "/properties/", name), depth + 1);
      if (!value.ok()) return value.status();
      std::vector<Sym> seq;
      b_.AppendLiteral(seq, Json(name).dump());
      seq.insert(seq.end(), {Ws(), b_.Byte(':'), Ws(), *value});
      kv.push_back(b_.Seq(std::move(seq), "property"));
      needed.push_back(std::find(required.begin(), required.end(), name) !=
                       required.end());
      if (absl::Status st = b_.CheckSize(); !st.ok()) return st;
    }
    // rest[k][c]: properties k.. in order, the required ones present, with
    // a comma first when c (something came before).
    const size_t n = kv.size();
    const Sym comma = b_.Seq({Ws(), b_.Byte(','), Ws()}, "comma");
    std::vector<std::array<Sym, 2>> rest(n + 1);
    rest[n] = {b_.Empty(), b_.Empty()};
    for (size_t k = n; k-- > 0;) {
      for (int c = 0; c < 2; ++c) {
        const uint32_t r = b_.NewRule("properties");
        std::vector<Sym> take;
        if (c == 1) take.push_back(comma);
        take.push_back(kv[k]);
        take.push_back(rest[k + 1][1]);
        b_.AddAlt(r, std::move(take));
        if (!needed[k]) b_.AddAlt(r, {rest[k + 1][c]});
        rest[k][c] = b_.Ref(r);
      }
    }
    return b_.Seq({b_.Byte('{'), Ws(), rest[0][0], Ws(), b_.Byte('}')},
                  "object");
  }

  absl::StatusOr<Sym> Typed(const Json& s, const std::string& type,
                            const std::string& path, int depth) {
    if (type == "object") return ObjectSchema(s, path, depth);
    if (type == "array") return ArraySchema(s, path, depth);
    if (type == "string") return StringSchema(s, path);
    if (type == "integer") return IntegerSchema(s, path);
    if (type == "number") return NumberSchema(s, path);
    if (type == "boolean") {
      return b_.Choice({b_.Literal("true"), b_.Literal("false")}, "boolean");
    }
    if (type == "null") return b_.Literal("null");
    return Refuse(path, "type '", type, "' is not a JSON Schema type");
  }

  absl::StatusOr<Sym> Ref(const std::string& ref, const std::string& path,
                          int depth) {
    if (auto it = refs_.find(ref); it != refs_.end()) return b_.Ref(it->second);
    if (ref.empty() || ref[0] != '#') {
      return Refuse(path, "'$ref' '", ref,
                    "' is not supported (only local references, #/...)");
    }
    const Json* target = root_;
    std::string_view rest = std::string_view(ref).substr(1);
    while (!rest.empty()) {
      if (rest[0] != '/')
        return Refuse(path, "'$ref' '", ref, "' is malformed");
      rest.remove_prefix(1);
      const size_t slash = rest.find('/');
      const std::string token = Unescape(rest.substr(0, slash));
      rest = slash == std::string_view::npos ? "" : rest.substr(slash);
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else {
        return Refuse(path, "'$ref' '", ref, "' does not resolve");
      }
    }
    const uint32_t rule = b_.NewRule(ref);
    refs_[ref] = rule;
    absl::StatusOr<Sym> body = Compile(*target, ref, depth + 1);
    if (!body.ok()) return body.status();
    b_.AddAlt(rule, {*body});
    return b_.Ref(rule);
  }

  absl::StatusOr<Sym> Compile(const Json& s, const std::string& path,
                              int depth) {
    if (depth > kMaxJsonSchemaDepth) {
      return Refuse(path, "the schema nests (or refers) deeper than ",
                    kMaxJsonSchemaDepth, " levels");
    }
    if (absl::Status st = b_.CheckSize(); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("json_schema: ", st.message()));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValue();
      return Refuse(path, "the schema false admits no value");
    }
    if (!s.is_object()) return Refuse(path, "a schema must be an object");
    std::vector<std::string> constraints;
    for (const auto& [key, value] : s.items()) {
      if (!IsSupported(key)) {
        return Refuse(path, "'", key, "' is not supported");
      }
      if (!IsAnnotation(key)) constraints.push_back(key);
    }
    const auto alone = [&](const std::string& key) -> absl::Status {
      for (const std::string& k : constraints) {
        if (k != key) {
          return Refuse(path, "'", k, "' beside '", key, "' is not supported");
        }
      }
      return absl::OkStatus();
    };
    if (s.contains("$ref")) {
      if (absl::Status st = alone("$ref"); !st.ok()) return st;
      if (!s["$ref"].is_string())
        return Refuse(path, "'$ref' must be a string");
      return Ref(s["$ref"].get<std::string>(), path, depth);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (absl::Status st = alone(key); !st.ok()) return st;
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) {
        return Refuse(path, "'", key, "' must be a non-empty array");
      }
      std::vector<Sym> options;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<Sym> o =
            Compile(list[i], absl::StrCat(path, "/", key, "/", i), depth + 1);
        if (!o.ok()) return o.status();
        options.push_back(*o);
      }
      return b_.Choice(options, key);
    }
    if (s.contains("const") || s.contains("enum")) {
      std::vector<Sym> options;
      if (s.contains("const")) {
        options.push_back(b_.Literal(s["const"].dump()));
      } else {
        if (!s["enum"].is_array() || s["enum"].empty()) {
          return Refuse(path, "'enum' must be a non-empty array");
        }
        for (const Json& v : s["enum"]) options.push_back(b_.Literal(v.dump()));
      }
      return b_.Choice(options, "enum");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Refuse(path, "'type' must hold strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Refuse(path, "'type' must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else if (constraints.empty() ||
               (constraints.size() == 1 && constraints[0] == "nullable")) {
      return AnyValue();
    } else {
      return Refuse(path, "a schema with '", constraints[0],
                    "' needs a 'type'");
    }
    if (s.contains("nullable") && s["nullable"].is_boolean() &&
        s["nullable"].get<bool>() &&
        std::find(types.begin(), types.end(), "null") == types.end()) {
      types.push_back("null");
    }
    std::vector<Sym> options;
    for (const std::string& type : types) {
      absl::StatusOr<Sym> o = Typed(s, type, path, depth);
      if (!o.ok()) return o.status();
      options.push_back(*o);
    }
    return options.size() == 1 ? options[0] : b_.Choice(options, "types");
  }

  // Tool calls (CompileToolCalls): each call is `open` {"name": "NAME",
  // "arguments": ARGS} `close` (`arguments_key` in place of "arguments"
  // when given: Llama's "parameters"), NAME one of the tools' and ARGS valid
  // against that tool's parameters; one call, or several separated by
  // `separator`.
  absl::StatusOr<Grammar> RunToolCalls(const Json& spec) {
    const std::string open = spec.value("open", "");
    const std::string close = spec.value("close", "");
    std::vector<Sym> calls;
    for (const Json& tool : spec["tools"]) {
      const std::string where = absl::StrCat("tools[", tool.value("index", 0),
                                             "].function.parameters");
      const Json& params = tool["parameters"];
      absl::StatusOr<Sym> args;
      if (params.is_null()) {
        args = AnyObject(
            b_.Seq({String(), Ws(), b_.Byte(':'), Ws(), AnyValue()}, "member"));
      } else {
        // A tool's references resolve in its own schema.
        if (NestingDepth(params.dump()) > kMaxJsonSchemaDepth) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": the schema nests deeper than ",
                           kMaxJsonSchemaDepth, " levels"));
        }
        root_ = &params;
        refs_.clear();
        args = Compile(params, "#", 0);
      }
      if (!args.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", args.status().message()));
      }
      std::vector<Sym> seq;
      b_.AppendLiteral(
          seq,
          absl::StrCat(
              open, "{\"name\": ", Json(tool.value("name", "")).dump(), ", ",
              Json(spec.value("arguments_key", "arguments")).dump(), ": "));
      seq.push_back(*args);
      b_.AppendLiteral(seq, absl::StrCat("}", close));
      calls.push_back(b_.Seq(std::move(seq), "tool_call"));
    }
    if (calls.empty()) {
      return absl::InvalidArgumentError("tool calls: no function to call");
    }
    const Sym one = calls.size() == 1 ? calls[0] : b_.Choice(calls, "tool");
    const Sym top = spec.value("multiple", false)
                        ? b_.List(one, b_.Literal(spec.value("separator", "")),
                                  1, -1, "tool_calls")
                        : one;
    const uint32_t root = b_.NewRule("root");
    b_.AddAlt(root, {top});
    absl::StatusOr<Grammar> g = std::move(b_).Build(root);
    if (!g.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool calls: ", g.status().message()));
    }
    return g;
  }

 private:
  const Json* root_;  // What "#" refers to.
  GrammarBuilder b_;
  absl::flat_hash_map<std::string, uint32_t> refs_;
  std::optional<Sym> any_value_, ws_, string_char_, string_, number_;
};

}  // namespace

absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json) {
  if (schema_json.size() > kMaxJsonSchemaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: the schema is ", schema_json.size(),
                     " bytes; at most ", kMaxJsonSchemaBytes, " are accepted"));
  }
  if (const int depth = NestingDepth(schema_json);
      depth > kMaxJsonSchemaDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "json_schema: the schema nests ", depth, " levels deep; at most ",
        kMaxJsonSchemaDepth, " are accepted"));
  }
  const Json schema =
      Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("json_schema: the schema is not JSON");
  }
  return SchemaCompiler(schema).Run();
}

absl::StatusOr<Grammar> CompileToolCalls(std::string_view spec_json) {
  // A tool's schema sits 3 levels down: {"tools": [{"parameters": ...}]}.
  if (NestingDepth(spec_json) > kMaxJsonSchemaDepth + 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools: a function's parameters nest deeper than ",
                     kMaxJsonSchemaDepth, " levels"));
  }
  const Json spec = Json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object() || !spec.contains("tools") ||
      !spec["tools"].is_array()) {
    return absl::InvalidArgumentError("tool calls: a malformed specification");
  }
  for (const Json& tool : spec["tools"]) {
    if (!tool.is_object() || !tool.contains("parameters")) {
      return absl::InvalidArgumentError(
          "tool calls: a malformed specification");
    }
  }
  const Json none;
  return SchemaCompiler(none).RunToolCalls(spec);
}

Grammar JsonObjectGrammar() {
  absl::StatusOr<Grammar> g = CompileJsonSchema(R"({"type": "object"})");
  return *std::move(g);
}

}  // namespace shardlm
