#include "model/tokenizer_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/base/check.h"

namespace vlm::model {

namespace fs = std::filesystem;

std::map<std::string, std::string> read_tokenizer_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (dir.empty()) return files;
  for (const char* name : kTokenizerFileNames) {
    const fs::path path = fs::path(dir) / name;
    if (!fs::exists(path)) continue;
    std::ifstream in(path, std::ios::binary);
    std::ostringstream contents;
    contents << in.rdbuf();
    VLM_CHECK(in.good() || in.eof(), "cannot read the tokenizer file ", path.string());
    files[name] = contents.str();
  }
  return files;
}

} // namespace vlm::model
