// Test fixtures for the tar / Energon reader, written in C++ so that any test can build a
// dataset in a temp dir without Python (docs/energon-format.md §8):
//   TarWriter       ustar members, GNU 'L' or PAX 'x' long names, base-256 and PAX sizes,
//                   PAX global headers, directories; returns energon-style member offsets
//   write_fixture   a whole prepared dataset: shards + .tar.idx + .nv-meta/{dataset.yaml,
//                   split.yaml|split.json, .info.json|.info.yaml, index.uuid}, with options for
//                   excludes, long names, leading non-sample members, part filters and damage
//                   (missing/short index, truncated tar, wrong offsets, garbage headers)
//   fx_basic()      §8.1: 3 shards (3 + 2 + 1 samples), train/val/test, one excluded sample
//   write_fx_edge   §8.2: the edge-case shard (directory, __meta__, README, 110-char name)
// The .tar.idx written is what `energon prepare` would write: the offset of the first header
// (including an extended header) of each sample's first member, then the end-of-members offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vlm::testing {

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag = "energon");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& rel = "") const { return (dir / rel).string(); }
};

// How member names longer than the 100-byte ustar field are written.
enum class LongNames { gnu, pax };

// One 512-byte ustar header (checksum filled in). base256_size writes the size field in GNU
// base-256 form (0x80 + 11 big-endian bytes) instead of octal.
std::string tar_header(const std::string& name, uint64_t size, char type, LongNames magic,
                       bool base256_size = false);
// One PAX record "LEN key=value\n".
std::string pax_record(const std::string& key, const std::string& value);

class TarWriter {
public:
  explicit TarWriter(LongNames long_names = LongNames::gnu) : long_names_(long_names) {}
  // Each add_* returns the offset of the member's first header block (its extended header when
  // it has one), which is what .tar.idx stores for a sample's first member.
  uint64_t add_file(const std::string& name, const std::string& data);
  uint64_t add_dir(const std::string& name);
  // The size stored in base-256 (GNU) form.
  uint64_t add_file_base256_size(const std::string& name, const std::string& data);
  // The header's size field says 0 and a PAX 'x' record carries the real size.
  uint64_t add_file_pax_size(const std::string& name, const std::string& data);
  // A PAX global ('g') header with the given records.
  uint64_t add_pax_global(const std::map<std::string, std::string>& records);
  uint64_t size() const { return bytes_.size(); } // where the end-of-archive blocks will start
  // The archive: members, two zero blocks, zero-padded to a multiple of `record` bytes.
  std::string finish(size_t record = 10240) const;

private:
  void add_data(const std::string& data);
  void add_long_name(const std::string& name);
  LongNames long_names_;
  std::string bytes_;
};

struct FixturePart {
  std::string name; // part name: "json", "jpg", "seg.mask.png"
  std::string data;
};
struct FixtureSample {
  std::string key;
  std::vector<FixturePart> parts; // written in this order
};

// Damage applied to a shard after it was written.
enum class Damage {
  none,
  missing_index,        // no .tar.idx
  short_index,          // .tar.idx one entry short
  truncated,            // tar cut inside the last sample's data, index kept (open-time error)
  truncated_consistent, // tar cut inside the last sample, index end moved to the cut (sample)
  shifted_offset,       // idx[1] += 512: sample 0 overlaps sample 1, sample 1 starts in data
  garbage_header,       // the header of sample 1's first member overwritten with 0xAB bytes
  index_past_end,       // idx[1] set beyond the tar's size (only idx[count] is checked at open)
};

struct FixtureShard {
  std::string name; // relative to the root, e.g. "shards/shard_000000.tar"
  std::vector<FixtureSample> samples;
  LongNames long_names = LongNames::gnu;
  // A directory member and a `__meta__` file before the first sample (so idx[0] > 0).
  bool leading_members = false;
  Damage damage = Damage::none;
  // Count written to .info (default: samples.size()); set to test a mismatch.
  int64_t info_count = -1;
};

struct FixtureDataset {
  std::vector<FixtureShard> shards;
  std::vector<std::pair<std::string, std::vector<std::string>>> splits; // name -> patterns
  std::vector<std::string> exclude;
  std::string dataset_class = "CrudeWebdataset";
  std::map<std::string, std::string> subflavors;
  std::vector<std::string> part_filter; // empty: key not written
  bool info_yaml = false;               // .info.yaml instead of .info.json
  bool split_json = false;              // split.json instead of split.yaml
  bool write_nv_meta = true;
};

// Writes `ds` under `root` (created if needed).
void write_fixture(const std::string& root, const FixtureDataset& ds);

// §8.1 fx_basic: shards/shard_00000{0,1,2}.tar with 3, 2, 1 samples "000000".."000005", each
// {json, jpg} (one 1024-byte member each, so idx = [0, 2048, ...]); train = shards 0-1
// (brace pattern), val = shard 2, test = []; exclude shards/shard_000001.tar/000004;
// subflavors {type_dataset: llava_recap}.
FixtureDataset fx_basic();
std::string fx_basic_json(int k); // the json part of sample k
std::string fx_basic_jpg(int k);  // the jpg part of sample k (opaque bytes)

// §8.2 fx_edge: one shard "edge.tar" (count 3, split train) with members: dir `sub/`,
// `__meta__`, sub/000000.json, sub/000000.seg.mask.png (700 bytes), README (no dot),
// sub/<110 x 'k'>.txt (GNU or PAX long name), sub/000002.txt. idx = [1536, 5120, 7168, 8192].
void write_fx_edge(const std::string& root, LongNames long_names);
std::string fx_edge_long_key(); // "sub/" + 110 x 'k'

// File helpers.
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);
std::vector<uint64_t> read_index(const std::string& path);
void write_index(const std::string& path, const std::vector<uint64_t>& offsets);

} // namespace vlm::testing
