// `vlmtrain generate`: greedy text from an HF snapshot (a trained checkpoint, or a downloaded
// model) for one chat prompt, optionally with an image, decoded with a KV cache
// (model/generate.h):
//
//   vlmtrain generate --model DIR [--image FILE] --prompt TEXT [--max-new-tokens N]
//                     [--tokenizer PATH] [--device cpu|cuda[:N]] [--dtype f32|bf16]
//                     [--min-pixels N] [--max-pixels N]
//
// The prompt becomes one user turn (the image first, as the demo data and most VLM data put it)
// followed by the assistant header; the answer is printed up to <|im_end|> or the token limit.
// Images are preprocessed with the snapshot's preprocessor_config.json (the trainer writes it for
// VLMs), else the Qwen3-VL defaults; --min-pixels / --max-pixels override it.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

int cmd_generate(const std::vector<std::string>& args);

} // namespace vlm::cli
