#!/usr/bin/env python3
"""Golden data for the tokenizer (tests/io/text/test_tokenizer.cpp), made by HF `tokenizers`.

Writes under tests/data/tokenizer/:
  golden.jsonl  one JSON object per line, made with the real Qwen3 tokenizer.json:
                {"case": "encode", "text": s, "ids": [...], "nfc": NFC(s)}   ("nfc" only when
                    it differs from s; HF's decode(encode(s)) equals it, asserted here)
                {"case": "decode", "ids": [...], "skip_special": b, "text": HF's decode}
                {"case": "split", "text": s, "qwen2": [...], "qwen35": [...]}: the pieces of
                    HF's Split pre-tokenizer with the Qwen2/Qwen3 and the Qwen3.5 regex
  mini.json     a small byte-level BPE tokenizer (the 256 byte tokens and the first 3000 Qwen3
                merges) with what the real file does not use: the Qwen3.5 regex, added tokens
                with lstrip / rstrip / single_word / normalized, "a b" string merges and
                ignore_merges with vocabulary words no merge makes
  mini.jsonl    {"case": "encode", ...} lines for mini.json
The real tokenizer is read from build/test_data/qwen3-tokenizer/ (CMake unpacks
tests/data/qwen3-tokenizer/tokenizer.json.tar.xz there).

Usage: pip install tokenizers==0.23.3 && python3 tools/golden/gen_tokenizer.py
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(REPO, "build", "test_data", "qwen3-tokenizer", "tokenizer.json")
OUT = os.path.join(REPO, "tests", "data", "tokenizer")

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?"
                r"[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def handwritten():
    """Strings chosen by hand, one per behaviour worth pinning down."""
    s = []
    # English, contractions in any case, apostrophe look-alikes
    s += ["Hello, my dog is cute", "The quick brown fox jumps over the lazy dog.",
          "I'm sure you're right; they've said we'll see, he'd know, it's theirs.",
          "I'M SURE YOU'RE RIGHT; THEY'VE SAID WE'LL SEE, HE'D KNOW, IT'S THEIRS.",
          "You'Re wE'lL iT'S dOn'T", "'s", "'sa", "'S'T'M'D", "'re've'll", "'", "''", "'''s",
          "rock 'n' roll", "O'Neil's", "y'all'd've", "'ſ", "'ſa", "'K", "'ﬆ", "it’s (U+2019)",
          "don ' t", "'\n", "' s", "x'y", "a's b'S", "'ll'LL'lL"]
    # numbers: digits are split one by one (\p{N}), all scripts and number forms
    s += ["12345", "3.14159", "1,000,000.00", "-42", "1e-10", "0x1F", "v2.0.1", "٣٤٥ ۶۷۸",
          "१२३", "½ ⅔ ¾", "Ⅻ ⅻ", "①②③", "１２３", "x² H₂O", "2024-01-01T12:00:00Z", "$100",
          "100%", "3rd 21st", "٫", "𝟘𝟙𝟚"]
    # whitespace runs: tabs, newlines, CR, trailing, unicode spaces
    s += ["a  b", "a   b", "a\tb", "a\t\tb", "a\n\nb", "  leading", "trailing   ", "\n", " ", "  ",
          "\t", "\t\t", "\r\n", " \n ", "a \n\n  b", "\u3000x", "x\u00a0y", "a\u2028b", "\x0b\x0c",
          "a\x85b", "line1\r\nline2\r\n", "    indented code", "end with newline\n",
          "\n\n\n", " \t \n\t x", "x \t", "x\n \n", "\u2003\u2003word", "a \u00a0b",
          "tab\tthen  two", "\r", "\r\r\nx", "!\n\n", " !\n", "word\n\n\nword", "  \n  \n  "]
    # scripts
    s += ["你好，世界！今天天气很好。", "我爱北京天安门，天安门上太阳升。",
          "日本語のテキストとカタカナ、ひらがな。", "東京スカイツリーは634メートルです。",
          "안녕하세요, 세계! 한국어 문장입니다.", "Привет, мир! Как дела?",
          "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Γειά σου Κόσμε",
          "مرحبا بالعالم! هذا نص عربي.", "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ", "שָׁלוֹם עוֹלָם",
          "नमस्ते दुनिया, यह हिंदी है।", "क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़", "क्षत्रिय", "হ্যালো বিশ্ব",
          "வணக்கம் உலகம்", "สวัสดีชาวโลกภาษาไทยไม่มีช่องว่าง", "Xin chào thế giới",
          "Tiếng Việt có dấu: ắ ằ ẳ ẵ ặ", "İstanbul ıslak ĞÜŞÖÇ", "Straße groß ẞ",
          "œuvre naïve façade", "ǅemal Ǆ ǆ", "ⴰⵣⵓⵍ", "ᐊᐃᑦᑎᓐ", "ꦲꦏ꧀ꦱꦫ", "ሰላም ልዑል",
          "Ꭰ Ꮳ", "ᠮᠣᠩᠭᠣᠯ", "ܫܠܡܐ", "ދިވެހި", "ᚠᚢᚦ", "𐌰𐌱𐌲", "𓀀𓀁", "ꙮ",
          "Ᲊᲊ (U+1C89, U+1C8A new in Unicode 16)", "𑤸 (Dives Akuru, Unicode 13)"]
    # emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors
    s += ["😀", "😀😃😄", "👍🏽", "👍🏿 thumbs", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪🇯🇵", "❤️", "❤\ufe0e",
          "1️⃣#️⃣", "🧑🏿‍🚀", "👩🏻‍❤️‍💋‍👨🏼", "emoji 🎉 in 🚀 text 💯", "🤷‍♂️", ":-) ;-)",
          "☃ ★ ♥ ♠", "🫠🫡", "😀\n😀"]
    # combining marks: NFD input that NFC changes, reordering, exclusions, singletons
    s += ["e\u0301", "Cafe\u0301", "A\u030a", "re\u0301sume\u0301", "n\u0303", "u\u0308ber",
          "\u1e0b\u0323", "q\u0307\u0323", "a\u0323\u0302", "a\u0302\u0323", "o\u031b\u0301",
          "\u1100\u1161\u11a8", "\u1100\u1161 \u1100", "\uac00\u11a8", "\u0958", "\u2126",
          "\u212b", "\u0344", "\u0340", "\u00c5\u0301", "\u0915\u093c", "\u0928\u093c",
          "\u0627\u0653", "\u0651\u064e", "\u064e\u0651", "\u05e9\u05c1\u05bc",
          "\U00011935\U00011930", "\U00011099\U000110ba", "x\u0301\u0301\u0301",
          "\u0301 leading mark", "\u0300\u0316", "e\u20dd", "\u1ea5", "a\u0306\u0301",
          "\ufb01 ligature", "\u2460", "\u212a", "\u00bd", "\u0041\u030a\u0327"]
    # code
    s += ["def f(x):\n    return x ** 2  # square\n",
          "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
          "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; }",
          '{"key": "value", "list": [1, 2.5, null, true]}',
          "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
          "cat file.txt | grep -E '^[a-z]+$' | sort -u > out.txt 2>&1",
          "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
          "https://example.com/path?query=1&b=two#frag", "user.name+tag@example.co.uk",
          "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
          "| a | b |\n|---|---|\n| 1 | 2 |", "x=>x*2; a!==b; c??d; e?.f", "a::b->c", "i++; --j;",
          "    if x:\n        pass\n\n", "if(a&&b||!c){return;}", "/* comment */ // line",
          "\tindent\ttabs\t", "__init__ self._x __dunder__", "camelCaseIdentifier snake_case_id",
          "0b1010 0o17 1_000_000", "println!(\"{}\", x);"]
    # added tokens in text; near misses are ordinary text
    s += ["<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
          "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>",
          "<|endoftext|>", "text<|endoftext|>more", "a <|endoftext|> b",
          "<think>\nreasoning here\n</think>\n\nanswer", "<tool_call>{\"name\": \"f\"}</tool_call>",
          "<|im_start|", "< |im_start|>", "<|im_start|><|im_start|>", "<|fim_prefix|>x<|fim_suffix|>",
          "<|image_pad", "<|IM_START|>", "<<|im_end|>>", "<|video_pad|><|vision_pad|>",
          "<|object_ref_start|>dog<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
          "<|im_start|>system\nYou are helpful.<|im_end|>", "  <|im_end|>  ", "\n<|im_end|>\n",
          "<|endoftext|><|endoftext|>", "x<think>y</think>z", "<tool_response>ok</tool_response>",
          "<|repo_name|>r<|file_sep|>f", "e\u0301<|im_end|>e\u0301"]
    # very long words and lines
    s += ["a" * 1000, "ab" * 700, "x" * 5000 + " y", "Pneumonoultramicroscopicsilicovolcanoconiosis",
          "的" * 800, "我爱北京天安门" * 200, "A1b2C3" * 300, "-" * 300, "=" * 81 + "\n",
          " " * 200 + "x", "\n" * 50, "😀" * 200, "ab\u0301" * 300,
          "aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQ=" * 20]
    # punctuation and symbols
    s += ["!!!", "...", "?!\n\n", "--", "—", "«bonjour»", "“quoted” ‘single’", "#$%&", " !",
          "a!b", "(hello)", "[x]{y}", "@user #tag", "a,b;c:d", "50°C ±3", "€100 £50 ¥1000",
          "→ ← ↑ ↓", "∀x∈ℝ: x²≥0", "™®©", "…", "\\n is not a newline", "~/.bashrc", "_"]
    s += [""]
    return s


def fuzz(count, seed):
    """Random strings over a pool of characters that exercise every regex branch and NFC."""
    pool = list("aZ09 '\t\n\r!?.-_") + ["  ", "\r\n", "'s", "'LL", "'ſ", "\u00a0", "\u3000",
            "\u2028", "\x0b", "\x85", "é", "e\u0301", "\u0301", "\u0323", "\u0915", "\u093c",
            "\u094d", "中", "文", "ア", "한", "\u1100", "\u1161", "\u11a8", "ж", "ω", "ب", "\u064e",
            "\u0651", "٣", "½", "Ⅻ", "😀", "👍", "🏽", "\u200d", "\ufe0f", "<|im_end|>",
            "<|image_pad|>", "<think>", "$", "(", "→", "\u2126", "\u0958", "\U00011935",
            "\U00011930", "\u1c89", "ǅ", "ß", "İ", "x"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def byte_char(b):
    """The character GPT-2's byte-level alphabet shows for byte b."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(rows)} lines, {os.path.getsize(path) / 1024:.1f} KiB")


def encode_rows(tok, texts):
    rows = []
    for s in texts:
        ids = tok.encode(s, add_special_tokens=False).ids
        nfc = tok.normalizer.normalize_str(s) if tok.normalizer else s
        # Every added token here is normalized=false and NFC keeps their ASCII text, so decoding
        # gives the normalized text back.
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == nfc, (s, back, nfc)
        row = {"case": "encode", "text": s, "ids": ids}
        if nfc != s:
            row["nfc"] = nfc
        rows.append(row)
    return rows


def split_rows(texts):
    """The pre-tokenizer alone, both regexes: pins the matcher where BPE ids would hide it."""
    from tokenizers import Regex
    from tokenizers.pre_tokenizers import Split
    q2 = Split(Regex(QWEN2_REGEX), behavior="isolated")
    q35 = Split(Regex(QWEN35_REGEX), behavior="isolated")
    return [{"case": "split", "text": s, "qwen2": [p for p, _ in q2.pre_tokenize_str(s)],
             "qwen35": [p for p, _ in q35.pre_tokenize_str(s)]} for s in texts if s]


def decode_rows(tok):
    """Decoding cut multi-byte characters (U+FFFD), special tokens kept and skipped."""
    rows = []
    for s in ["😀👍🏽🇩🇪", "你好世界", "👨‍👩‍👧‍👦 family", "é à ü", "नमस्ते", "🫠x"]:
        ids = tok.encode(s, add_special_tokens=False).ids
        for k in range(1, len(ids)):
            for part in (ids[:k], ids[k:]):
                rows.append({"case": "decode", "ids": part, "skip_special": False,
                             "text": tok.decode(part, skip_special_tokens=False)})
    for s in ["<|im_start|>user\nHi<|im_end|>\n", "<think>x</think><|endoftext|>",
              "<|vision_start|><|image_pad|><|vision_end|>describe", "<tool_call>a</tool_call>"]:
        ids = tok.encode(s, add_special_tokens=False).ids
        for skip in (False, True):
            rows.append({"case": "decode", "ids": ids, "skip_special": skip,
                         "text": tok.decode(ids, skip_special_tokens=skip)})
    # byte tokens that are not UTF-8 on their own, in odd orders: "你" is E4 BD A0
    e4, bd, a0 = (tok.token_to_id(byte_char(b)) for b in (0xE4, 0xBD, 0xA0))
    hello = tok.token_to_id("Hello")
    for ids in ([e4], [e4, e4], [hello, e4, hello], [bd, a0], [e4, bd], [e4, bd, a0],
                [a0, e4, bd], [e4, hello, bd, a0]):
        rows.append({"case": "decode", "ids": ids, "skip_special": False,
                     "text": tok.decode(ids, skip_special_tokens=False)})
    assert any("\ufffd" in r["text"] for r in rows)
    return rows


def mini_tokenizer(full):
    """A small tokenizer.json exercising the options the real Qwen3 file leaves at defaults."""
    byte_tokens = sorted((k for k in full["model"]["vocab"] if len(k) == 1),
                         key=lambda k: full["model"]["vocab"][k])
    vocab = {k: i for i, k in enumerate(byte_tokens)}
    merges = []
    for a, b in full["model"]["merges"][:3000]:
        assert a in vocab and b in vocab
        vocab.setdefault(a + b, len(vocab))
        merges.append(f"{a} {b}")  # the older "a b" string form
    for word in ["Ġhello", "Ġworld", "ĠQwen"]:  # tokens no merge makes: ignore_merges takes them
        vocab.setdefault(word, len(vocab))
    n = len(vocab)
    added = [
        {"id": n, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
        {"id": n + 1, "content": "<mask>", "single_word": True, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
        {"id": n + 2, "content": "<L>", "single_word": False, "lstrip": True, "rstrip": False,
         "normalized": False, "special": False},
        {"id": n + 3, "content": "<R>", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": False, "special": False},
        {"id": n + 4, "content": "<LR>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": True},
        {"id": n + 5, "content": "café", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": n + 6, "content": "<|end|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
        {"id": n + 7, "content": "<|end|>ext", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False},
    ]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
          "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated",
             "invert": False}, bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": True, "vocab": vocab,
                  "merges": merges},
    }


def mini_texts():
    return ["hello world", " hello world", "Hello World", "Qwen hello", "helloworld",
            "a<L>b", "a   <L>b", "a\t\n<L>  b", "<L>", "  <L>", "a<R>b", "a<R>   b", "a<R>\n\tb",
            "<R>", "x  <LR>  y", "<LR><LR>", " <LR> <LR> ", "<L><R><LR>", "a <R> <L> b",
            "<mask>", "a <mask> b", "a<mask> b", "a <mask>b", "<mask>.", "é<mask>", "1<mask>",
            "_<mask>", "-<mask>-", "<mask><mask>", " <mask>\u0301", "\u00a0<mask>\u00a0",
            "café", "cafe\u0301", "un café noir", "CAFÉ", "cafés", "<|end|>ext", "<|end|>ex",
            "<|end|>", "x<|end|>extx", "<|endoftext|>", "e\u0301 \u0915\u093c\u094d\u0937",
            "क्षत्रिय", "naïve", "a\u0301\u0301b", "\u0301", "x \u0301y", "ꦲꦏ꧀ꦱꦫ",
            "مَرْحَبًا", "你好 world", "it'S hello'LL", "e\u0301\u0301 <L>e\u0301"] + fuzz(80, 7)


def main():
    if not os.path.exists(SRC):
        sys.exit(f"gen_tokenizer: {SRC} not found (configure the build first: tools/build.sh)")
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer.from_file(SRC)
    hello = tok.encode("Hello, my dog is cute", add_special_tokens=False).ids
    assert hello == [9707, 11, 847, 5562, 374, 18838], hello  # the reference ids of the README
    full = json.load(open(SRC, encoding="utf-8"))
    assert full["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_REGEX
    texts = handwritten() + fuzz(150, 1)
    rows = encode_rows(tok, texts) + decode_rows(tok) + split_rows(texts + fuzz(300, 2))
    meta = {"case": "meta", "generator": "tools/golden/gen_tokenizer.py",
            "tokenizers": tokenizers.__version__, "source": "tests/data/qwen3-tokenizer"}
    write_jsonl(os.path.join(OUT, "golden.jsonl"), [meta] + rows)

    mini = mini_tokenizer(full)
    mini_path = os.path.join(OUT, "mini.json")
    with open(mini_path, "w", encoding="utf-8") as f:
        json.dump(mini, f, ensure_ascii=False)
    print(f"wrote {mini_path}: {os.path.getsize(mini_path) / 1024:.1f} KiB")
    mtok = Tokenizer.from_file(mini_path)
    mrows = []
    for s in mini_texts():
        ids = mtok.encode(s, add_special_tokens=False).ids
        mrows.append({"case": "encode", "text": s, "ids": ids,
                      "decoded": mtok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": mtok.decode(ids, skip_special_tokens=True)})
    write_jsonl(os.path.join(OUT, "mini.jsonl"), [meta | {"source": "mini.json"}] + mrows)


if __name__ == "__main__":
    main()
