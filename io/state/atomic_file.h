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

// A file written piece by piece (so a large one never needs all its bytes in memory at once) and
// put in place atomically by commit(); destroyed before commit() — an error on the way — it
// removes the temporary and leaves `path` as it was. Errors as write_file_atomic's below.
class AtomicFile {
public:
  AtomicFile(std::string path, std::string what, std::string dest = "");
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* data, size_t size);
  // fsync, close and rename over `path`.
  void commit();

private:
  [[noreturn]] void fail(int err);

  std::string path_, tmp_, what_, dest_;
  int fd_ = -1;
};

// Writes the concatenation of `pieces` to `path` atomically (see above). `what` names the file in
// errors (e.g. "safetensors file 'x'"); on failure the temporary is removed and a vlm::Error
// says which step failed and why: "<what>: cannot write '<path>.tmp': <write_error_text(errno,
// dest)>". `dest` names where the file goes, for that text (a config key; "" = the disk).
void write_file_atomic(const std::string& path, const std::vector<ByteRange>& pieces,
                       const std::string& what, const std::string& dest = "");

// The OS error `err` of a failed write: strerror(err), and for the errors of a full, over-quota,
// read-only or failing disk what to do, e.g. with dest "checkpoint.output_dir": "No space left on
// device (the disk of checkpoint.output_dir is full; free space or point checkpoint.output_dir
// elsewhere)". `dest` names where the file goes (a config key or an option); "" says "the disk".
std::string write_error_text(int err, const std::string& dest = "");

} // namespace vlm::io
