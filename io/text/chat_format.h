// Samples -> chat messages -> token ids and labels, in the Qwen chat format:
//   <|im_start|>{role}\n{content}<|im_end|>\n      per message, where an image in the content is
//   <|vision_start|> N x <|image_pad|> <|vision_end|>  with N = the image's token count
//   (grid/merge²).
// Labels (aligned with input_ids; the loss shifts them) are -100 everywhere except the tokens of
// every assistant answer plus its <|im_end|> and the "\n" after it — the reference trainer's rule
// (docs/reference-trainer.md §3.3), but found from the message structure instead of by scanning
// for the "assistant" token, so the word "assistant" inside user text cannot unmask anything.
//
// Sample kinds (docs/energon-format.md §6; detected from the parts, or forced by the subflavor
// type_dataset as in the reference's cookers):
//   conversation  image part(s) + json {"conversations": [{"from"|"role", "value"|"content"}]} or
//                 {"messages": [{"role", "content": str | [{"type": "text"|"image", ...}]}]}
//   caption       image part + txt (or, for type_dataset = llava_recap, json
//   conversations[1].value):
//                 user: [image], assistant: [caption]
//   text          txt only (or json {"text": ...}): plain text, every token trained on, then
//                 <|endoftext|> so packed documents end visibly (ChatFormatOptions::text_eos).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/energon/raw_sample.h"
#include "io/text/tokenizer.h"
#include "src/base/check.h"

namespace vlm::io {

struct ContentItem {
  bool is_image = false;
  std::string text;     // for text items
  int image_index = -1; // for image items: index into ChatSample::image_parts
};

struct Message {
  std::string role; // "system" | "user" | "assistant"
  std::vector<ContentItem> content;
};

enum class SampleKind { conversation, caption, text };

struct ChatSample {
  SampleKind kind = SampleKind::text;
  std::vector<Message> messages;        // conversation and caption samples
  std::string text;                     // text samples
  std::vector<std::string> image_parts; // part names holding the images, in order of use
};

// A sample whose parts do not make a usable chat: the loader skips it and counts it by reason
// ("invalid_json": not JSON or a value of the wrong type, "invalid_utf8", "empty_conversation",
// "no_assistant_turn", "missing_part", "missing_image", "no_user_turn", "empty_text",
// "unknown_json"). what() names the shard and key.
class ChatFormatError : public Error {
public:
  ChatFormatError(std::string reason, const std::string& message)
      : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

private:
  std::string reason_;
};

// Builds the messages of a raw sample; ChatFormatError when it cannot be used. Every text of the
// result is valid UTF-8.
ChatSample parse_chat_sample(const RawSample& sample);

struct ChatFormatOptions {
  bool text_eos = true; // append <|endoftext|> to text samples
  // Text-only models: leave images out of the messages (no placeholders; the loader neither
  // decodes nor sends them). A caption sample becomes an empty user turn and the caption.
  bool drop_images = false;
};

struct TokenizedChat {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels; // -100 = not trained on
};

// Token ids and labels; image_tokens[i] is the number of <|image_pad|> tokens for image_parts[i].
TokenizedChat tokenize_chat(const ChatSample& sample, const Tokenizer& tokenizer,
                            const std::vector<int64_t>& image_tokens,
                            const ChatFormatOptions& options = {});

// The rendered text with one <|image_pad|> per image (what a chat template produces before the
// processor expands the pads); for debugging and golden files.
std::string render_chat(const ChatSample& sample);

} // namespace vlm::io
