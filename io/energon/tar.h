// Reading tar archives by byte range, as WebDataset/Energon shards need: a sample is the byte
// range [idx[i], idx[i+1]) of an uncompressed tar, found through the shard's .tar.idx.
//
// Supported dialects (what Python's tarfile, webdataset and GNU tar write):
// - POSIX ustar ("ustar\0" "00"), with the 155-byte `prefix` field joined to the name;
// - GNU ("ustar  \0"): 'L' long names, 'K' long link names, base-256 numeric fields;
// - PAX: 'x' records for the next member (`path`, `size`, `linkpath`) and 'g' global records,
//   which apply to every later member of the scanned range;
// - old v7 headers (no magic).
// Header checksums are verified (unsigned byte sum, or the signed sum some old tars wrote).
//
// Sample grouping follows Energon/webdataset exactly (megatron/energon/flavors/webdataset/
// config.py): only regular members count; a member whose path starts with `__<anything
// without />__` followed by the end or '/' is skipped; the key is the path up to the first dot
// of the basename and the part is the rest (`a/b.seg.mask.png` -> key `a/b`, part
// `seg.mask.png`); names that do not split that way are skipped. A sample is a run of
// consecutive members with the same key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/check.h"

namespace vlm::io {

// A file opened read-only for positional reads. pread does not move a shared file position, so
// one object may be used by many threads at once.
class ReadOnlyFile {
public:
  // Throws vlm::Error naming the path when it cannot be opened or is not a regular file.
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; } // at open time
  // Reads up to n bytes at `offset` (retrying short reads); returns fewer only at end of file.
  // A read error is a vlm::Error naming the file and offset.
  size_t read_at(uint64_t offset, void* dst, size_t n) const;

private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Malformed tar data. `kind` says why, for callers that count bad samples by reason:
// truncated = a header or member data runs past the end of the range or file;
// corrupt   = a block where a header should be is not one (checksum, number fields, records).
class TarError : public vlm::Error {
public:
  enum class Kind { truncated, corrupt };
  TarError(Kind kind, std::string file, uint64_t offset, const std::string& what);
  Kind kind;
  std::string file;
  uint64_t offset; // byte offset in the file of the block the problem was found in
};

// One member as Python's tarfile sees it, after applying GNU/PAX extended headers.
struct TarMember {
  std::string name;         // full path (GNU 'L' / PAX path / ustar prefix applied)
  char type = '0';          // typeflag of the member's own header ('\0' is reported as '0')
  uint64_t offset = 0;      // first header block, including preceding 'L'/'K'/'x' headers
  uint64_t data_offset = 0; // first data byte
  uint64_t size = 0;        // data bytes (PAX `size` applied)
  std::map<std::string, std::string> pax; // PAX records that applied ('g' then 'x')
  // Regular file: '0' or '\0' or '7' (contiguous). GNU sparse ('S') is not supported.
  bool is_regular() const { return type == '0' || type == '7'; }
};

// Sequential reader over the members that start in [begin, end) of a file. Data is read through
// a buffer (one pread serves every small member of a sample); data of a member that is never
// asked for is not read when it lies outside the buffer.
class TarRangeReader {
public:
  TarRangeReader(const ReadOnlyFile& file, uint64_t begin, uint64_t end,
                 size_t buffer_bytes = size_t(1) << 20);
  // The next member; false at `end` or at an end-of-archive zero block. Throws TarError.
  bool next(TarMember* member);
  // The data of `member`, which must lie inside the range. Throws TarError when it does not.
  std::string read_data(const TarMember& member);
  // Where the next header would be read. After next() returned false, a position before `end`
  // means an end-of-archive zero block was found inside the range.
  uint64_t position() const { return pos_; }

private:
  // Copies [offset, offset+n) into dst; n may exceed the buffer. Throws TarError(truncated).
  void read_exact(uint64_t offset, char* dst, size_t n, const char* what);
  std::string read_extended(uint64_t offset, uint64_t size, const char* what);
  // The steps of next() (tar.cpp).
  struct Overrides;
  bool read_header(uint64_t first, char* h);
  void read_pax(char type, uint64_t size, Overrides* ext);
  void take_member(const char* h, int64_t size, Overrides& ext, uint64_t first, TarMember* m);

  const ReadOnlyFile& file_;
  uint64_t pos_, end_;
  std::unique_ptr<char[]> buf_; // uninitialised: zero-filling 1 MiB per sample would dominate
  size_t buf_cap_ = 0;
  uint64_t buf_offset_ = 0; // file offset of buf_[0]
  size_t buf_len_ = 0;      // valid bytes in buf_
  std::map<std::string, std::string> global_pax_;
};

// Energon's member name rules (see the file comment).
// True for paths energon skips as metadata: `__meta__`, `__x__/y.json` (not `__key__.json`).
bool tar_is_meta_name(std::string_view name);
// Splits a member path into sample key and part name; false when it has no such split
// (`README`, `dir.x/file`, `.hidden`). The views point into `name`.
bool tar_split_name(std::string_view name, std::string_view* key, std::string_view* part);

// A sample found by scanning a whole tar: the consecutive members that share `key`.
struct TarSample {
  std::string key;
  uint64_t offset = 0;            // offset of its first member (what .tar.idx stores)
  std::vector<TarMember> members; // in file order
  std::vector<std::string> part_names() const;
};

// Groups the members of [begin, end) into samples with energon's rules, reading no data.
// `end_offset` (optional) receives where scanning stopped: the end-of-archive zero block, or
// `end`. The offsets of the samples plus that end offset are what energon writes to .tar.idx.
std::vector<TarSample> scan_tar_samples(const ReadOnlyFile& file, uint64_t begin, uint64_t end,
                                        uint64_t* end_offset = nullptr);

} // namespace vlm::io
