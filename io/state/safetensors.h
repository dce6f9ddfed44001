// Safetensors files (the Hugging Face weight format): an 8-byte little-endian header length N,
// N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__":
// {string: string}}, then the data region that the offsets index. Files are memory-mapped, so
// opening one costs only the header parse and each rank touches only the bytes it reads.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/state/atomic_file.h"
#include "src/base/dtype.h"
#include "src/base/shape.h"

namespace vlm::io {

// One tensor of a file: `data` points into the mapping (valid while the SafetensorsFile lives)
// or, for write_safetensors, at the caller's bytes. The format has no per-tensor padding, so
// `data` is not necessarily aligned to the element size: copy it (memcpy) before typed access.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// "F32" -> DType::f32, ...; an unknown name is an error that lists the supported ones.
DType safetensors_dtype(const std::string& name);
const char* safetensors_dtype_name(DType t);

// The header of a safetensors file, read with pread: its data region is neither mapped nor read
// (`vlmtrain check-model` checks a snapshot of any size in a few MB). Fully validated as
// SafetensorsFile validates it, except that tensors may lie past the end of the file: the file's
// size against needed_size() / first_cut_off() tells a truncated download.
struct SafetensorsHeader {
  std::string path;
  uint64_t file_size = 0;
  uint64_t data_begin = 0;         // 8 + the header's length: where the data region starts
  std::vector<TensorInfo> tensors; // file order (by data offset); `data` is null
  std::vector<uint64_t> offsets;   // each tensor's first byte, relative to data_begin
  std::map<std::string, std::string> metadata;

  // The size of the complete file: data_begin + the end of its last tensor.
  uint64_t needed_size() const;
  // Whether tensor i's bytes go past the end of the file.
  bool cut_off(size_t i) const;
  // The first tensor (file order) whose bytes go past the end of the file; null when none.
  const TensorInfo* first_cut_off() const;
};

SafetensorsHeader read_safetensors_header(const std::string& path);

// A read-only, memory-mapped safetensors file. The header is fully validated on open; every
// error is a vlm::Error naming the file and, where there is one, the tensor key.
class SafetensorsFile {
public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in file order: by data offset (ties, i.e. empty tensors, by name).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Error for a missing name lists up to 10 of the names the file does have.
  const TensorInfo& get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

private:
  void parse_header();
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_; // file order
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` in the given order (data_offsets relative to the data region, header padded
// with spaces to a multiple of 8 bytes so the data region starts 8-byte aligned). Writes to
// path + ".tmp", fsyncs and renames, so `path` is either the old file or the complete new one.
void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same file written piece by piece: the header (every tensor's name, dtype and shape; their
// `data` is not used) first, then the tensors' bytes in the header's order, each tensor in one
// piece or several, so the writer needs only a piece in memory at a time (HF snapshots of a
// sharded model: model/hf_weights.h). Nothing is in place before finish(); destroyed before it (an
// error on the way), it leaves `path` as it was.
class SafetensorsWriter {
public:
  SafetensorsWriter(const std::string& path, std::vector<TensorInfo> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  // The next `nbytes` of the current tensor (a piece never runs into the next tensor).
  void write(const void* data, size_t nbytes);
  // Every tensor written whole: fsync and rename into place.
  void finish();

private:
  void skip_empty(); // moves past tensors of no bytes

  std::string what_;
  std::vector<TensorInfo> tensors_;
  std::string header_; // encoded before file_ is made; emptied once written
  size_t next_ = 0;    // the current tensor
  size_t written_ = 0; // its bytes so far
  AtomicFile file_;
};

} // namespace vlm::io
