// Names of enum values for configs and command lines: one table per enum (canonical names first,
// then aliases accepted on input only), one parser and one printer for all of them.
#pragma once

#include <algorithm>
#include <cctype>
#include <span>
#include <string>
#include <string_view>

#include "src/base/check.h"

namespace vlm {

template <class E> struct EnumName {
  const char* name;
  E value;
  bool alias = false; // accepted on input, never written
};

// The canonical name of `value`, or nullptr when the table has none.
template <class E> const char* enum_name(std::span<const EnumName<E>> names, E value) {
  for (const auto& n : names)
    if (!n.alias && n.value == value) return n.name;
  return nullptr;
}

// "a | b | c": the canonical names, for help texts and errors.
template <class E> std::string enum_choices(std::span<const EnumName<E>> names) {
  std::string out;
  for (const auto& n : names)
    if (!n.alias) out += (out.empty() ? "" : " | ") + std::string(n.name);
  return out;
}

// The value named `text` (case-insensitive, aliases included), or nullptr.
template <class E>
const EnumName<E>* find_enum(std::span<const EnumName<E>> names, std::string_view text) {
  auto same = [&](const char* name) {
    std::string_view n(name);
    return n.size() == text.size() &&
           std::equal(n.begin(), n.end(), text.begin(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) ==
                    std::tolower(static_cast<unsigned char>(b));
           });
  };
  for (const auto& n : names)
    if (same(n.name)) return &n;
  return nullptr;
}

// As find_enum, but an unknown name throws "<what>: unknown value 'x' (valid: a | b | c)".
template <class E>
E parse_enum(std::span<const EnumName<E>> names, std::string_view text, std::string_view what) {
  const EnumName<E>* n = find_enum(names, text);
  VLM_CHECK(n, what, ": unknown value '", text, "' (valid: ", enum_choices(names), ")");
  return n->value;
}

} // namespace vlm
