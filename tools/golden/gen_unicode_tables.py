#!/usr/bin/env python3
"""Generates io/text/unicode_tables.inc: the Unicode data of the tokenizer (io/text/unicode.cpp).

The tables reproduce what Hugging Face `tokenizers` (0.23) does, which mixes two Unicode versions:

* Pre-tokenizer classes (\\p{L}, \\p{M}, \\p{N}, \\s of the Split regex) follow the Oniguruma
  library inside `tokenizers`, which has Unicode 16.0.0. They come from the PyPI backport
  `unicodedata2==16.0.0`. Oniguruma's \\s is U+0009..U+000D, U+0085 and the categories Zs, Zl, Zp.
* The NFC normalizer of `tokenizers` (crate unicode-normalization-alignments) has Unicode 9.0.0:
  characters assigned after 9.0 are neither decomposed, reordered nor composed. That data comes
  from the `unicodedata` module of a Python 3.6 interpreter (the last with Unicode 9.0.0), run as
  a subprocess (--nfc-python).

`--check-hf` (needs `tokenizers`) compares both against `tokenizers` itself over every code point:
the class of each code point in the Split regex, the case-insensitive contractions, and NFC of
every canonically decomposable character plus random mark sequences. The check that produced the
committed file passed with no difference.

Usage:
  pip install unicodedata2==16.0.0
  python3 tools/golden/gen_unicode_tables.py [--nfc-python /path/to/python3.6] [--check-hf]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "io", "unicode_tables.inc")

CATEGORY_VERSION = "16.0.0"
NFC_VERSION = "9.0.0"
BLOCK_SHIFT = 7  # io/text/unicode.h: kPropBlockShift
MAX_CP = 0x110000

# Property byte layout (io/text/unicode.h)
CLASS_OTHER, CLASS_LETTER, CLASS_NUMBER, CLASS_SPACE, CLASS_MARK = 0, 1, 2, 3, 4
BIT_NFC_MAYBE = 1 << 3  # may compose with the previous character (NFC_QC = Maybe)
BIT_NFC_NO = 1 << 4  # never occurs in NFC output (NFC_QC = No)
BIT_CCC = 1 << 5  # canonical combining class != 0
BIT_WORD = 1 << 6  # \w of the added-token single_word rule (approximation, see io/text/unicode.h)

# Dumps the NFC data of the interpreter's unicodedata; runs under Python 3.6 (no f-strings).
NFC_DUMPER = r"""
import json, sys, unicodedata as u
out = {"version": u.unidata_version, "ccc": {}, "nfd": {}, "pairs": [], "no": []}
for cp in range(0x110000):
    if 0xD800 <= cp < 0xE000:
        continue
    c = chr(cp)
    if u.combining(c):
        out["ccc"][cp] = u.combining(c)
    if 0xAC00 <= cp <= 0xD7A3:
        continue  # Hangul syllables: algorithmic
    d = u.normalize("NFD", c)
    if d != c:
        out["nfd"][cp] = [ord(x) for x in d]
    if u.normalize("NFC", c) != c:
        out["no"].append(cp)
    m = u.decomposition(c)
    if m and not m.startswith("<"):
        parts = [int(x, 16) for x in m.split()]
        if len(parts) == 2 and u.normalize("NFC", c) == c:
            out["pairs"].append([parts[0], parts[1], cp])
json.dump(out, sys.stdout)
"""


def find_python36(explicit):
    candidates = [explicit] if explicit else []
    candidates += [shutil.which("python3.6") or ""]
    pyenv = os.path.expanduser("~/.pyenv/versions")
    if os.path.isdir(pyenv):
        candidates += [os.path.join(pyenv, v, "bin", "python")
                       for v in sorted(os.listdir(pyenv)) if v.startswith("3.6")]
    for c in candidates:  # the first that runs (a pyenv shim may exist but not be active)
        if c and os.path.exists(c) and subprocess.run(
                [c, "-c", "pass"], capture_output=True).returncode == 0:
            return c
    sys.exit("gen_unicode_tables: needs a Python 3.6 interpreter (its unicodedata is Unicode "
             f"{NFC_VERSION}, the version of the NFC normalizer in HF tokenizers); pass "
             "--nfc-python PATH (e.g. from `pyenv install 3.6.15`)")


def load_nfc_data(python):
    res = subprocess.run([python, "-c", NFC_DUMPER], check=True, capture_output=True, text=True)
    data = json.loads(res.stdout)
    if data["version"] != NFC_VERSION:
        sys.exit(f"gen_unicode_tables: {python} has Unicode {data['version']}, need {NFC_VERSION}")
    data["ccc"] = {int(k): v for k, v in data["ccc"].items()}
    data["nfd"] = {int(k): v for k, v in data["nfd"].items()}
    return data


def load_categories():
    try:
        import unicodedata2
    except ImportError:
        sys.exit(f"gen_unicode_tables: pip install unicodedata2=={CATEGORY_VERSION}")
    if unicodedata2.unidata_version != CATEGORY_VERSION:
        sys.exit(f"gen_unicode_tables: unicodedata2 has Unicode {unicodedata2.unidata_version}, "
                 f"need {CATEGORY_VERSION} (pip install unicodedata2=={CATEGORY_VERSION})")
    return unicodedata2


def char_class(cat, cp):
    # Oniguruma's \s (Unicode): U+0009..U+000D, U+0085, Zs, Zl, Zp.
    if 0x09 <= cp <= 0x0D or cp == 0x85 or cat in ("Zs", "Zl", "Zp"):
        return CLASS_SPACE
    return {"L": CLASS_LETTER, "N": CLASS_NUMBER, "M": CLASS_MARK}.get(cat[0], CLASS_OTHER)


def build_props(ud16, nfc):
    maybe = {b for _, b, _ in nfc["pairs"]}
    maybe.update(range(0x1161, 0x1176))  # Hangul V jamo compose with a preceding L
    maybe.update(range(0x11A8, 0x11C3))  # Hangul T jamo compose with a preceding LV
    no = set(nfc["no"])
    props = bytearray(MAX_CP)
    for cp in range(MAX_CP):
        cat = ud16.category(chr(cp))
        p = char_class(cat, cp)
        if cp in maybe:
            p |= BIT_NFC_MAYBE
        if cp in no:
            p |= BIT_NFC_NO
        if cp in nfc["ccc"]:
            p |= BIT_CCC
        # Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control. Alphabetic ~ L + Nl here.
        if cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or cp in (0x200C, 0x200D):
            p |= BIT_WORD
        props[cp] = p
    return props


def two_stage(props):
    size = 1 << BLOCK_SHIFT
    blocks, stage1, index = [], [], {}
    for start in range(0, MAX_CP, size):
        blk = bytes(props[start:start + size])
        if blk not in index:
            index[blk] = len(blocks)
            blocks.append(blk)
        stage1.append(index[blk])
    return stage1, blocks


def c_array(values, per_line=24):
    vals = list(values)
    lines = []
    for i in range(0, len(vals), per_line):
        lines.append("    " + ", ".join(str(v) for v in vals[i:i + per_line]) + ",")
    return "\n".join(lines)


def write_inc(props, nfc):
    stage1, blocks = two_stage(props)
    assert len(blocks) < 65536
    ccc = sorted(nfc["ccc"].items())
    decomp_keys = sorted(nfc["nfd"])
    decomp_data, decomp_index = [], []
    for cp in decomp_keys:
        seq = nfc["nfd"][cp]
        assert len(seq) < 8
        decomp_index.append((cp, len(decomp_data), len(seq)))
        decomp_data += seq
    pairs = sorted(((a << 21) | b, c) for a, b, c in nfc["pairs"])
    with open(OUT, "w") as f:
        f.write(f"""// GENERATED by tools/golden/gen_unicode_tables.py -- do not edit.
// Pre-tokenizer classes: Unicode {CATEGORY_VERSION} (unicodedata2 {CATEGORY_VERSION}), as Oniguruma in HF tokenizers.
// NFC data: Unicode {NFC_VERSION} (Python 3.6 unicodedata), as the NFC normalizer of HF tokenizers.
// Included once, by io/text/unicode.cpp.

constexpr const char* kClassUnicodeVersion = "{CATEGORY_VERSION}";
constexpr const char* kNfcUnicodeVersion = "{NFC_VERSION}";
constexpr int kGeneratedBlockShift = {BLOCK_SHIFT};

// Property byte of a code point: kPropStage2[(kPropStage1[cp >> shift] << shift) | (cp & mask)].
const uint16_t kPropStage1[{len(stage1)}] = {{
{c_array(stage1)}
}};
const uint8_t kPropStage2[{len(blocks) << BLOCK_SHIFT}] = {{
{c_array((b for blk in blocks for b in blk), 32)}
}};

// Canonical combining class != 0, sorted by code point.
struct CccEntry {{
  char32_t cp;
  uint8_t ccc;
}};
const CccEntry kCcc[{len(ccc)}] = {{
{c_array((f"{{{cp}, {c}}}" for cp, c in ccc), 8)}
}};

// Full canonical decomposition (NFD) of each decomposable code point except Hangul syllables:
// kDecompData[offset, offset + length).
struct DecompEntry {{
  char32_t cp;
  uint16_t offset;
  uint8_t length;
}};
const DecompEntry kDecomp[{len(decomp_index)}] = {{
{c_array((f"{{{cp}, {o}, {n}}}" for cp, o, n in decomp_index), 6)}
}};
const char32_t kDecompData[{len(decomp_data)}] = {{
{c_array(decomp_data, 12)}
}};

// Primary composites (first << 21 | second) -> composite, sorted by key; Hangul is algorithmic.
struct CompEntry {{
  uint64_t key;
  char32_t composite;
}};
const CompEntry kComp[{len(pairs)}] = {{
{c_array((f"{{{k}u, {c}}}" for k, c in pairs), 6)}
}};
""")
    total = len(stage1) * 2 + len(blocks) * (1 << BLOCK_SHIFT)
    print(f"wrote {OUT}: {len(blocks)} property blocks ({total / 1024:.0f} KiB), {len(ccc)} ccc, "
          f"{len(decomp_index)} decompositions, {len(pairs)} composition pairs")


# --- cross-check against HF tokenizers ------------------------------------------------------

def emulate_split(s, props, marks_are_letters):
    """The hand-written matcher of io/text/tokenizer.cpp, in Python (same rules)."""
    def k(ch):
        c = props[ord(ch)] & 7
        if c == CLASS_MARK:
            return CLASS_LETTER if marks_are_letters else CLASS_OTHER
        return c
    K = [k(ch) for ch in s]
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if c == "'" and i + 1 < n:
            c1 = "s" if s[i + 1] == "\u017f" else s[i + 1].lower() if s[i + 1] < "\x80" else ""
            c2 = s[i + 2].lower() if i + 2 < n and s[i + 2] < "\x80" else ""
            m = 2 if c1 in ("s", "t", "m", "d") else 3 if (c1 in ("r", "v") and c2 == "e") or (
                c1 == "l" and c2 == "l") else 0
            if m:
                out.append(s[i:i + m])
                i += m
                continue
        if K[i] == CLASS_LETTER or (K[i] != CLASS_NUMBER and c not in "\r\n" and i + 1 < n
                                    and K[i + 1] == CLASS_LETTER):
            j = i + 1
            while j < n and K[j] == CLASS_LETTER:
                j += 1
        elif K[i] == CLASS_NUMBER:
            j = i + 1
        elif K[i] == CLASS_OTHER or (c == " " and i + 1 < n and K[i + 1] == CLASS_OTHER):
            j = i + 1
            while j < n and K[j] == CLASS_OTHER:
                j += 1
            while j < n and s[j] in "\r\n":
                j += 1
        else:
            e = i
            while e < n and K[e] == CLASS_SPACE:
                e += 1
            last_nl = max((p for p in range(i, e) if s[p] in "\r\n"), default=-1)
            j = last_nl + 1 if last_nl >= 0 else e if (e == n or e - 1 == i) else e - 1
        out.append(s[i:j])
        i = j
    return out


def check_hf(props):
    from tokenizers import Regex
    from tokenizers.normalizers import NFC
    from tokenizers.pre_tokenizers import Split
    patterns = {
        False: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        True: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?"
              r"[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
    bad = 0
    for marks, pat in patterns.items():
        split = Split(Regex(pat), behavior="isolated")
        for cp in range(MAX_CP):
            if 0xD800 <= cp < 0xE000:
                continue
            c = chr(cp)
            probes = ["a" + c + "a", "a" + c + "!", " " + c + "\n"]
            if props[cp] & 7 in (CLASS_LETTER, CLASS_MARK) or cp < 128:
                probes += ["'" + c + "a", "'" + c + "ea", "'r" + c + "a", "'l" + c + "a",
                           "'" + c + "la"]
            for p in probes:
                hf = [x for x, _ in split.pre_tokenize_str(p)]
                if hf != emulate_split(p, props, marks):
                    bad += 1
                    print(f"split mismatch (marks_are_letters={marks}) U+{cp:04X} {p!r}: hf {hf}")
                    break
    # NFC inputs: every decomposed form (recomposition) and random mark sequences (reordering).
    nfc = NFC()
    import unicodedata2
    cases = [unicodedata2.normalize("NFD", chr(cp)) for cp in range(MAX_CP)
             if not 0xD800 <= cp < 0xE000 and unicodedata2.normalize("NFD", chr(cp)) != chr(cp)]
    rng = random.Random(0)
    marks = [chr(cp) for cp in range(MAX_CP) if not 0xD800 <= cp < 0xE000
             and unicodedata2.combining(chr(cp))]
    cases += ["a" + "".join(rng.choice(marks) for _ in range(rng.randint(1, 5)))
              for _ in range(20000)]
    hf_out = [nfc.normalize_str(c) for c in cases]
    print(f"check-hf: the Split regex differs from HF on {bad} code points")
    return bad, cases, hf_out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nfc-python", help="a Python 3.6 interpreter (unicodedata 9.0.0)")
    ap.add_argument("--check-hf", action="store_true", help="compare with HF tokenizers")
    args = ap.parse_args()
    ud16 = load_categories()
    nfc_python = find_python36(args.nfc_python)
    nfc = load_nfc_data(nfc_python)
    props = build_props(ud16, nfc)
    write_inc(props, nfc)
    if args.check_hf:
        bad, cases, hf_out = check_hf(props)
        # NFC of every case by the Unicode 9.0 interpreter must equal HF's.
        res = subprocess.run(
            [nfc_python, "-c", "import json,sys,unicodedata as u;"
             "print(json.dumps([u.normalize('NFC', c) for c in json.load(sys.stdin)]))"],
            input=json.dumps(cases), check=True, capture_output=True, text=True)
        ours = json.loads(res.stdout)
        nfc_bad = sum(1 for a, b in zip(ours, hf_out) if a != b)
        print(f"check-hf: NFC (Unicode {NFC_VERSION}) differs from HF on {nfc_bad} of "
              f"{len(cases)} cases")
        if bad or nfc_bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
