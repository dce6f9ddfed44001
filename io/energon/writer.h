// Writes a prepared Energon CrudeWebdataset (docs/energon-format.md §1): ustar tar shards, a
// .tar.idx beside each (count + 1 little-endian uint64 offsets), and .nv-meta/ with
// dataset.yaml, split.yaml and .info.json — the files `energon prepare` produces and our reader
// (io/energon/dataset.h) needs. Used by `vlmtrain data make-demo` and by tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vlm::io {

struct WriterSample {
  std::string key;                                        // no dot in its basename
  std::vector<std::pair<std::string, std::string>> parts; // part name -> bytes, in tar order
};

struct EnergonWriteOptions {
  int64_t samples_per_shard = 100;
  std::map<std::string, std::string> subflavors; // written to dataset.yaml
  // More files for the dataset folder (path relative to it -> bytes), e.g. the tokenizer.json
  // of `data make-demo`; written before the folder is renamed into place.
  std::map<std::string, std::string> extra_files;
};

// Writes `splits` (split name -> samples, each split into its own shards
// "<split>/shard_000000.tar", ...) under `root`. The dataset is written to a temporary folder
// beside `root` and renamed into place, so `root` is either absent or complete. `root` must not
// exist yet. Errors name the path.
void write_energon_dataset(const std::string& root,
                           const std::map<std::string, std::vector<WriterSample>>& splits,
                           const EnergonWriteOptions& options = {});

// One tar archive in memory: ustar members (names up to 255 bytes via the prefix field) and the
// offset at which each member's header starts.
class TarBuilder {
public:
  // Appends a regular file; returns the offset of its header.
  uint64_t add_file(const std::string& name, const std::string& data);
  // The archive so far plus the two zero end blocks; `end_offset()` is where they begin.
  std::string finish() const;
  uint64_t end_offset() const { return bytes_.size(); }

private:
  std::string bytes_;
};

} // namespace vlm::io
