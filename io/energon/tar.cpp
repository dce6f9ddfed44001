#include "io/energon/tar.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

namespace vlm::io {
namespace {

constexpr uint64_t kBlock = 512;
// Bound on GNU long-name and PAX header data: real ones are a few hundred bytes; a huge value
// means the "header" is garbage (a wrong index offset), not a name to allocate.
constexpr uint64_t kMaxExtendedBytes = uint64_t(1) << 20;

uint64_t round_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

std::string_view field(const char* h, size_t off, size_t len) {
  std::string_view f(h + off, len);
  size_t nul = f.find('\0');
  return nul == std::string_view::npos ? f : f.substr(0, nul);
}

// A numeric header field: octal text (NUL/space terminated, blank = 0), or GNU base-256 when the
// first byte is 0x80 (positive) or 0xff (negative, two's complement). False when malformed.
bool parse_number(const char* h, size_t off, size_t len, int64_t* out) {
  auto b = reinterpret_cast<const unsigned char*>(h + off);
  if (b[0] == 0x80 || b[0] == 0xff) {
    unsigned __int128 v = 0;
    for (size_t i = 1; i < len; i++) v = (v << 8) | b[i];
    __int128 s = __int128(v);
    if (b[0] == 0xff) s -= __int128(1) << (8 * (len - 1));
    if (s > INT64_MAX || s < INT64_MIN) return false;
    *out = int64_t(s);
    return true;
  }
  std::string_view f = field(h, off, len);
  size_t i = 0, j = f.size();
  while (i < j && (f[i] == ' ' || f[i] == '\t')) i++;
  while (j > i && (f[j - 1] == ' ' || f[j - 1] == '\t' || f[j - 1] == '\n')) j--;
  int64_t v = 0;
  for (size_t k = i; k < j; k++) {
    if (f[k] < '0' || f[k] > '7' || v > (INT64_MAX >> 3)) return false;
    v = v * 8 + (f[k] - '0');
  }
  *out = v;
  return true;
}

// Accepts the unsigned sum (POSIX) and the signed sum that some old tars wrote.
bool checksum_ok(const char* h) {
  int64_t stored = 0;
  if (!parse_number(h, 148, 8, &stored)) return false;
  int64_t u = 8 * ' ', s = 8 * ' ';
  for (size_t i = 0; i < kBlock; i++) {
    if (i >= 148 && i < 156) continue;
    u += static_cast<unsigned char>(h[i]);
    s += static_cast<signed char>(h[i]);
  }
  return stored == u || stored == s;
}

bool all_zero(const char* h) {
  return std::all_of(h, h + kBlock, [](char c) { return c == 0; });
}

// Types Python's tarfile knows to carry no data even if the size field says otherwise.
bool dataless_type(char t) { return t >= '1' && t <= '6'; }

// PAX records "LEN key=value\n" (LEN counts the whole record) into `out`, as leniently as
// Python's tarfile: parsing stops at the first text that does not start like a record (padding),
// a value is cut to what the buffer holds, and the trailing newline is not checked. A record
// length of 0 is an error (false), as in tarfile.
bool parse_pax(std::string_view data, std::map<std::string, std::string>* out) {
  size_t pos = 0;
  for (;;) {
    size_t i = pos;
    while (i < data.size() && data[i] >= '0' && data[i] <= '9') i++;
    if (i == pos || i >= data.size() || data[i] != ' ') return true;
    size_t eq = data.find('=', i + 1);
    if (eq == std::string_view::npos || eq == i + 1) return true;
    uint64_t len = 0;
    for (size_t k = pos; k < i; k++)
      len = std::min<uint64_t>(len * 10 + uint64_t(data[k] - '0'), kMaxExtendedBytes + 1);
    if (len == 0) return false;
    size_t value_end = size_t(std::min<uint64_t>(pos + len - 1, data.size()));
    std::string_view value = value_end > eq + 1 ? data.substr(eq + 1, value_end - eq - 1) : "";
    (*out)[std::string(data.substr(i + 1, eq - i - 1))] = std::string(value);
    pos += size_t(len);
    if (pos >= data.size()) return true;
  }
}

// A PAX number field as tarfile reads it: int(value), and 0 when that fails. Negative: false.
bool pax_number(std::string value, int64_t* out) {
  value.erase(0, value.find_first_not_of(" \t\n"));
  value.erase(value.find_last_not_of(" \t\n") + 1);
  if (!value.empty() && value[0] == '-') return false;
  bool digits =
      !value.empty() && value.size() <= 18 &&
      std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  *out = digits ? std::stoll(value) : 0;
  return true;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// ReadOnlyFile

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VLM_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    bool regular = S_ISREG(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    VLM_CHECK(regular, "'", path, "' is not a regular file");
    VLM_FAIL("cannot stat '", path, "': ", std::strerror(err));
  }
  size_ = uint64_t(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)),
      size_(std::exchange(other.size_, 0)) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

size_t ReadOnlyFile::read_at(uint64_t offset, void* dst, size_t n) const {
  size_t done = 0;
  auto p = static_cast<char*>(dst);
  while (done < n) {
    ssize_t r = ::pread(fd_, p + done, n - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    VLM_CHECK(r >= 0, "read of ", n, " bytes at offset ", offset, " of '", path_,
              "' failed: ", std::strerror(errno));
    if (r == 0) break; // end of file
    done += size_t(r);
  }
  return done;
}

// ---------------------------------------------------------------------------------------------
// TarError / TarRangeReader

TarError::TarError(Kind k, std::string f, uint64_t off, const std::string& what)
    : vlm::Error("tar '" + f + "' at byte " + std::to_string(off) + ": " + what), kind(k),
      file(std::move(f)), offset(off) {}

TarRangeReader::TarRangeReader(const ReadOnlyFile& file, uint64_t begin, uint64_t end,
                               size_t buffer_bytes)
    : file_(file), pos_(begin), end_(end) {
  // No larger than the range: a small sample needs one small read, not a 1 MiB buffer.
  uint64_t range = end > begin ? end - begin : 0;
  buf_cap_ = size_t(std::max<uint64_t>(std::min<uint64_t>(buffer_bytes, range), 4 * kBlock));
  buf_.reset(new char[buf_cap_]);
}

void TarRangeReader::read_exact(uint64_t offset, char* dst, size_t n, const char* what) {
  if (offset + n > end_)
    throw TarError(TarError::Kind::truncated, file_.path(), offset,
                   std::string(what) + " of " + std::to_string(n) +
                       " bytes runs past the end of the range at byte " + std::to_string(end_));
  // Served from the buffer when it holds the bytes; small reads refill it from `offset`.
  if (offset >= buf_offset_ && offset + n <= buf_offset_ + buf_len_) {
    std::memcpy(dst, buf_.get() + (offset - buf_offset_), n);
    return;
  }
  if (n <= buf_cap_) {
    size_t want = size_t(std::min<uint64_t>(buf_cap_, end_ - offset));
    buf_offset_ = offset;
    buf_len_ = file_.read_at(offset, buf_.get(), want);
    if (buf_len_ >= n) {
      std::memcpy(dst, buf_.get(), n);
      return;
    }
  } else if (file_.read_at(offset, dst, n) == n) {
    return;
  }
  throw TarError(TarError::Kind::truncated, file_.path(), offset,
                 std::string(what) + " of " + std::to_string(n) +
                     " bytes runs past the end of the file (" + std::to_string(file_.size()) +
                     " bytes)");
}

std::string TarRangeReader::read_extended(uint64_t offset, uint64_t size, const char* what) {
  if (size > kMaxExtendedBytes)
    throw TarError(TarError::Kind::corrupt, file_.path(), offset,
                   std::string(what) + " header claims " + std::to_string(size) + " bytes");
  std::string data(size, '\0');
  read_exact(offset + kBlock, data.data(), size, what);
  return data;
}

// Overrides collected from the extended headers before a member ('L' name, PAX path, PAX size).
// The first (outermost) one wins, as in Python's tarfile, which applies the outer header last.
struct TarRangeReader::Overrides {
  std::optional<std::string> name;
  std::optional<int64_t> size;
  std::map<std::string, std::string> pax_records;
  bool have_pax = false;
};

bool TarRangeReader::next(TarMember* m) {
  Overrides ext;
  uint64_t first = pos_; // where the member's first header is ('g' blocks before it excluded)
  char h[kBlock];
  for (;;) {
    const uint64_t here = pos_;
    if (!read_header(first, h)) return false;
    int64_t size = 0;
    if (!parse_number(h, 124, 12, &size) || size < 0)
      throw TarError(TarError::Kind::corrupt, file_.path(), pos_, "bad size field in tar header");
    const char type = h[156];
    if (type == 'L' || type == 'K') {
      std::string data = read_extended(pos_, uint64_t(size), "GNU long name");
      if (type == 'L' && !ext.name) ext.name = std::string(field(data.data(), 0, data.size()));
      pos_ += kBlock + round_up(uint64_t(size));
      continue;
    }
    if (type == 'x' || type == 'X' || type == 'g') {
      read_pax(type, uint64_t(size), &ext);
      if (type == 'g' && here == first) first = pos_; // the 'g' block belongs to no member
      continue;
    }
    take_member(h, size, ext, first, m);
    return true;
  }
}

// Reads the header block at pos_ into h; false at the end of the range or archive, which must
// not come between a member and its extended headers (read since `first`).
bool TarRangeReader::read_header(uint64_t first, char* h) {
  if (pos_ >= end_) {
    if (pos_ == first) return false;
    throw TarError(TarError::Kind::truncated, file_.path(), first,
                   "extended header without a following member before the end of the range");
  }
  read_exact(pos_, h, kBlock, "tar header");
  if (all_zero(h)) {
    if (pos_ == first) return false; // end-of-archive marker
    throw TarError(TarError::Kind::corrupt, file_.path(), pos_,
                   "zero block after an extended header");
  }
  if (!checksum_ok(h))
    throw TarError(TarError::Kind::corrupt, file_.path(), pos_,
                   "not a tar header (bad checksum; a wrong .tar.idx offset or a corrupt "
                   "shard)");
  return true;
}

// A PAX header of `size` data bytes at pos_ ('x'/'X' for the next member, 'g' global): its
// records into *ext or global_pax_; pos_ moves past it.
void TarRangeReader::read_pax(char type, uint64_t size, Overrides* ext) {
  const uint64_t here = pos_;
  std::string data = read_extended(pos_, size, "PAX");
  std::map<std::string, std::string> recs;
  if (!parse_pax(data, &recs))
    throw TarError(TarError::Kind::corrupt, file_.path(), pos_,
                   "malformed PAX records (a record of length 0)");
  pos_ += kBlock + round_up(size);
  if (type == 'g') {
    // Python's tarfile keeps global records and applies them only through a later 'x' header.
    for (auto& [k, v] : recs) global_pax_[k] = v;
    return;
  }
  if (ext->have_pax) return;
  ext->have_pax = true;
  ext->pax_records = global_pax_;
  for (auto& [k, v] : recs) ext->pax_records[k] = v;
  const auto& records = ext->pax_records;
  if (auto it = records.find("path"); it != records.end() && !ext->name) {
    std::string path = it->second;
    while (!path.empty() && path.back() == '/') path.pop_back(); // tarfile strips them
    ext->name = std::move(path);
  }
  if (auto it = records.find("size"); it != records.end()) {
    int64_t s = 0;
    if (!pax_number(it->second, &s))
      throw TarError(TarError::Kind::corrupt, file_.path(), here,
                     "bad PAX size '" + it->second + "'");
    ext->size = s;
  }
  if (records.count("GNU.sparse.map") || records.count("GNU.sparse.size") ||
      records.count("GNU.sparse.major"))
    throw TarError(TarError::Kind::corrupt, file_.path(), here,
                   "GNU sparse members are not supported");
}

// The member whose own header h is at pos_ (with `size` from it), after the overrides of its
// extended headers from `first` on; pos_ moves past its data.
void TarRangeReader::take_member(const char* h, int64_t size, Overrides& ext, uint64_t first,
                                 TarMember* m) {
  char type = h[156];
  std::string name(field(h, 0, 100));
  if (type == '\0') type = (!name.empty() && name.back() == '/') ? '5' : '0';
  // The ustar prefix field, used as tarfile does (for any magic; GNU tar leaves it zero outside
  // incremental archives).
  std::string_view prefix = field(h, 345, 155);
  if (!prefix.empty()) name = std::string(prefix) + "/" + name;
  if (ext.name) name = *ext.name;
  if (ext.size) size = *ext.size;
  if (type == 'S')
    throw TarError(TarError::Kind::corrupt, file_.path(), pos_,
                   "GNU sparse member '" + name + "' is not supported");

  m->name = std::move(name);
  m->type = type;
  m->offset = first;
  m->data_offset = pos_ + kBlock;
  m->size = dataless_type(type) ? 0 : uint64_t(size);
  m->pax = std::move(ext.pax_records);
  if (m->data_offset + m->size > file_.size())
    throw TarError(TarError::Kind::truncated, file_.path(), pos_,
                   "member '" + m->name + "' has " + std::to_string(m->size) +
                       " data bytes but the file ends at byte " + std::to_string(file_.size()));
  pos_ = m->data_offset + round_up(m->size);
}

std::string TarRangeReader::read_data(const TarMember& m) {
  std::string data(m.size, '\0');
  if (m.size > 0)
    read_exact(m.data_offset, data.data(), m.size, ("data of '" + m.name + "'").c_str());
  return data;
}

// ---------------------------------------------------------------------------------------------
// Names and grouping

bool tar_is_meta_name(std::string_view name) {
  // energon: re.match(r"__[^/]*__($|/)") - the first path component is __<...>__.
  std::string_view first = name.substr(0, name.find('/'));
  return first.size() >= 4 && first.substr(0, 2) == "__" && first.substr(first.size() - 2) == "__";
}

bool tar_split_name(std::string_view name, std::string_view* key, std::string_view* part) {
  // energon: re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$"). The dot is the first one of the
  // basename. The key before it must end in a non-empty, dot-free run that may reach back
  // over one '/' (so "a/.hidden" -> key "a/", but ".hidden" and "x.y/.hidden" do not match).
  size_t slash = name.rfind('/');
  size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  size_t dot = name.find('.', base);
  if (dot == std::string_view::npos) return false;
  if (dot == base) { // the basename starts with the dot: the run must be "<segment>/"
    if (slash == std::string_view::npos) return false;
    size_t prev = slash == 0 ? std::string_view::npos : name.rfind('/', slash - 1);
    size_t seg = prev == std::string_view::npos ? 0 : prev + 1;
    if (name.substr(seg, slash - seg).find('.') != std::string_view::npos) return false;
  }
  *key = name.substr(0, dot);
  *part = name.substr(dot + 1);
  return true;
}

std::vector<std::string> TarSample::part_names() const {
  std::vector<std::string> out;
  for (const TarMember& m : members) {
    std::string_view key, part;
    if (tar_split_name(m.name, &key, &part)) out.emplace_back(part);
  }
  return out;
}

std::vector<TarSample> scan_tar_samples(const ReadOnlyFile& file, uint64_t begin, uint64_t end,
                                        uint64_t* end_offset) {
  std::vector<TarSample> samples;
  TarRangeReader reader(file, begin, end);
  TarMember m;
  uint64_t stop = begin;
  while (reader.next(&m)) {
    stop = m.data_offset + round_up(m.size);
    if (!m.is_regular() || tar_is_meta_name(m.name)) continue;
    std::string_view key, part;
    if (!tar_split_name(m.name, &key, &part)) continue;
    if (samples.empty() || samples.back().key != key) {
      samples.emplace_back();
      samples.back().key = std::string(key);
      samples.back().offset = m.offset;
    }
    samples.back().members.push_back(std::move(m));
  }
  if (end_offset) *end_offset = stop;
  return samples;
}

} // namespace vlm::io
