#!/usr/bin/env bash
# Tokenizer throughput, single thread: our encode (bench_tokenizer) against HF `tokenizers` on
# the same ~2 MB multilingual corpus, one document per line, and the ratio (target >= 1.5x).
# Both sides are timed in CPU seconds of their process, single-threaded.
# Usage: bench/bench_tokenizer.sh [build_dir]   (default: build; needs bench/bench_tokenizer)
#   VLM_TOKENIZER   tokenizer.json or its directory (default: build/test_data/qwen3-tokenizer,
#                   unpacked from tests/data/qwen3-tokenizer by CMake)
#   CORPUS          a UTF-8 text file to use instead of the generated corpus
# The corpus is made from the translated messages of the machine's gettext catalogs
# (/usr/share/locale/<lang>/LC_MESSAGES/*.mo, 19 languages + English): real multilingual UI text
# with format strings and punctuation. The HF side is skipped, with a message, when `tokenizers`
# cannot be imported (pip install tokenizers).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_tokenizer
tok=${VLM_TOKENIZER:-$root/build/test_data/qwen3-tokenizer}
[[ -x $bin ]] || { echo "bench_tokenizer: $bin not built (cmake -DVLM_BUILD_BENCH=ON)" >&2; exit 1; }
[[ -e $tok ]] || { echo "bench_tokenizer: no tokenizer at $tok (set VLM_TOKENIZER)" >&2; exit 1; }
[[ -d $tok ]] && tok=$tok/tokenizer.json

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
corpus=${CORPUS:-$tmp/corpus.txt}
if [[ -z ${CORPUS:-} ]]; then
  python3 - "$corpus" <<'EOF'
import gettext, glob, random, sys
langs = ["de", "fr", "es", "ru", "uk", "zh_CN", "zh_TW", "ja", "ko", "ar", "he", "hi", "bn", "ta",
         "th", "vi", "el", "tr", "pl"]
target = 2_000_000
per_lang = target // (len(langs) + 1)
texts, english = [], []
for lang in langs:
    got = 0
    for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except Exception:
            continue
        for key, msg in sorted(catalog.items(), key=lambda kv: str(kv[0])):
            key = key[0] if isinstance(key, tuple) else key
            if not isinstance(msg, str) or not msg:
                continue
            texts.append(msg)
            got += len(msg.encode())
            if isinstance(key, str) and key:
                english.append(key)
            if got >= per_lang:
                break
        if got >= per_lang:
            break
got = 0
for key in english:
    texts.append(key)
    got += len(key.encode())
    if got >= per_lang:
        break
if sum(len(t.encode()) for t in texts) < target // 2:
    sys.exit("bench_tokenizer: too few gettext catalogs under /usr/share/locale; set CORPUS")
random.Random(0).shuffle(texts)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write("\n".join(texts))
EOF
fi

ours=$("$bin" --tokenizer "$tok" --corpus "$corpus")
echo "$ours"
hf=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 - "$tok" "$corpus" <<'EOF' || true
import sys, time
try:
    import tokenizers
    from tokenizers import Tokenizer
except ImportError:
    print("hf: skipped (python3 cannot import `tokenizers`; pip install tokenizers)")
    sys.exit(0)
tok = Tokenizer.from_file(sys.argv[1])
docs = open(sys.argv[2], encoding="utf-8", newline="").read().split("\n")  # keep \r
nbytes = sum(len(d.encode()) for d in docs)
def run():
    t = time.process_time()
    n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
    return time.process_time() - t, n
cold, n = run()
warm = min(run()[0] for _ in range(3))
print(f"hf: tokenizers {tokenizers.__version__}; cold {nbytes / cold / 1e6:.2f} MB/s; "
      f"warm {nbytes / warm / 1e6:.2f} MB/s; {n} tokens")
EOF
)
echo "$hf"
python3 - "$root/bench" "$ours" "$hf" <<'EOF'
import re, sys
sys.path.insert(0, sys.argv.pop(1))
import records
def field(text, name):
    m = re.search(name + r" ([0-9.]+) MB/s", text)
    return float(m.group(1)) if m else None
ours, hf = sys.argv[1], sys.argv[2]
if field(hf, "warm") is None:
    print("ratio: not measured (no HF run)")
    sys.exit(0)
for kind in ("cold", "warm"):
    print(f"ratio ({kind}): {field(ours, kind) / field(hf, kind):.1f}x HF tokenizers (target >= 1.5x)")
    records.emit("bench_tokenizer.sh", f"one thread, {kind}", 1, "cpu", "MBps", field(ours, kind),
                 field(hf, kind))
tok = [re.search(r"(\d+) tokens", t).group(1) for t in (ours, hf)]
print("token counts " + ("agree" if tok[0] == tok[1] else f"DIFFER: ours {tok[0]}, hf {tok[1]}"))
EOF
