#!/usr/bin/env python3
"""Checks the relative links of the repository's markdown pages (standard library only).

  python3 tests/docs/check_links.py [ROOT]

Pages: ROOT/README.md, every ROOT/docs/**/*.md and ROOT/configs/README.md (those that exist).
Every relative link `[text](path)`, `[text](path#anchor)`, `![alt](path)` and reference
definition `[ref]: path` must name an existing file or folder (relative to the page; a leading
`/` means the repository root), and every anchor must be a heading of the target page under
GitHub's slug rule: the heading's text, lowercased, everything but letters, digits, spaces,
hyphens and underscores removed, spaces turned into hyphens; the second heading of the same slug
gets `-1`, the third `-2`, ... (`<a name=...>` / `id=...` anchors count too). Links with a scheme
(http:, https:, mailto:, ...) are not checked; links inside fenced code blocks and inline code
are not links. Prints `FILE:LINE: broken link 'target' (why)` for each broken one and exits 1;
otherwise prints how many links and anchors it checked and exits 0.
"""
import os
import re
import sys
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# [text](target "title") and ![alt](target); the text may hold one level of brackets and newlines.
INLINE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)", re.M)
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def blank_fences(text):
    """The text with fenced code blocks blanked (newlines kept): line numbers stay, and nothing
    inside them is taken for a link or a heading."""
    out, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def blank_code(text):
    """blank_fences, and inline code spans blanked too (newlines kept): `[x](y)` is no link."""
    text = blank_fences(text)

    def spaces(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", spaces, text, flags=re.S)


def slug(heading):
    """GitHub's anchor for a heading's rendered text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors_of(path):
    """The anchors a markdown file defines: heading slugs (duplicates numbered) and HTML ids."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        lines = blank_fences(f.read()).split("\n")
    seen, anchors = {}, set()

    def add(text):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")

    for i, line in enumerate(lines):
        m = ATX.match(line)
        if m:
            add(m.group(2) or "")
        elif i > 0 and SETEXT.match(line) and lines[i - 1].strip() and not ATX.match(lines[i - 1]) \
                and not re.match(r"^\s*([-*+]|\d+[.)])\s", lines[i - 1]) and not SETEXT.match(lines[i - 1]):
            add(lines[i - 1])
        for a in HTML_ANCHOR.findall(line):
            anchors.add(a)
    _anchor_cache[path] = anchors
    return anchors


def check_target(root, page, target):
    """None when `target` (as written on `page`) resolves, else why not; and whether it had an anchor."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    anchor = urllib.parse.unquote(anchor)
    if not path:
        dest = page
    elif path.startswith("/"):
        dest = os.path.join(root, path.lstrip("/"))
    else:
        dest = os.path.join(os.path.dirname(page), path)
    dest = os.path.normpath(dest)
    if not os.path.exists(dest):
        return f"no file or folder {os.path.relpath(dest, root)}", False
    if os.path.relpath(dest, root).split(os.sep)[0] == "..":
        return f"{os.path.relpath(dest, root)} is outside the repository", False
    if not anchor and "#" not in target:
        return None, False
    if os.path.isdir(dest):
        return f"an anchor on the folder {os.path.relpath(dest, root)}", True
    if not dest.endswith(".md"):
        if LINE_ANCHOR.match(anchor):
            return None, True
        return f"anchor '#{anchor}' on a file that is not markdown", True
    if anchor not in anchors_of(dest):
        return f"no heading of {os.path.relpath(dest, root)} has the anchor '#{anchor}'", True
    return None, True


def pages(root):
    found = []
    readme = os.path.join(root, "README.md")
    if os.path.isfile(readme):
        found.append(readme)
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    configs = os.path.join(root, "configs", "README.md")
    if os.path.isfile(configs):
        found.append(configs)
    return found


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    files = pages(root)
    if not files:
        print(f"check_links: no README.md or docs/*.md under {root}")
        return 1
    n_links = n_anchors = 0
    broken = []
    for page in files:
        with open(page, encoding="utf-8") as f:
            text = blank_code(f.read())
        found = [(m.start(), m.group(2)) for m in INLINE.finditer(text)]
        found += [(m.start(2), m.group(2)) for m in REFDEF.finditer(text)]
        for pos, target in sorted(found):
            if not target or SCHEME.match(target.strip("<>")):
                continue
            line = text.count("\n", 0, pos) + 1
            why, had_anchor = check_target(root, page, target)
            n_links += 1
            n_anchors += had_anchor
            if why:
                broken.append(f"{os.path.relpath(page, root)}:{line}: broken link '{target}' ({why})")
    for b in broken:
        print(b)
    if broken:
        print(f"check_links: {len(broken)} broken of {n_links} relative links in {len(files)} files")
        return 1
    print(f"check_links: {n_links} relative links ({n_anchors} with an anchor) in {len(files)} "
          "files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
