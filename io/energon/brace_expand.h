// Brace expansion exactly as the Python `braceexpand` package (0.1.7, escape=True), which
// Energon applies to every entry of split.yaml's `split_parts` and `exclude` lists:
//   "shard_{000..002}.tar" -> shard_000.tar, shard_001.tar, shard_002.tar
// Rules (mirrored case by case, checked against vectors from the Python package):
// - `{a,b,c}` alternation, nestable; an item may be empty (`{,x}`). Braces without a top-level
//   comma that are not a range stay literal, but their content is still expanded
//   (`{a{b,c}}` -> `{ab}`, `{ac}`).
// - `{N..M}` / `{N..M..S}` integer ranges, ascending or descending; S is taken by magnitude and
//   S = 0 means 1. Zero padding: if an endpoint other than exactly "0"/"-0" starts with "0" or
//   "-0", every value is printed %0*d with width max(len(N), len(M)) (so `{0..10}` is NOT
//   padded, `{00..3}` is, and `{-01..2}` gives -01 000 001 002).
// - `{a..e}` / `{a..e..S}` letter ranges over the alphabet A..Za..z (so `{Z..a}` = Z a).
// - A backslash makes the next character literal; backslashes are removed from the results
//   (a backslash before a newline or at the very end stays).
// - Several groups multiply left to right (`{1,2}{a,b}` = 1a 1b 2a 2b).
// - Unbalanced braces are an error (vlm::Error quoting the pattern); a lone `}{` is literal.
// Only ASCII digits count as digits (Python would also accept other Unicode digits).
#pragma once

#include <string>
#include <vector>

namespace vlm::io {

// All expansions of `pattern`, in Python's order. Throws vlm::Error for unbalanced braces and
// when the expansion would exceed 4M strings (a typo such as {0..99999999}).
std::vector<std::string> brace_expand(const std::string& pattern);

} // namespace vlm::io
