// libFuzzer target: the JSON chat parser (io/text/chat_format.h parse_chat_sample), then rendering
// and, when VLM_FUZZ_TOKENIZER names a Qwen tokenizer.json, tokenize_chat as the loader runs it.
// Input: one flag byte, then the json part; a NUL byte ends the json and starts the txt part.
//   flags bits 0-1: image parts (0-3), bit 2: txt part, bit 3: json part,
//         bits 4-5: subflavor type_dataset (none, llava_recap, llava_recap_mn5, none).
#include "io/text/chat_format.h"
#include "tools/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string json = body, txt;
  if (size_t nul = body.find('\0'); nul != std::string::npos) {
    json = body.substr(0, nul);
    txt = body.substr(nul + 1);
  }
  vlm::io::RawSample s;
  s.key = "000042";
  s.shard = "shards/fuzz.tar";
  s.global_index = 42;
  const char* image_names[] = {"jpg", "0.png", "1.jpg"};
  for (int i = 0; i < (flags & 3); i++) s.parts[image_names[i]] = "not decoded here";
  if (flags & 4) s.parts["txt"] = txt;
  if (flags & 8) s.parts["json"] = json;
  const char* types[] = {"", "llava_recap", "llava_recap_mn5", ""};
  if (*types[(flags >> 4) & 3]) s.subflavors["type_dataset"] = types[(flags >> 4) & 3];

  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::io::ChatSample chat = vlm::io::parse_chat_sample(s);
    std::string text = vlm::io::render_chat(chat);
    vlm::fuzz::touch(text.data(), text.size());
    if (const vlm::io::Tokenizer* tok = vlm::fuzz::env_tokenizer()) {
      std::vector<int64_t> pads(chat.image_parts.size(), 4);
      vlm::io::TokenizedChat t = vlm::io::tokenize_chat(chat, *tok, pads);
      if (t.input_ids.size() != t.labels.size()) {
        std::fprintf(stderr, "FINDING: %zu ids but %zu labels\n", t.input_ids.size(),
                     t.labels.size());
        std::abort();
      }
    }
  });
  return 0;
}
