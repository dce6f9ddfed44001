#include "io/energon/brace_expand.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string_view>

#include "src/base/check.h"

namespace vlm::io {
namespace {

constexpr size_t kMaxExpansions = size_t(4) << 20;

// Thrown inside the parser; brace_expand turns it into a vlm::Error quoting the whole pattern.
struct Unbalanced {};
struct TooMany {};

using Alternatives = std::vector<std::string>;

// The cartesian product of `items` (each a list of alternatives), first item varying slowest.
Alternatives product(const std::vector<Alternatives>& items) {
  Alternatives out = {""};
  for (const Alternatives& alts : items) {
    if (alts.empty()) return {};
    if (out.size() > kMaxExpansions / alts.size()) throw TooMany{};
    Alternatives next;
    next.reserve(out.size() * alts.size());
    for (const std::string& prefix : out)
      for (const std::string& a : alts) next.push_back(prefix + a);
    out = std::move(next);
  }
  return out;
}

Alternatives expand_pattern(std::string_view p);

// Python's `$` also matches just before one trailing newline; range patterns inherit that.
std::string_view strip_one_newline(std::string_view s) {
  return !s.empty() && s.back() == '\n' ? s.substr(0, s.size() - 1) : s;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Consumes `-?\d+` (or `\d+` when allow_minus is false) at the front of s.
std::optional<std::string_view> take_number(std::string_view& s, bool allow_minus) {
  size_t i = (allow_minus && !s.empty() && s[0] == '-') ? 1 : 0;
  size_t j = i;
  while (j < s.size() && is_digit(s[j])) j++;
  if (j == i) return std::nullopt;
  std::string_view num = s.substr(0, j);
  s.remove_prefix(j);
  return num;
}

bool take_dots(std::string_view& s) {
  if (s.size() < 2 || s[0] != '.' || s[1] != '.') return false;
  s.remove_prefix(2);
  return true;
}

// The optional `..-?\d+` step suffix; returns its magnitude (0 when absent), or nullopt when
// the remainder is not exactly such a suffix. An oversized step saturates (it then yields
// only the first value, as Python's range does).
std::optional<int64_t> take_step(std::string_view& s) {
  if (s.empty()) return int64_t(0);
  if (!take_dots(s)) return std::nullopt;
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  auto digits = take_number(s, false);
  if (!digits || !s.empty()) return std::nullopt;
  int64_t v = 0;
  auto r = std::from_chars(digits->data(), digits->data() + digits->size(), v);
  if (r.ec == std::errc::result_out_of_range) v = std::numeric_limits<int64_t>::max();
  return v;
}

// `{N..M}` / `{N..M..S}` with integers; nullopt when expr is not an integer range.
std::optional<Alternatives> int_range(std::string_view expr) {
  std::string_view s = strip_one_newline(expr);
  auto a = take_number(s, true);
  if (!a || !take_dots(s)) return std::nullopt;
  auto b = take_number(s, true);
  if (!b) return std::nullopt;
  auto step = take_step(s);
  if (!step) return std::nullopt;

  auto padded = [](std::string_view n) {
    if (n == "0" || n == "-0") return false;
    return n.substr(0, 1) == "0" || n.substr(0, 2) == "-0";
  };
  int width = (padded(*a) || padded(*b)) ? int(std::max(a->size(), b->size())) : 0;
  int64_t lo = 0, hi = 0;
  auto ra = std::from_chars(a->data(), a->data() + a->size(), lo);
  auto rb = std::from_chars(b->data(), b->data() + b->size(), hi);
  VLM_CHECK(ra.ec == std::errc() && rb.ec == std::errc(), "brace range endpoint out of range in '{",
            expr, "}'");
  __int128 st = *step == 0 ? 1 : *step;
  __int128 first = lo, last = hi;
  __int128 count = (first < last ? (last - first) : (first - last)) / st + 1;
  if (count > __int128(kMaxExpansions)) throw TooMany{};
  Alternatives out;
  out.reserve(size_t(count));
  char buf[48];
  for (__int128 k = 0; k < count; k++) {
    int64_t v = int64_t(first < last ? first + k * st : first - k * st);
    std::snprintf(buf, sizeof buf, "%0*lld", width, static_cast<long long>(v));
    out.emplace_back(buf);
  }
  return out;
}

// `{a..z}` / `{a..z..S}` over the 52-letter alphabet A..Za..z.
std::optional<Alternatives> char_range(std::string_view expr) {
  std::string_view s = strip_one_newline(expr);
  auto letter_index = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
    return -1;
  };
  if (s.size() < 4) return std::nullopt;
  int a = letter_index(s[0]);
  s.remove_prefix(1);
  if (a < 0 || !take_dots(s) || s.empty()) return std::nullopt;
  int b = letter_index(s[0]);
  s.remove_prefix(1);
  if (b < 0) return std::nullopt;
  auto step = take_step(s);
  if (!step) return std::nullopt;
  int64_t st = *step == 0 ? 1 : *step;
  Alternatives out;
  auto letter = [](int64_t i) { return std::string(1, char(i < 26 ? 'A' + i : 'a' + (i - 26))); };
  if (a < b) {
    for (int64_t i = a; i <= b; i += st) out.push_back(letter(i));
  } else {
    for (int64_t i = a; i >= b; i -= st) out.push_back(letter(i));
  }
  return out;
}

// `{x,y,...}`: split at top-level commas; nullopt when there is no such comma.
std::optional<Alternatives> sequence(std::string_view expr) {
  std::vector<std::string_view> items;
  size_t start = 0;
  int depth = 0;
  for (size_t pos = 0; pos < expr.size(); pos++) {
    char c = expr[pos];
    if (c == '\\') {
      pos++; // the escaped character is skipped
    } else if (c == '{') {
      depth++;
    } else if (c == '}') {
      depth--;
    } else if (c == ',' && depth == 0) {
      items.push_back(expr.substr(start, pos - start));
      start = pos + 1;
    }
  }
  if (depth != 0 || items.empty()) return std::nullopt;
  items.push_back(expr.substr(std::min(start, expr.size())));
  Alternatives out;
  for (std::string_view item : items) {
    Alternatives sub = expand_pattern(item);
    if (out.size() + sub.size() > kMaxExpansions) throw TooMany{};
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

// A pattern is a run of literals and brace groups whose alternatives multiply.
Alternatives expand_pattern(std::string_view p) {
  std::vector<Alternatives> items;
  size_t start = 0, pos = 0;
  int depth = 0;
  while (pos < p.size()) {
    char c = p[pos];
    if (c == '\\') {
      pos += 2;
      continue;
    }
    if (c == '{') {
      // A literal ends where a top-level group starts. After a stray '}' (depth < 0) the
      // literal keeps growing, as in the reference.
      if (depth == 0 && pos > start) {
        items.push_back({std::string(p.substr(start, pos - start))});
        start = pos;
      }
      depth++;
    } else if (c == '}') {
      depth--;
      if (depth == 0) {
        std::string_view expr = p.substr(start + 1, pos - start - 1);
        std::optional<Alternatives> alts = int_range(expr);
        if (!alts) alts = char_range(expr);
        if (!alts) alts = sequence(expr);
        if (alts) {
          items.push_back(std::move(*alts));
        } else { // not a range or a list: literal braces around the expanded content
          items.push_back({"{"});
          items.push_back(expand_pattern(expr));
          items.push_back({"}"});
        }
        start = pos + 1;
      }
    }
    pos++;
  }
  if (depth != 0) throw Unbalanced{};
  if (start < pos) items.push_back({std::string(p.substr(std::min(start, p.size())))});
  return product(items);
}

// Removes the escaping backslashes: "\x" -> "x" (not before a newline, as Python's `.`).
std::string unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] != '\n') i++;
    out.push_back(s[i]);
  }
  return out;
}

} // namespace

std::vector<std::string> brace_expand(const std::string& pattern) {
  Alternatives raw;
  try {
    raw = expand_pattern(pattern);
  } catch (const Unbalanced&) {
    VLM_FAIL("unbalanced braces in '", pattern, "'");
  } catch (const TooMany&) {
    VLM_FAIL("brace pattern '", pattern, "' expands to more than ", kMaxExpansions, " strings");
  }
  for (std::string& s : raw) s = unescape(s);
  return raw;
}

} // namespace vlm::io
