// The key table of the training config as data (internal to src/train/config*.cpp): one Field per
// key of config.h's X-macro tables, bound to a TrainConfig's member, with its kind, bounds, enum
// names and help; and the text forms of values that parsing, validation and the docs share.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "src/train/config.h"

namespace vlm::train::detail {

using Value = std::variant<bool, int64_t, double, std::string>;
enum class Kind { boolean, integer, floating, string, choice };

struct Field {
  std::string section, key, help;
  Kind kind = Kind::string;
  KeyBounds bounds;                                         // integer and floating keys
  std::vector<std::string> choices;                         // choice: canonical names
  std::vector<std::pair<std::string, std::string>> aliases; // choice: alias -> canonical
  std::function<Value()> get;
  // Sets the member from a value of the kind's type (a string for choices); returns "" or what is
  // wrong with the value.
  std::function<std::string(const Value&)> set;
  std::string full() const { return section + "." + key; }
};

inline constexpr const char* kSections[] = {"model",    "training",   "data",
                                            "parallel", "checkpoint", "logging"};

// The fields of `c`, in table order; the closures refer to c's members.
std::vector<Field> fields_of(TrainConfig& c);

// A string as a TOML basic string, quotes and escapes included.
std::string toml_string(std::string_view s);
// Shortest text that reads back as the same double, always with a '.' or an exponent (TOML).
std::string float_text(double d);
std::string value_text(const Value& v);
// "in [1, 4096]" or ">= 0": a numeric key's bounds as the messages and the key table say them.
std::string bounds_text(const Field& f);
// The key's type for the docs: "int in [1, 4096]", "float", "abort | skip", ...
std::string type_text(const Field& f);

} // namespace vlm::train::detail
