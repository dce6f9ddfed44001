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

// The header entry of tensor `key` (error prefix `where`), checked against the data region
// [data, data + data_len): a known dtype, a non-negative shape, and offsets that hold exactly its
// bytes.
TensorInfo tensor_entry(const std::string& where, const std::string& key,
                        const nlohmann::json& entry, const unsigned char* data, uint64_t data_len) {
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
  uint64_t begin = 0, end = 0;
  VLM_CHECK(joff.is_array() && joff.size() == 2 && get_u64(joff[0], &begin) &&
                get_u64(joff[1], &end),
            where, ": 'data_offsets' ", joff.dump(), " must be [begin, end]");
  VLM_CHECK(begin <= end && end <= data_len, where, ": data_offsets [", begin, ", ", end,
            "] out of range of the data region of ", data_len, " bytes");
  uint64_t expected = 0;
  VLM_CHECK(byte_size(t.shape, t.dtype, &expected), where, ": shape ", shape_str(t.shape),
            " overflows");
  VLM_CHECK(end - begin == expected, where, ": data_offsets [", begin, ", ", end, "] hold ",
            end - begin, " bytes, but ", safetensors_dtype_name(t.dtype), " ", shape_str(t.shape),
            " needs ", expected);
  t.data = data + begin;
  t.nbytes = size_t(expected);
  return t;
}

// Puts the tensors in file order; the sort also lets us reject overlapping ranges in one pass.
void sort_and_check_overlaps(std::vector<TensorInfo>& tensors, const unsigned char* data,
                             const std::string& file) {
  auto offset = [&](const TensorInfo& t) {
    return static_cast<const unsigned char*>(t.data) - data;
  };
  std::sort(tensors.begin(), tensors.end(), [&](const TensorInfo& a, const TensorInfo& b) {
    return offset(a) != offset(b) ? offset(a) < offset(b) : a.name < b.name;
  });
  const TensorInfo* prev = nullptr; // the last non-empty tensor
  for (const TensorInfo& t : tensors) {
    if (t.nbytes == 0) continue;
    VLM_CHECK(!prev || offset(*prev) + ptrdiff_t(prev->nbytes) <= offset(t), file, ", tensor '",
              t.name, "': data overlaps tensor '", prev->name, "'");
    prev = &t;
  }
}

} // namespace

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
  uint64_t header_len = 0;
  for (int i = 0; i < 8; i++) header_len |= uint64_t(bytes[i]) << (8 * i);
  const std::string file = "safetensors file '" + path_ + "'";
  VLM_CHECK(header_len <= map_size_ - 8, file, ": header length ", header_len,
            " exceeds the file size of ", map_size_, " bytes (truncated file?)");
  VLM_CHECK(header_len <= kMaxHeaderBytes, file, ": header length ", header_len,
            " exceeds the limit of ", kMaxHeaderBytes, " bytes");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL(file, ": invalid JSON header: ", e.what());
  }
  VLM_CHECK(header.is_object(), file, ": the JSON header is not an object");

  const unsigned char* data = bytes + 8 + header_len;
  const uint64_t data_len = map_size_ - 8 - header_len;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      VLM_CHECK(entry.is_object(), file, ": __metadata__ is not an object");
      for (const auto& [mk, mv] : entry.items()) {
        VLM_CHECK(mv.is_string(), file, ": __metadata__ value of '", mk, "' is not a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(tensor_entry(file + ", tensor '" + key + "'", key, entry, data, data_len));
  }
  sort_and_check_overlaps(tensors_, data, file);
  for (size_t i = 0; i < tensors_.size(); i++) index_.emplace(tensors_[i].name, i);
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

void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = "safetensors file '" + path + "'";
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
    VLM_CHECK(t.data || nbytes == 0, where, ": null data");
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
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = (uint64_t(json.size()) >> (8 * i)) & 0xff;

  std::vector<ByteRange> pieces{{len_bytes, 8}, {json.data(), json.size()}};
  for (const auto& t : tensors) pieces.push_back({t.data, t.nbytes});
  write_file_atomic(path, pieces, file);
}

} // namespace vlm::io
