#include "io/text/pre_tokenizer.h"

#include "io/text/tokenizer.h"
#include "src/base/check.h"

namespace vlm::io {

std::vector<std::string_view> pre_tokenize(std::string_view text, bool marks_are_letters) {
  const size_t bad = unicode::utf8_find_invalid(text);
  VLM_CHECK(bad == std::string_view::npos,
            "pre_tokenize: the text is not valid UTF-8 (byte offset ", bad, ")");
  std::vector<std::string_view> pieces;
  split_pieces(text, marks_are_letters, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

} // namespace vlm::io
