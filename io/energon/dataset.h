// A Megatron-Energon prepared WebDataset (CrudeWebdataset) read as it lies on disk, no Python:
//
//   root/.nv-meta/dataset.yaml    __class__, subflavors, part_filter (a list of part names)
//   root/.nv-meta/split.yaml      split_parts: {split: [shard patterns]}, exclude: [...]
//                                 (split.json when split.yaml is missing)
//   root/.nv-meta/.info.json      shard_counts: {shard: count} (.info.yaml when missing)
//   root/<shard>.tar + <shard>.tar.idx   uint64 LE offsets: sample i = [i==0 ? 0 : idx[i],
//                                        idx[i+1]); count + 1 entries
//
// Semantics follow energon (docs/energon-format.md §1-§2, checked against the energon package):
// split entries and excludes are brace-expanded (io/energon/brace_expand.h); a split's shards keep
// the file's order, which defines the split's global sample index space; an exclude entry equal to
// a shard name removes that shard from every split; an entry "<shard>/<key>" marks one sample as
// excluded (read, counted, never emitted); counts come from .info, never from the index.
// index.sqlite is not needed.
//
// Whole-dataset problems are vlm::Errors naming the file: a missing .nv-meta, .info or split
// config, a split entry missing from .info, and, per split, a missing tar or .tar.idx, an index
// whose size is not 8 x (count + 1) bytes, or whose last entry lies beyond the tar's size. Shard
// problems are found by open() but reported when their split is used (split(), read_sample()),
// so a broken `test` shard does not block training on `train`.
//
// Bad data inside a shard is a SampleError, which a loader skips and counts by reason.
//
// Thread safety: after open() the object is immutable except for an internal cache of open
// files (mutex-protected); read_sample() may be called from many threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/energon/raw_sample.h"
#include "src/base/check.h"

namespace vlm::io {

// One sample that cannot be read. The loader skips it and counts it by `reason`:
//   truncated        a header or part runs past the sample's byte range or the file end, or an
//                    end-of-archive block lies inside the range (truncated shard / bad index)
//   bad_header       a block where a tar header should be is not one (a .tar.idx offset into
//                    the middle of data, a corrupt shard, a malformed PAX/GNU record)
//   bad_index        the .tar.idx byte range itself is impossible (end before begin, beyond the
//                    tar's size)
//   inconsistent_key the range holds members of two different keys (index and tar disagree)
//   no_parts         no member of the range forms a sample, or none passes part_filter
// what() names the dataset root, split, global index, shard, key (when known) and byte offsets.
class SampleError : public vlm::Error {
public:
  enum class Reason { truncated, bad_header, bad_index, inconsistent_key, no_parts };
  SampleError(Reason reason, std::string shard, std::string key, int64_t global_index,
              const std::string& message);
  Reason reason;
  std::string shard; // relative to the dataset root
  std::string key;   // "" when the failure came before the first member
  int64_t global_index;
};
// "truncated", "bad_header", ... (stable names for counters and reports).
const char* sample_error_reason_name(SampleError::Reason reason);

struct ShardInfo {
  std::string name;        // relative to the dataset root, as in split.yaml
  std::string path;        // root + "/" + name
  std::string index_path;  // the .tar.idx beside it (pathlib with_suffix(".tar.idx"))
  int64_t count = 0;       // samples, from .info
  int64_t first_index = 0; // global index of its first sample within its split
};

struct EnergonOpenOptions {
  std::string dataset_config = "dataset.yaml"; // in .nv-meta/
  std::string split_config = "split.yaml";     // in .nv-meta/; the default falls back to split.json
  size_t max_open_files = 128;                 // tar + idx descriptors kept open (LRU)
};

class EnergonDataset {
public:
  struct Split {
    std::string name;
    std::vector<ShardInfo> shards; // in split order (excluded shards removed)
    int64_t num_samples = 0;       // sum of counts, excluded samples included
    int64_t excluded_shards = 0;   // shards of the split's patterns dropped by 'exclude'
  };

  // Reads and checks the metadata (see the file comment). Throws vlm::Error naming the path.
  static EnergonDataset open(const std::string& root, const EnergonOpenOptions& options = {});
  ~EnergonDataset();
  EnergonDataset(EnergonDataset&&) noexcept;
  EnergonDataset& operator=(EnergonDataset&&) noexcept;

  const std::string& root() const;
  // dataset.yaml `__class__` ("CrudeWebdataset"), or the `sample_type` class of a typed dataset
  // (then read_sample still returns raw parts; a warning was logged at open).
  const std::string& dataset_class() const;
  const std::map<std::string, std::string>& subflavors() const; // dataset.yaml `subflavors`
  const std::vector<std::string>& part_filter() const;          // empty: every part is read
  const std::string& energon_version() const;                   // from .info.json, may be ""
  // Every exclude entry after brace expansion: shard names and "<shard>/<key>".
  const std::vector<std::string>& excludes() const;

  std::vector<std::string> split_names() const; // in split-config order
  bool has_split(const std::string& name) const;
  // Throws for an unknown split (listing the known ones) or a split whose shards failed
  // validation at open. A split with no shards (`test: []`, or all excluded) is valid and empty.
  const Split& split(const std::string& name) const;

  // Whether split.yaml excludes the sample "<shard>/<key>".
  bool is_excluded(const std::string& shard, const std::string& key) const;
  // (shard position within split.shards, index within that shard) of a global index.
  std::pair<size_t, int64_t> locate(const Split& split, int64_t global_index) const;

  // Reads sample `global_index` of a split: its byte range from the .tar.idx, then the tar
  // members in it (only parts in part_filter are read). An excluded sample comes back with
  // `excluded` set and no parts. Bad data: SampleError. An index out of range or an I/O error
  // is a vlm::Error.
  RawSample read_sample(const std::string& split, int64_t global_index) const;
  RawSample read_sample(const Split& split, int64_t global_index) const;

  // The whole .tar.idx of a shard (count + 1 offsets), for tools and tests.
  std::vector<uint64_t> read_shard_index(const ShardInfo& shard) const;

private:
  struct Impl;
  explicit EnergonDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace vlm::io
