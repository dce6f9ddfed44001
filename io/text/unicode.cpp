#include "io/text/unicode.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "src/base/check.h"

namespace vlm::io::unicode {

namespace {
#include "io/text/unicode_tables.inc"
static_assert(kGeneratedBlockShift == kPropBlockShift, "regenerate io/text/unicode_tables.inc");
} // namespace

namespace detail {
const uint16_t* const prop_stage1 = kPropStage1;
const uint8_t* const prop_stage2 = kPropStage2;
} // namespace detail

const char* class_unicode_version() { return kClassUnicodeVersion; }
const char* nfc_unicode_version() { return kNfcUnicodeVersion; }

// ---------------------------------------------------------------------------------------------
// UTF-8

namespace {

// Length of the longest prefix of s[i..] that is a prefix of some well-formed UTF-8 sequence
// (Unicode Table 3-7), and whether that prefix is a complete sequence. Drives both decoding and
// the maximal-subpart replacement of utf8_lossy.
size_t utf8_prefix(std::string_view s, size_t i, bool* complete) {
  const auto b0 = uint8_t(s[i]);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0; // no overlong forms
    if (b0 == 0xED) hi = 0x9F; // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90; // no overlong forms
    if (b0 == 0xF4) hi = 0x8F; // nothing above U+10FFFF
  } else {
    return 1; // continuation byte or a byte that never occurs
  }
  size_t k = 1;
  for (; k < need && i + k < s.size(); k++) {
    const auto b = uint8_t(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
  }
  *complete = k == need;
  return k;
}

} // namespace

size_t utf8_decode(std::string_view s, size_t i, char32_t* cp) {
  bool complete;
  const size_t n = utf8_prefix(s, i, &complete);
  if (!complete) return 0;
  const auto b0 = uint8_t(s[i]);
  char32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; k++) c = (c << 6) | (uint8_t(s[i + k]) & 0x3F);
  *cp = c;
  return n;
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (uint8_t(s[i]) < 0x80) {
      i++;
      continue;
    }
    bool complete;
    const size_t len = utf8_prefix(s, i, &complete);
    if (!complete) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool complete;
    const size_t len = utf8_prefix(bytes, i, &complete);
    if (complete)
      out.append(bytes.data() + i, len);
    else
      utf8_append(&out, kReplacementChar);
    i += len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// NFC (UAX #15): canonical decomposition, canonical ordering, canonical composition.

uint8_t combining_class(char32_t cp) {
  if (cp > 0x10FFFF || !(props(cp) & kPropCcc)) return 0;
  auto it = std::lower_bound(std::begin(kCcc), std::end(kCcc), cp,
                             [](const CccEntry& e, char32_t c) { return e.cp < c; });
  return it != std::end(kCcc) && it->cp == cp ? it->ccc : 0;
}

namespace {

// Hangul syllables are composed and decomposed arithmetically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                             [](const DecompEntry& e, char32_t c) { return e.cp < c; });
  if (it != std::end(kDecomp) && it->cp == cp)
    out->insert(out->end(), kDecompData + it->offset, kDecompData + it->offset + it->length);
  else
    out->push_back(cp);
}

// The primary composite of (a, b), or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const uint64_t key = (uint64_t(a) << 21) | b;
  auto it = std::lower_bound(std::begin(kComp), std::end(kComp), key,
                             [](const CompEntry& e, uint64_t k) { return e.key < k; });
  return it != std::end(kComp) && it->key == key ? it->composite : 0;
}

// A code point that starts a stretch independent of what precedes it: combining class 0 and
// NFC_QC = Yes (it neither reorders nor composes backwards, and stays as it is in NFC).
inline bool is_stable(uint8_t p) { return !(p & (kPropNfcMaybe | kPropNfcNo | kPropCcc)); }

// Appends NFC(seg) to *out; seg is valid UTF-8.
void normalize_stretch(std::string_view seg, std::string* out) {
  std::vector<char32_t> buf;
  buf.reserve(seg.size() + 8);
  for (size_t i = 0; i < seg.size();) {
    char32_t cp = 0;
    i += utf8_decode(seg, i, &cp);
    decompose(cp, &buf);
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  std::vector<uint8_t> ccc(buf.size());
  for (size_t i = 0; i < buf.size(); i++) ccc[i] = combining_class(buf[i]);
  for (size_t i = 1; i < buf.size(); i++) {
    for (size_t j = i; j > 0 && ccc[j] != 0 && ccc[j - 1] > ccc[j]; j--) {
      std::swap(buf[j - 1], buf[j]);
      std::swap(ccc[j - 1], ccc[j]);
    }
  }
  // Canonical composition: each character combines with the last starter unless blocked by a
  // character in between with class 0 or a class >= its own.
  size_t starter = SIZE_MAX, w = 0;
  uint8_t last_ccc = 0; // class of the last character kept after the starter
  for (size_t r = 0; r < buf.size(); r++) {
    const char32_t c = buf[r];
    const uint8_t cc = ccc[r];
    if (starter != SIZE_MAX && (w == starter + 1 || (last_ccc != 0 && last_ccc < cc))) {
      if (char32_t comp = compose_pair(buf[starter], c)) {
        buf[starter] = comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = w;
      last_ccc = 0;
    } else {
      last_ccc = cc;
    }
    buf[w++] = c;
  }
  for (size_t i = 0; i < w; i++) utf8_append(out, buf[i]);
}

} // namespace

bool is_nfc_quick(std::string_view s) {
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) { // ASCII is stable
      last_ccc = 0;
      i++;
      continue;
    }
    char32_t cp = 0;
    const size_t len = utf8_decode(s, i, &cp);
    if (len == 0) return false;
    i += len;
    const uint8_t p = props(cp);
    if (p & (kPropNfcMaybe | kPropNfcNo)) return false;
    const uint8_t cc = (p & kPropCcc) ? combining_class(cp) : 0;
    if (cc != 0 && last_ccc > cc) return false; // out of canonical order
    last_ccc = cc;
  }
  return true;
}

std::string to_nfc(std::string_view s) {
  const size_t bad = utf8_find_invalid(s);
  VLM_CHECK(bad == std::string_view::npos, "NFC: invalid UTF-8 at byte offset ", bad);
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;   // s[0, copied) is in `out`
  size_t boundary = 0; // start of the last stable character
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      boundary = i++;
      last_ccc = 0;
      continue;
    }
    char32_t cp = 0;
    const size_t len = utf8_decode(s, i, &cp);
    const uint8_t p = props(cp);
    if (is_stable(p)) {
      boundary = i;
      last_ccc = 0;
      i += len;
      continue;
    }
    if (!(p & (kPropNfcMaybe | kPropNfcNo))) { // a combining mark in canonical order stays
      const uint8_t cc = combining_class(cp);
      if (cc >= last_ccc) {
        last_ccc = cc;
        i += len;
        continue;
      }
    }
    // Normalize from the last stable character up to the next one.
    size_t end = i + len;
    while (end < s.size()) {
      char32_t c2 = 0;
      const size_t l2 = utf8_decode(s, end, &c2);
      if (is_stable(props(c2))) break;
      end += l2;
    }
    out.append(s.data() + copied, boundary - copied);
    normalize_stretch(s.substr(boundary, end - boundary), &out);
    copied = boundary = i = end;
    last_ccc = 0;
  }
  out.append(s.data() + copied, s.size() - copied);
  return out;
}

} // namespace vlm::io::unicode
