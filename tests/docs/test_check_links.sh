#!/usr/bin/env bash
# The docs test: tests/docs/check_links.py first on small fixture trees in a temp dir (a good tree
# must pass; each broken link or anchor must fail naming FILE:LINE), so a broken checker cannot
# pass silently; then on the repository; then README.md's length (a front page: at most 150 lines).
#   bash tests/docs/test_check_links.sh [REPO_ROOT]
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "${1:-$here/../..}" && pwd)"
checker="$here/check_links.py"
max_readme_lines=150
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vlm_links_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

# A tree whose every link resolves: files, folders, anchors (duplicate headings, code, punctuation,
# a setext heading, an HTML anchor), external links, and links inside code that must be ignored.
make_good() {
  local d=$1
  mkdir -p "$d/docs/img" "$d/configs" "$d/src"
  : >"$d/docs/img/plot.png"
  : >"$d/src/main.cpp"
  cat >"$d/README.md" <<'MD'
# Project

See [training](docs/training.md), [its configs](docs/training.md#configs-and-the-tpi_multiplier-key),
[the second Notes](docs/training.md#notes-1), [the folder](src/), [a file](src/main.cpp#L3)
and [here](#project). External: [web](https://example.com/x#y), [mail](mailto:a@b.c).
A link over two lines: [the setext
heading](docs/training.md#a-setext-heading). Reference: [ref][r].

[r]: docs/training.md#html-anchor

```sh
cat [not a link](missing.md)
```

Inline code is not a link: `[x](missing.md)`.
MD
  cat >"$d/docs/training.md" <<'MD'
# Training

![plot](img/plot.png)

## Configs and the `tpi_multiplier` key

## Notes

## Notes

A setext heading
----------------

<a name="html-anchor"></a>
Back to [the front page](../README.md#project) and [the keys](/configs/README.md#keys-1-2--3).

```
# not a heading
```
MD
  cat >"$d/configs/README.md" <<'MD'
# Configs

## Keys: 1, 2 & 3!
MD
}

# expect <want: pass|fail> <case> <dir> [text the output must hold]
expect() {
  local want=$1 name=$2 dir=$3 needle=${4:-} out rc
  out=$(python3 "$checker" "$dir" 2>&1)
  rc=$?
  if [[ $want == pass && $rc -ne 0 ]]; then
    echo "FAIL: $name: the checker failed a good tree:"; echo "$out"; failures=$((failures + 1))
  elif [[ $want == fail && $rc -ne 1 ]]; then
    echo "FAIL: $name: the checker passed a broken tree (rc $rc):"; echo "$out"
    failures=$((failures + 1))
  elif [[ -n $needle && $out != *"$needle"* ]]; then
    echo "FAIL: $name: the output does not say '$needle':"; echo "$out"; failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

make_good "$tmp/good"
: >"$tmp/outside.md"
expect pass "a tree whose links all resolve" "$tmp/good" "11 relative links (8 with an anchor) in 3 files"

# bad <case> <file> <line to append> <expected output>: the good tree plus one broken link.
n=0
bad() {
  n=$((n + 1))
  local d="$tmp/bad$n"
  make_good "$d"
  printf '%s\n' "$3" >>"$d/$2"
  expect fail "$1" "$d" "$4"
}
bad "a missing file" README.md "[gone](docs/gone.md)" \
  "README.md:16: broken link 'docs/gone.md' (no file or folder docs/gone.md)"
bad "a missing anchor" README.md "[x](docs/training.md#no-such-heading)" \
  "README.md:16: broken link 'docs/training.md#no-such-heading' (no heading of docs/training.md"
bad "an anchor in the same page" docs/training.md "[x](#configs)" \
  "docs/training.md:20: broken link '#configs'"
bad "a third duplicate that does not exist" docs/training.md "[x](#notes-2)" "'#notes-2'"
bad "the un-slugged heading text" README.md "[x](docs/training.md#Notes)" "'docs/training.md#Notes'"
bad "a missing image" docs/training.md "![x](img/none.png)" "docs/training.md:20: broken link 'img/none.png'"
bad "a missing reference definition target" README.md "[q]: docs/nothing.md" "'docs/nothing.md'"
bad "a link in configs/README.md" configs/README.md "[x](../docs/training.md#nope)" \
  "configs/README.md:4: broken link"
bad "a link out of the repository" README.md "[x](../outside.md)" "outside the repository"

echo "--- the repository: $repo"
if ! python3 "$checker" "$repo"; then
  echo "FAIL: broken links in the repository's pages (above)"
  failures=$((failures + 1))
fi
lines=$(wc -l <"$repo/README.md")
if ((lines > max_readme_lines)); then
  echo "FAIL: README.md has $lines lines, more than $max_readme_lines (a front page; topics go to docs/)"
  failures=$((failures + 1))
else
  echo "README.md: $lines lines (at most $max_readme_lines)"
fi

if ((failures)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "docs links: OK"
