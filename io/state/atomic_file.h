// Writing a file so that a crash or a full disk never leaves a half-written one under its name:
// the bytes go to PATH.tmp, are fsync'ed, and the temporary is renamed over PATH. Readers see
// the old file or the complete new one. Used for weights, packing plans and checkpoints.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vlm::io {

struct ByteRange {
  const void* data = nullptr;
  size_t size = 0;
};

// Writes the concatenation of `pieces` to `path` atomically (see above). `what` names the file in
// errors (e.g. "safetensors file 'x'"); on failure the temporary is removed and a vlm::Error
// says which step failed and why (errno text).
void write_file_atomic(const std::string& path, const std::vector<ByteRange>& pieces,
                       const std::string& what);

} // namespace vlm::io
