"""Golden token ids and labels for chat formatting (io/text/chat_format.h) -> tests/data/chat/golden.json.

An independent Python rendering of the reference trainer's rules (docs/reference-trainer.md
§3.2-3.3, docs/energon-format.md §6): cookers build messages, the Qwen chat format renders them,
each <|image_pad|> is expanded to the image's token count, the REAL Qwen3 tokenizer (HF
`tokenizers`) encodes the whole text, and labels follow the reference's scan: after each
"assistant" token, unmask from 2 tokens later through the next <|im_end|> and the "\n" after it.
Text samples: every token trained on, plus <|endoftext|> (our documented choice).
Run: pip install tokenizers && python3 tools/golden/gen_chat.py
"""
import json
import os

from tokenizers import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = os.path.join(REPO, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json")
OUT = os.path.join(REPO, "tests", "data", "chat", "golden.json")


def role(r):
    return {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
            "system": "system"}.get(r, "user")


def cook(parts, subflavors):
    """messages as [(role, [("image", i) | ("text", s)])], or ("text", s) for text samples"""
    images = sorted(p for p in parts if p.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png"))
    kind = subflavors.get("type_dataset", "")
    if kind == "llava_recap":
        cap = json.loads(parts["json"])["conversations"][1]["value"]
        return [("user", [("image", i) for i in range(len(images))]), ("assistant", [("text", cap)])]
    if kind == "llava_recap_mn5" or ("txt" in parts and "json" not in parts and images):
        return [("user", [("image", i) for i in range(len(images))]),
                ("assistant", [("text", parts["txt"])])]
    if "json" in parts:
        j = json.loads(parts["json"])
        turns = j.get("conversations", j.get("messages"))
        if turns is None:
            return ("text", j["text"])
        cooked = []
        for t in turns:
            r = role(t.get("from", t.get("role")))
            c = t.get("value", t.get("content"))
            requests, text = 0, ""
            if isinstance(c, list):
                for item in c:
                    if item.get("type") == "image":
                        requests += 1
                    elif item.get("type") == "text":
                        text += item.get("text", "")
            else:
                text = c if isinstance(c, str) else ("" if c is None else json.dumps(c))
            n = text.count("<image>")
            if n:
                text = text.replace("<image>", "").strip(" \t\r\n")
            cooked.append([r, requests + n, text])
        msgs = [(r, []) for r, _, _ in cooked]
        nxt = 0
        for i, (_, req, _) in enumerate(cooked):
            for _ in range(req):
                if nxt < len(images):
                    msgs[i][1].append(("image", nxt))
                    nxt += 1
        first_user = next(i for i, (r, _, _) in enumerate(cooked) if r == "user")
        while nxt < len(images):
            msgs[first_user][1].insert(0, ("image", nxt))
            nxt += 1
        for i, (_, _, text) in enumerate(cooked):
            msgs[i][1].append(("text", text))
        return msgs
    return ("text", parts["txt"])


def render(msgs, image_tokens):
    out = ""
    for r, content in msgs:
        out += f"<|im_start|>{r}\n"
        for kind, v in content:
            out += ("<|vision_start|>" + "<|image_pad|>" * image_tokens[v] + "<|vision_end|>"
                    if kind == "image" else v)
        out += "<|im_end|>\n"
    return out


def reference_labels(ids, tok):
    assistant = tok.encode("assistant", add_special_tokens=False).ids[0]
    eos = tok.token_to_id("<|im_end|>")
    labels = [-100] * len(ids)
    for i, t in enumerate(ids):
        if t != assistant:
            continue
        start = i + 2
        end = next((k for k in range(start, len(ids)) if ids[k] == eos), None)
        if end is None:
            continue
        for k in range(start, min(end + 2, len(ids))):
            labels[k] = ids[k]
    return labels


SAMPLES = [
    ("caption_txt", {"jpg": "", "txt": "A red circle on a white background."}, {}, [4]),
    ("llava_conv", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "<image>\nWhat shape is this?"},
        {"from": "gpt", "value": "It is a blue square."}]})}, {}, [6]),
    ("multi_turn", {"png": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "<image>\nDescribe the picture."},
        {"from": "gpt", "value": "Two green triangles."},
        {"from": "human", "value": "How many corners in total?"},
        {"from": "gpt", "value": "Six corners: 3 + 3 = 6.\nDone."}]})}, {}, [2]),
    ("messages_format", {"jpg": "", "json": json.dumps({"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "¿Qué ves? 你看到了什么？"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Un círculo. 一个圆。 🙂"}]}]})}, {}, [3]),
    ("image_in_second_turn", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "Hello!"},
        {"from": "gpt", "value": "Hi, show me an image."},
        {"from": "human", "value": "Here: <image>"},
        {"from": "gpt", "value": "A yellow star."}]})}, {}, [5]),
    ("no_image_literal", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "Caption this image."},
        {"from": "gpt", "value": "  Leading spaces and trailing newline\n"}]})}, {}, [1]),
    ("assistant_word_in_user_text", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "<image>\nBe my assistant and describe it."},
        {"from": "gpt", "value": "Sure: an orange hexagon."}]})}, {}, [2]),
    ("llava_recap", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "<image>\nIgnored prompt"},
        {"from": "gpt", "value": "Detailed recaption of the scene."}]})}, {"type_dataset": "llava_recap"}, [4]),
    ("llava_recap_mn5", {"jpg": "", "txt": "imagenet caption: a tabby cat"},
     {"type_dataset": "llava_recap_mn5"}, [3]),
    ("two_images", {"0.jpg": "", "1.jpg": "", "json": json.dumps({"conversations": [
        {"from": "human", "value": "<image> and <image>: which is bigger?"},
        {"from": "gpt", "value": "The first."}]})}, {}, [2, 3]),
    ("text_txt", {"txt": "Plain text document.\n\nWith  two   paragraphs\tand tabs."}, {}, []),
    ("text_json", {"json": json.dumps({"text": "def f(x):\n    return x ** 2  # code"})}, {}, []),
    ("unknown_role", {"jpg": "", "json": json.dumps({"conversations": [
        {"from": "narrator", "value": "<image>Look."},
        {"from": "gpt", "value": "Ok."}]})}, {}, [1]),
]


def main():
    tok = Tokenizer.from_file(TOKENIZER)
    eot = tok.token_to_id("<|endoftext|>")
    cases = []
    for key, parts, subflavors, image_tokens in SAMPLES:
        cooked = cook(parts, subflavors)
        if isinstance(cooked, tuple):
            ids = tok.encode(cooked[1], add_special_tokens=False).ids + [eot]
            labels = list(ids)
        else:
            ids = tok.encode(render(cooked, image_tokens), add_special_tokens=False).ids
            labels = reference_labels(ids, tok)
            if key == "assistant_word_in_user_text":
                # The reference scan also unmasks after the word "assistant" in user text (a bug
                # we do not copy): keep only the real answer's span.
                first_answer = max(i for i, t in enumerate(ids) if t == tok.token_to_id("<|im_start|>"))
                labels = [l if i > first_answer else -100 for i, l in enumerate(labels)]
        cases.append({"key": key, "parts": parts, "subflavors": subflavors,
                      "image_tokens": image_tokens, "input_ids": ids, "labels": labels})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/golden/gen_chat.py", "cases": cases}, f, ensure_ascii=False,
                  indent=0)
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
