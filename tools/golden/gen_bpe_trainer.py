#!/usr/bin/env python3
"""Golden data for the BPE trainer (tests/io/text/test_bpe_trainer.cpp), made by HF `tokenizers`.

Files under tests/data/bpe/:
  corpus.json     the training texts (CORPUS below), a JSON array of strings
  tokenizer.json  what our trainer (io/text/bpe_trainer.h) makes of them: vocab_size 400 with the
                  special tokens <|endoftext|>, <|im_start|>, <|im_end|>. The test "bpe trainer:
                  the golden tokenizer is what the trainer makes of its corpus" checks that it
                  still is, and rewrites it when run with VLM_WRITE_BPE_GOLDEN=1 (done here with
                  --test-io)
  golden.jsonl    {"case": "meta", ...}, then one {"case": "encode", "text": s, "ids": HF's ids,
                  "decoded": HF's decode(ids)} per test string (STRINGS below), from loading
                  tokenizer.json in HF `tokenizers`

Usage: pip install tokenizers==0.23.3 &&
       python3 tools/golden/gen_bpe_trainer.py [--test-io build/tests/test_io]
(with --test-io: writes corpus.json, has the trainer rewrite tokenizer.json, then golden.jsonl;
without: golden.jsonl from the committed tokenizer.json).
"""
import argparse
import json
import os
import subprocess
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "data", "bpe")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 400

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs "
    "into the forest.",
    "In the picture there are three shapes: a red circle, a green square and a blue triangle.",
    "What do you see? I see a yellow diamond on a white background. There is one shape.",
    "How many shapes are there? There are two. What colour is the first shape? It is orange.",
    "Training a tokenizer is simple: count the pairs, merge the most frequent one, and repeat "
    "until the vocabulary is full.",
    "The training loop reads the data, computes the loss, and updates the weights of the "
    "model with the optimizer.",
    "<|im_start|>user\nDescribe the image.<|im_end|>\n<|im_start|>assistant\nA purple circle "
    "and a black square.<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!"
    "<|im_end|>\n<|im_start|>assistant\nHello! How can I help you today?<|im_end|>\n",
    "Plain text documents end with a marker.<|endoftext|>",
    "def train(model, data):\n    for batch in data:\n        loss = model(batch)\n"
    "        loss.backward()\n    return loss\n",
    "for (int i = 0; i < n; i++) {\n  sum += values[i];\n}\n",
    "Numbers: 1, 2, 3, 10, 42, 100, 2024, 3.14159 and 1,000,000.",
    "Ich sehe einen roten Kreis und ein grünes Quadrat. Die Straße ist lang und schön.",
    "Je vois un cercle rouge et un carré vert. C'est très joli, n'est-ce pas ?",
    "Veo un círculo rojo y un cuadrado verde. ¿Qué ves tú? La niña está aquí.",
    "Я вижу красный круг и зелёный квадрат. Что ты видишь? Это очень красиво.",
    "我看到一个红色的圆和一个绿色的正方形。你看到了什么？这是一个很好的例子。",
    "赤い円と緑の四角があります。これは何ですか？とても良い例です。",
    "빨간 원과 초록색 사각형이 있습니다. 무엇이 보입니까?",
    "Emoji: 😀 😀 👍 👍🏽 🎉 🎉 ❤️ — and dashes – and “quotes” and ‘single’ ones…",
    "I'm sure you're right; they've said we'll see, he'd know, it's theirs. Don't stop.",
    "  indented line\n\tand a tab\n\n\nmany newlines   and trailing spaces   \n",
    "Café naïve façade résumé coöperate élève déjà vu.",
]

STRINGS = [
    # the corpus' own kind of text
    "The quick brown fox jumps over the lazy dog.",
    "In the picture there is one shape: A red circle.",
    "How many shapes are there?",
    "There are three.",
    "What colour is the first shape? It is purple.",
    "the the the the",
    "Training the model until the loss is small.",
    # special tokens, alone, adjacent, inside words, incomplete
    "<|endoftext|>",
    "<|im_start|>user\nWhat do you see?<|im_end|>\n<|im_start|>assistant\nA blue square.<|im_end|>\n",
    "<|im_end|><|im_end|><|endoftext|>",
    "word<|endoftext|>word",
    "<|im_start|",
    "<|endoftext|>x<|endoftext",
    "<|vision_start|> is not special here",
    # whitespace
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "a  b   c",
    "\tindented\n    code\n",
    "trailing   ",
    "\r\n\r\n",
    "  \n  \n  ",
    # digits and punctuation
    "12345",
    "3.14159 and 1,000,000",
    "!!! ??? ... ---",
    "(x) [y] {z} <w>",
    "I'm sure you're right; they've said we'll see.",
    "I'M SURE YOU'RE RIGHT",
    # code
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; i++) { sum += values[i]; }",
    # other scripts, seen and unseen
    "Ich sehe einen roten Kreis.",
    "Die Straße ist schön.",
    "C'est très joli.",
    "¿Qué ves tú?",
    "Я вижу красный круг.",
    "我看到一个红色的圆。",
    "赤い円と緑の四角。",
    "빨간 원과 초록색 사각형",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    # emoji
    "😀👍🏽🎉",
    "👨‍👩‍👧‍👦 family",
    "❤️ love",
    # NFC: decomposed input is composed before BPE
    "Cafe\u0301 re\u0301sume\u0301",
    "A\u030a and \u212b",
    # control and rare characters (byte tokens)
    "\x00\x01\x02\x7f",
    "\u00a0nbsp\u3000ideographic space",
    "\U0010ffff\U0001d7d8",
    "x" * 120,
    "unbelievably-long-hyphenated-word-that-was-never-seen-before",
]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--test-io", help="path of the built test_io binary: rewrite corpus.json "
                    "and tokenizer.json with our trainer first")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    tok_path = os.path.join(OUT, "tokenizer.json")
    if args.test_io:
        with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
            json.dump(CORPUS, f, ensure_ascii=False, indent=1)
            f.write("\n")
        env = dict(os.environ, VLM_WRITE_BPE_GOLDEN="1")
        subprocess.run([args.test_io, "bpe trainer: the golden tokenizer is what the trainer "
                        "makes of its corpus"], env=env, check=True)
    if not os.path.exists(tok_path):
        sys.exit(f"gen_bpe_trainer: {tok_path} not found (run with --test-io to make it)")

    tok = Tokenizer.from_file(tok_path)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE, tok.get_vocab_size()
    for k, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == VOCAB_SIZE - len(SPECIALS) + k, s
    assert len(STRINGS) >= 50, len(STRINGS)
    rows = []
    for s in STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == unicodedata.normalize("NFC", s), (s, back)  # byte fallback: no loss
        rows.append({"case": "encode", "text": s, "ids": ids, "decoded": back})
    meta = {"case": "meta", "generator": "tools/golden/gen_bpe_trainer.py",
            "tokenizers": tokenizers.__version__, "source": "tests/data/bpe/tokenizer.json"}
    write_jsonl(os.path.join(OUT, "golden.jsonl"), [meta] + rows)
    print(f"wrote {os.path.join(OUT, 'golden.jsonl')}: {len(rows)} strings")


if __name__ == "__main__":
    main()
