#!/usr/bin/env bash
# `vlmtrain check-model DIR` on snapshots the binary writes itself (a tiny Qwen3, Qwen3-VL and
# Qwen3.5 after one training step): the good ones pass with a summary; a truncated
# model.safetensors, a missing tokenizer.json, an unknown model_type, a tensor of the wrong shape,
# a VLM without preprocessor_config.json and a missing shard of an index snapshot each fail naming
# the file (and tensor). Then a Qwen3-0.6B snapshot of 1.2 GB whose data part is a sparse file
# (no byte of it written): it passes under a virtual-memory limit of 600 MB above what the binary
# needs to start (so the weights are neither mapped nor read), and fails when cut by one byte.
#   tests/cli/test_check_model.sh [--asan] <path to vlmtrain> <Qwen3 tokenizer dir>
# --asan (a sanitizer build): no address-space limit, which ASan's shadow memory cannot live in.
set -euo pipefail
asan=0
if [[ ${1:-} == --asan ]]; then
  asan=1
  shift
fi
bin="$1"
qwen3_tok="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1

# --- tiny snapshots, written by one training step each ---------------------------------------
"$bin" data make-demo "$dir/demo" --train 40 --val 8 >/dev/null
snapshot() { # <preset> <out>: the HF snapshot checkpoint-step-1 of one step of <preset>
  cat >"$dir/$1.toml" <<EOF
[model]
model_name = "check"
preset = "$1"
tokenizer = "$dir/demo"

[training]
seed = 0
total_steps = 1
warmup_steps = 0
micro_batch_rows = 1
param_dtype = "f32"
eval_steps = 0

[data]
data_path = "$dir/demo"
seq_len = 64
packing_buffer_size = 8
num_workers = 1
min_pixels = 9216
max_pixels = 9216

[checkpoint]
output_dir = "$dir/run-$1"
format = "safetensors"
save_steps = 1

[logging]
progress = false
EOF
  "$bin" train --config "$dir/$1.toml" >"$dir/train-$1.log" 2>&1 ||
    { cat "$dir/train-$1.log"; fail "training $1 failed"; }
  mv "$dir/run-$1/checkpoint-step-1" "$2"
}
snapshot tiny "$dir/text"
snapshot tiny-vl "$dir/vl"
snapshot tiny-3.5 "$dir/q35" # every family: Qwen3.5 (Gated DeltaNet, its own vision tower)

passes() { # <snapshot> <pattern the summary must hold>
  local out
  out=$("$bin" check-model "$1" 2>&1) || fail "check-model $1 failed: $out"
  grep -q -- "$2" <<<"$out" || fail "check-model $1: no '$2' in: $out"
  echo "$out"
}
fails() { # <snapshot> <patterns the error must hold...>
  local d="$1" out
  shift
  if out=$("$bin" check-model "$d" 2>&1); then fail "check-model $d passed: $out"; fi
  for p in "$@"; do grep -q -- "$p" <<<"$out" || fail "check-model $d: no '$p' in: $out"; done
}
copy() { cp -r "$dir/$1" "$dir/$2" && echo "$dir/$2"; }

passes "$dir/text" "is a qwen3 snapshot: 2 layers, .* parameters (f32), .* tensors in 1 file"
passes "$dir/vl" "is a qwen3_vl snapshot: .* preprocessor_config.json: ok"
passes "$dir/q35" "is a qwen3_5 snapshot: .* preprocessor_config.json: ok"
q35cut=$(copy q35 q35-cut)
truncate -s -100 "$q35cut/model.safetensors"
fails "$q35cut" "truncated: model.safetensors has" "tensors cut off, the first: "
"$bin" check-model --help | grep -q "Usage: vlmtrain check-model" || fail "check-model --help"
"$bin" help | grep -q "check-model" || fail "check-model is not in vlmtrain help"

# The safetensors header, edited with the standard library only (CI has no pip packages).
cat >"$dir/st.py" <<'EOF'
import json, os, struct, sys

def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()

def write(path, header, data=b"", size=None):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
        if size is not None:  # the data part as a sparse file: no byte of it written
            f.truncate(8 + len(h) + size)

def transpose(path, suffix):  # a 2-D tensor's shape swapped: the same bytes, the wrong shape
    header, data = read(path)
    name = next(k for k in sorted(header) if k.endswith(suffix))
    a, b = header[name]["shape"]
    assert a != b
    header[name]["shape"] = [b, a]
    write(path, header, data)
    print(name)

def split(d):  # model.safetensors -> two shards and model.safetensors.index.json
    header, data = read(os.path.join(d, "model.safetensors"))
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    weight_map = {}
    for i, part in enumerate([names[: len(names) // 2], names[len(names) // 2 :]]):
        file = "model-%05d-of-00002.safetensors" % (i + 1)
        out, chunks, at = {}, [], 0
        for k in part:
            b, e = header[k]["data_offsets"]
            out[k] = dict(header[k], data_offsets=[at, at + e - b])
            chunks.append(data[b:e])
            at += e - b
            weight_map[k] = file
        if meta:
            out["__metadata__"] = meta
        write(os.path.join(d, file), out, b"".join(chunks))
    os.remove(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f)

def qwen3_0_6b(d):  # the Qwen3-0.6B config (docs/qwen-models.md) and its bf16 weights, sparse
    H, L, Hq, Hkv, D, I, V = 1024, 28, 16, 8, 128, 3072, 151936
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": H,
              "num_hidden_layers": L, "num_attention_heads": Hq, "num_key_value_heads": Hkv,
              "head_dim": D, "intermediate_size": I, "vocab_size": V, "tie_word_embeddings": True,
              "rope_theta": 1000000, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
              "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16"}
    shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    for l in range(L):
        p = "model.layers.%d." % l
        shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                       p + "self_attn.q_proj.weight": [Hq * D, H],
                       p + "self_attn.k_proj.weight": [Hkv * D, H],
                       p + "self_attn.v_proj.weight": [Hkv * D, H],
                       p + "self_attn.o_proj.weight": [H, Hq * D],
                       p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                       p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                       p + "mlp.down_proj.weight": [H, I]})
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    write(os.path.join(d, "model.safetensors"), header, size=at)
    print(at)

globals()[sys.argv[1]](*sys.argv[2:])
EOF
st() { python3 "$dir/st.py" "$@"; }

# --- each damage fails naming its file (and tensor) --------------------------------------------
d=$(copy text truncated)
truncate -s -10 "$d/model.safetensors"
fails "$d" "truncated: model.safetensors has [0-9]* bytes, its header needs [0-9]*" \
  "tensors cut off, the first: "

d=$(copy text no_tokenizer)
rm "$d/tokenizer.json"
fails "$d" "no_tokenizer/tokenizer.json: missing"

d=$(copy text bad_tokenizer)
head -c 100 "$dir/text/tokenizer.json" >"$d/tokenizer.json"
fails "$d" "bad_tokenizer/tokenizer.json"

d=$(copy text unknown_type)
python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c["model_type"]="llama_xyz"; json.dump(c,open(p,"w"))' \
  "$d/config.json"
fails "$d" "unknown_type/config.json: model_type \"llama_xyz\" is not a registered" \
  "registered model types: qwen3, qwen3_vl"

d=$(copy text wrong_shape)
name=$(st transpose "$d/model.safetensors" mlp.up_proj.weight)
fails "$d" "wrong shape: $name in model.safetensors: expected (\([0-9]*\), \([0-9]*\)), stored (\2, \1)"

d=$(copy vl no_preprocessor)
rm "$d/preprocessor_config.json"
fails "$d" "no_preprocessor/preprocessor_config.json: missing"
d=$(copy text text_needs_no_preprocessor)
rm -f "$d/preprocessor_config.json"
passes "$d" "is a qwen3 snapshot" >/dev/null

# Every problem at once, not only the first.
d=$(copy vl several)
truncate -s -1 "$d/model.safetensors"
rm "$d/tokenizer.json" "$d/preprocessor_config.json"
fails "$d" "3 problems" "truncated: model.safetensors" "several/tokenizer.json: missing" \
  "several/preprocessor_config.json: missing"

# An index snapshot of two shards passes; without its second shard it fails naming it.
d=$(copy vl sharded)
st split "$d"
passes "$d" "tensors in 2 files" >/dev/null
rm "$d/model-00002-of-00002.safetensors"
fails "$d" "model-00002-of-00002.safetensors does not exist" \
  "(model.safetensors.index.json names it for [0-9]* tensors: "
# The loader (training's own path) refuses it with the same plan's words.
if out=$("$bin" export --checkpoint "$d" --out "$dir/exported" 2>&1); then
  fail "export of a snapshot without its second shard succeeded"
fi
grep -q "model-00002-of-00002.safetensors does not exist" <<<"$out" ||
  fail "load: the missing shard is not named: $out"

# --- 1.2 GB of sparse weights: headers only, under a virtual-memory limit ----------------------
big="$dir/qwen3-0.6b"
bytes=$(st qwen3_0_6b "$big")
cp "$qwen3_tok/tokenizer.json" "$qwen3_tok/tokenizer_config.json" "$big/"
[[ $(du -k "$big/model.safetensors" | cut -f1) -lt 10240 ]] || fail "the sparse file takes space"
# The least address space (KiB, to 16 MiB) in which the binary starts: its shared libraries
# (CUDA's among them) are mapped whatever the command; the check must fit in 600 MB more. A probe
# just above the libraries can spin forever (OpenBLAS retries its 128 MB buffer's malloc at load),
# so each one has a time limit and a probe that runs out of it counts as too little.
starts() { { (ulimit -v "$1" && timeout -s KILL 5 "$bin" help >/dev/null 2>&1); } 2>/dev/null; }
limit=unlimited
if ((!asan)); then
  lo=0 hi=$((16 << 20))
  starts $hi || fail "vlmtrain help does not start in $hi KiB of address space"
  while ((hi - lo > 16384)); do
    mid=$(((lo + hi) / 2))
    if starts $mid; then hi=$mid; else lo=$mid; fi
  done
  limit=$((hi + 600 * 1024))
fi
cat >"$dir/measure.py" <<'EOF'
import resource, subprocess, sys, time
t = time.monotonic()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
dt = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print("%s%s[rc %d, %.2f s, peak RSS %.0f MiB]" % (p.stdout, p.stderr, p.returncode, dt, rss))
sys.exit(p.returncode)
EOF
out=$(ulimit -v $limit && python3 "$dir/measure.py" "$bin" check-model "$big") ||
  fail "check-model of the sparse 0.6B snapshot failed under ulimit -v $limit KiB: $out"
grep -q "is a qwen3 snapshot: 28 layers, 5.96e8 parameters (bf16), 310 tensors in 1 file (1.19 GB)" \
  <<<"$out" || fail "sparse 0.6B: unexpected summary: $out"
echo "sparse Qwen3-0.6B ($bytes bytes of weights), ulimit -v $limit KiB (the binary starts in" \
  "${hi:-?} KiB): $out"
truncate -s -1 "$big/model.safetensors"
if out=$(ulimit -v $limit && python3 "$dir/measure.py" "$bin" check-model "$big"); then
  fail "the sparse snapshot cut by 1 byte passed: $out"
fi
size=$(stat -c %s "$big/model.safetensors")
grep -q "truncated: model.safetensors has $size bytes, its header needs $((size + 1))" <<<"$out" ||
  fail "sparse 0.6B cut by 1 byte: not named as truncated: $out"
grep -q "1 of its 310 tensors cut off, the first: model.layers.27.mlp.down_proj.weight" <<<"$out" ||
  fail "sparse 0.6B cut by 1 byte: the last tensor is not the one cut off: $out"
echo "check-model: good snapshots pass; truncated, missing and mis-shaped parts fail by name"
