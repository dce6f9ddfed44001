#include "io/state/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "io/state/atomic_file.h"
#include "src/base/check.h"

namespace vlm::io {

// Tensor bytes are stored and read in host order; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors IO assumes little-endian");

namespace {

// The reference implementation refuses headers above 100 MB; real ones are a few MB at most.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::f32}, {"BF16", DType::bf16}, {"F16", DType::f16}, {"F64", DType::f64},
    {"I32", DType::i32}, {"I64", DType::i64},   {"U8", DType::u8},   {"BOOL", DType::boolean},
};

std::string supported_dtypes() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// numel * element size, or false when it overflows (a hostile header must not wrap around).
bool byte_size(const Shape& shape, DType dtype, uint64_t* out) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  *out = n;
  return true;
}

// A JSON value that must be a non-negative integer; returns false otherwise.
bool get_u64(const nlohmann::json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false; // nlohmann parses every integer >= 0 as unsigned
  *out = v.get<uint64_t>();
  return true;
}

// Closes a file descriptor on scope exit (set fd = -1 to take it over).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The header entry of tensor `key` (error prefix `where`): a known dtype, a non-negative shape, and
// offsets that hold exactly its bytes; returns it with its first byte in `begin`. Whether those
// bytes lie inside the file is the caller's check (a truncated file is told apart).
TensorInfo tensor_entry(const std::string& where, const std::string& key,
                        const nlohmann::json& entry, uint64_t* begin) {
  VLM_CHECK(entry.is_object(), where, ": entry is not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    VLM_CHECK(entry.contains(field), where, ": missing '", field, "'");

  const auto& jdtype = entry["dtype"];
  VLM_CHECK(jdtype.is_string(), where, ": 'dtype' is not a string");
  TensorInfo t;
  t.name = key;
  try {
    t.dtype = safetensors_dtype(jdtype.get<std::string>());
  } catch (const Error& e) {
    VLM_FAIL(where, ": ", e.what());
  }

  const auto& jshape = entry["shape"];
  VLM_CHECK(jshape.is_array(), where, ": 'shape' is not an array");
  for (const auto& d : jshape) {
    uint64_t v = 0;
    VLM_CHECK(get_u64(d, &v) && v <= uint64_t(std::numeric_limits<int64_t>::max()), where,
              ": 'shape' ", jshape.dump(), " must hold non-negative integers");
    t.shape.push_back(int64_t(v));
  }

  const auto& joff = entry["data_offsets"];
  uint64_t end = 0;
  VLM_CHECK(joff.is_array() && joff.size() == 2 && get_u64(joff[0], begin) &&
                get_u64(joff[1], &end),
            where, ": 'data_offsets' ", joff.dump(), " must be [begin, end]");
  VLM_CHECK(*begin <= end, where, ": data_offsets [", *begin, ", ", end, "] out of order");
  uint64_t expected = 0;
  VLM_CHECK(byte_size(t.shape, t.dtype, &expected), where, ": shape ", shape_str(t.shape),
            " overflows");
  VLM_CHECK(end - *begin == expected, where, ": data_offsets [", *begin, ", ", end, "] hold ",
            end - *begin, " bytes, but ", safetensors_dtype_name(t.dtype), " ", shape_str(t.shape),
            " needs ", expected);
  t.nbytes = size_t(expected);
  return t;
}

std::string file_label(const std::string& path) { return "safetensors file '" + path + "'"; }

// The header's length from the file's first 8 bytes, checked against the file's size and the limit.
uint64_t header_length(const std::string& path, const unsigned char* first8, uint64_t file_size) {
  uint64_t header_len = 0;
  for (int i = 0; i < 8; i++) header_len |= uint64_t(first8[i]) << (8 * i);
  VLM_CHECK(header_len <= file_size - 8, file_label(path), ": header length ", header_len,
            " exceeds the file size of ", file_size, " bytes (truncated file?)");
  VLM_CHECK(header_len <= kMaxHeaderBytes, file_label(path), ": header length ", header_len,
            " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  return header_len;
}

// The JSON header (`len` bytes at `json`) of the file `path` of `file_size` bytes: every check but
// the tensors' range against the file's size. Tensors in file order (ties, i.e. empty tensors, by
// name); overlapping ranges are rejected.
SafetensorsHeader parse_header_json(const std::string& path, const unsigned char* json,
                                    uint64_t len, uint64_t file_size) {
  const std::string file = file_label(path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json, json + len);
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL(file, ": invalid JSON header: ", e.what());
  }
  VLM_CHECK(header.is_object(), file, ": the JSON header is not an object");

  SafetensorsHeader h;
  h.path = path;
  h.file_size = file_size;
  h.data_begin = 8 + len;
  struct Entry {
    TensorInfo info;
    uint64_t begin;
  };
  std::vector<Entry> entries;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      VLM_CHECK(entry.is_object(), file, ": __metadata__ is not an object");
      for (const auto& [mk, mv] : entry.items()) {
        VLM_CHECK(mv.is_string(), file, ": __metadata__ value of '", mk, "' is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    uint64_t begin = 0;
    TensorInfo t = tensor_entry(file + ", tensor '" + key + "'", key, entry, &begin);
    entries.push_back({std::move(t), begin});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.info.name < b.info.name;
  });
  const Entry* prev = nullptr; // the last non-empty tensor
  for (const Entry& e : entries) {
    if (e.info.nbytes == 0) continue;
    VLM_CHECK(!prev || prev->begin + prev->info.nbytes <= e.begin, file, ", tensor '", e.info.name,
              "': data overlaps tensor '", prev->info.name, "'");
    prev = &e;
  }
  for (Entry& e : entries) {
    h.tensors.push_back(std::move(e.info));
    h.offsets.push_back(e.begin);
  }
  return h;
}

} // namespace

uint64_t SafetensorsHeader::needed_size() const {
  uint64_t end = 0; // a tensor's end is at most 2^64 - 1 (the header's numbers): no overflow
  for (size_t i = 0; i < tensors.size(); i++) end = std::max(end, offsets[i] + tensors[i].nbytes);
  uint64_t size = 0;
  return __builtin_add_overflow(data_begin, end, &size) ? UINT64_MAX : size;
}

bool SafetensorsHeader::cut_off(size_t i) const {
  return offsets[i] + tensors[i].nbytes > file_size - data_begin; // data_begin <= file_size
}

const TensorInfo* SafetensorsHeader::first_cut_off() const {
  for (size_t i = 0; i < tensors.size(); i++)
    if (cut_off(i)) return &tensors[i];
  return nullptr;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VLM_CHECK(f.fd >= 0, file_label(path), ": cannot open: ", std::strerror(errno));
  struct stat st {};
  VLM_CHECK(::fstat(f.fd, &st) == 0, file_label(path), ": cannot stat: ", std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  VLM_CHECK(size >= 8, file_label(path), ": ", size,
            " bytes, too short for the 8-byte header length (truncated file?)");
  auto read_at = [&](unsigned char* dst, uint64_t n, uint64_t at) {
    for (uint64_t done = 0; done < n;) {
      const ssize_t r = ::pread(f.fd, dst + done, size_t(n - done), off_t(at + done));
      VLM_CHECK(r > 0 || (r < 0 && errno == EINTR), file_label(path), ": cannot read the header: ",
                r == 0 ? "unexpected end of file" : std::strerror(errno));
      if (r > 0) done += uint64_t(r);
    }
  };
  unsigned char first8[8];
  read_at(first8, 8, 0);
  const uint64_t len = header_length(path, first8, size);
  std::vector<unsigned char> json(len);
  read_at(json.data(), len, 8);
  return parse_header_json(path, json.data(), len, size);
}

DType safetensors_dtype(const std::string& name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  VLM_FAIL("unsupported safetensors dtype '", name, "' (supported: ", supported_dtypes(), ")");
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (t == d.dtype) return d.name;
  VLM_FAIL("dtype ", dtype_name(t), " has no safetensors name");
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VLM_CHECK(f.fd >= 0, "safetensors file '", path, "': cannot open: ", std::strerror(errno));
  struct stat st {};
  VLM_CHECK(::fstat(f.fd, &st) == 0, "safetensors file '", path,
            "': cannot stat: ", std::strerror(errno));
  map_size_ = size_t(st.st_size);
  VLM_CHECK(map_size_ >= 8, "safetensors file '", path, "': ", map_size_,
            " bytes, too short for the 8-byte header length (truncated file?)");
  void* p = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  VLM_CHECK(p != MAP_FAILED, "safetensors file '", path, "': mmap of ", map_size_,
            " bytes failed: ", std::strerror(errno));
  map_ = p; // the descriptor is closed by `f`; the mapping stays valid without it
  try {
    parse_header();
  } catch (...) {
    unmap(); // the destructor does not run when the constructor throws
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)), map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)), tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)), metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsFile::unmap() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

void SafetensorsFile::parse_header() {
  const auto* bytes = static_cast<const unsigned char*>(map_);
  const uint64_t len = header_length(path_, bytes, map_size_);
  SafetensorsHeader h = parse_header_json(path_, bytes + 8, len, map_size_);
  if (const TensorInfo* cut = h.first_cut_off()) {
    const size_t i = size_t(cut - h.tensors.data());
    VLM_FAIL(file_label(path_), ", tensor '", cut->name, "': data_offsets [", h.offsets[i], ", ",
             h.offsets[i] + cut->nbytes, "] out of range of the data region of ",
             map_size_ - h.data_begin, " bytes: the file has ", map_size_,
             " bytes, its header needs ", h.needed_size(), " (truncated file?)");
  }
  const unsigned char* data = bytes + h.data_begin;
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
  for (size_t i = 0; i < tensors_.size(); i++) {
    tensors_[i].data = data + h.offsets[i];
    index_.emplace(tensors_[i].name, i);
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> r;
  r.reserve(tensors_.size());
  for (const auto& t : tensors_) r.push_back(t.name);
  return r;
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it != index_.end()) return tensors_[it->second];
  std::string avail;
  for (size_t i = 0; i < tensors_.size() && i < 10; i++)
    avail += (i ? ", " : "") + tensors_[i].name;
  if (tensors_.size() > 10) avail += ", ... (" + std::to_string(tensors_.size() - 10) + " more)";
  VLM_FAIL("safetensors file '", path_, "': no tensor '", name, "'; it has ", tensors_.size(),
           " tensors: ", avail.empty() ? "(none)" : avail);
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

// The 8-byte length and the JSON header of `tensors` (in order, data_offsets from 0), padded with
// spaces to a multiple of 8 bytes; each tensor's name, shape and nbytes checked.
std::string encode_header(const std::string& file, const std::vector<TensorInfo>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the order written, which is easier to read by eye.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::unordered_set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string where = file + ", tensor '" + t.name + "'";
    VLM_CHECK(!t.name.empty() && t.name != "__metadata__", where, ": invalid tensor name");
    VLM_CHECK(seen.insert(t.name).second, where, ": duplicate tensor name");
    uint64_t nbytes = 0;
    VLM_CHECK(byte_size(t.shape, t.dtype, &nbytes), where, ": invalid shape ", shape_str(t.shape));
    VLM_CHECK(nbytes == t.nbytes, where, ": nbytes ", t.nbytes, " but ", dtype_name(t.dtype), " ",
              shape_str(t.shape), " needs ", nbytes);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) { // e.g. a name that is not valid UTF-8
    VLM_FAIL(file, ": cannot encode the header: ", e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' '); // the spec pads with spaces
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char((uint64_t(json.size()) >> (8 * i)) & 0xff);
  return out + json;
}

} // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorInfo> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : what_("safetensors file '" + path + "'"), tensors_(std::move(tensors)),
      header_(encode_header(what_, tensors_, metadata)), file_(path, what_) {
  // The header is checked before the file is made: a bad name or shape leaves nothing behind.
  file_.append(header_.data(), header_.size());
  std::string().swap(header_);
}

void SafetensorsWriter::skip_empty() {
  while (next_ < tensors_.size() && tensors_[next_].nbytes == 0) next_++;
}

void SafetensorsWriter::write(const void* data, size_t nbytes) {
  if (nbytes == 0) return;
  skip_empty();
  VLM_CHECK(next_ < tensors_.size(), what_, ": all ", tensors_.size(), " tensors are written; ",
            nbytes, " more bytes given");
  const TensorInfo& t = tensors_[next_];
  VLM_CHECK(nbytes <= t.nbytes - written_, what_, ", tensor '", t.name, "': ", nbytes,
            " bytes given, ", t.nbytes - written_, " left of its ", t.nbytes);
  VLM_CHECK(data, what_, ", tensor '", t.name, "': null data");
  file_.append(data, nbytes);
  written_ += nbytes;
  if (written_ == t.nbytes) {
    next_++;
    written_ = 0;
  }
}

void SafetensorsWriter::finish() {
  skip_empty();
  VLM_CHECK(next_ == tensors_.size(), what_, ": finished at tensor '",
            next_ < tensors_.size() ? tensors_[next_].name : "", "' (", next_ + 1, " of ",
            tensors_.size(), ", ", written_, " bytes written)");
  file_.commit();
}

void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& t : tensors) // checked before the file is made
    VLM_CHECK(t.data || t.nbytes == 0, "safetensors file '", path, "', tensor '", t.name,
              "': null data");
  SafetensorsWriter writer(path, tensors, metadata);
  for (const auto& t : tensors) writer.write(t.data, t.nbytes);
  writer.finish();
}

} // namespace vlm::io
