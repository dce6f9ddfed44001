// libFuzzer target: the tokenizer (io/text/tokenizer.h). The first byte picks the mode:
//   even: the rest is a tokenizer.json; when it loads, a fixed text with special tokens is
//         encoded and decoded and every id is looked up;
//   odd:  the rest is text, encoded with the tokenizer VLM_FUZZ_TOKENIZER names (a real Qwen
//         tokenizer.json, loaded once) and decoded back.
#include <optional>

#include "io/text/tokenizer.h"
#include "tools/fuzz/fuzz_common.h"

namespace {

void exercise(const vlm::io::Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> ids = tok.encode(text);
  std::string back = tok.decode(ids);
  vlm::fuzz::touch(back.data(), back.size());
  tok.decode(ids, true);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) {
      std::fprintf(stderr, "FINDING: encode gave id %d outside the vocabulary of %lld\n", id,
                   (long long)tok.vocab_size());
      std::abort();
    }
    tok.id_to_token(id);
    tok.is_special(id);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    const std::string& path = vlm::fuzz::write_scratch("tokenizer", data + 1, size - 1);
    vlm::fuzz::expect_only_vlm_errors([&] {
      vlm::io::Tokenizer tok = vlm::io::Tokenizer::from_file(path);
      exercise(tok, "<|im_start|>user\nHello wörld 123 <think>\n\n</think> ok<|im_end|>\n");
      if (tok.vocab_size() > 0) tok.id_to_token(int32_t(tok.vocab_size() - 1));
    });
  } else {
    const vlm::io::Tokenizer* tok = vlm::fuzz::env_tokenizer();
    if (!tok) return 0;
    std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    vlm::fuzz::expect_only_vlm_errors([&] { exercise(*tok, text); });
  }
  return 0;
}
