// One argument parser for every command and benchmark: CLI11 (Debian libcli11-dev, header only).
// A command builds a CLI::App named as the user types it ("vlmtrain train"), binds each option to
// a variable (its type and default are what --help prints) and calls parse_args: --help prints
// the options and asks the caller to stop; a bad option is a vlm::Error that names it.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "src/base/check.h"

namespace vlm::cli {

// A parser whose --help shows every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

// Parses `args`, the words after the command's name. Returns false when --help was asked for
// (printed; the command exits 0), true to go on.
inline bool parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> back_to_front(args.rbegin(), args.rend()); // CLI11's order
  try {
    app.parse(back_to_front);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout); // the selected subcommand's help, if any
    return false;
  } catch (const CLI::ParseError& e) {
    std::string name = app.get_name(); // with the subcommands given: "vlmtrain data pack"
    for (const CLI::App* at = &app; !at->get_subcommands().empty();) {
      at = at->get_subcommands().front();
      name += " " + at->get_name();
    }
    VLM_FAIL("`", name, "`: ", e.what(), " (", name, " --help lists them)");
  }
  return true;
}

// The same for a program's main (benchmarks): argv[0] is the program.
inline bool parse_args(CLI::App& app, int argc, char** argv) {
  return parse_args(app, std::vector<std::string>(argv + 1, argv + argc));
}

// A number > 0 (CLI::PositiveNumber prints the largest double in its message).
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        return CLI::detail::lexical_cast(text, v) && v > 0 ? "" : "must be a number > 0";
      },
      "> 0");
}

// An integer >= `least` (CLI::Range would print the type's largest value as the bound).
inline CLI::Validator at_least(int64_t least) {
  return CLI::Validator(
      [least](std::string& text) -> std::string {
        int64_t v = 0;
        if (CLI::detail::lexical_cast(text, v) && v >= least) return "";
        return "must be an integer >= " + std::to_string(least);
      },
      ">= " + std::to_string(least));
}

// A whole number that fits 64 bits unsigned (CLI11 2.1 saturates a larger one silently).
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (!text.empty() && ec == std::errc() && ptr == end) return "";
        return "must be a whole number in [0, 18446744073709551615]";
      },
      "UINT64");
}

} // namespace vlm::cli
