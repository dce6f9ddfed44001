#include "io/state/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include "src/base/check.h"

namespace vlm::io {

std::string write_error_text(int err, const std::string& dest) {
  const std::string text = std::strerror(err);
  const std::string disk = dest.empty() ? "the disk" : "the disk of " + dest;
  const std::string elsewhere = dest.empty() ? "write elsewhere" : "point " + dest + " elsewhere";
  switch (err) {
  case ENOSPC: return text + " (" + disk + " is full; free space or " + elsewhere + ")";
  case EDQUOT:
    return text + " (your quota on " + disk + " is used up; free space or " + elsewhere + ")";
  case EFBIG:
    return text + " (the file is larger than the file system or this process's file size limit, " +
           "ulimit -f, allows)";
  case EROFS: return text + " (" + disk + " is mounted read-only; " + elsewhere + ")";
  case EACCES:
  case EPERM: return text + " (no permission to write there; " + elsewhere + ")";
  case EIO: return text + " (the storage reported an I/O error: the disk or file system fails)";
  default: return text;
  }
}

AtomicFile::AtomicFile(std::string path, std::string what, std::string dest)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), what_(std::move(what)), dest_(std::move(dest)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VLM_CHECK(fd_ >= 0, what_, ": cannot create '", tmp_, "': ", write_error_text(errno, dest_));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return; // committed, or failed and cleaned up
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(int err) {
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  VLM_FAIL(what_, ": cannot write '", tmp_, "': ", write_error_text(err, dest_));
}

void AtomicFile::append(const void* data, size_t size) {
  VLM_CHECK(fd_ >= 0, what_, ": append after commit");
  const char* c = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd_, c, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(w < 0 ? errno : EIO);
    c += w;
    size -= size_t(w);
  }
}

void AtomicFile::commit() {
  VLM_CHECK(fd_ >= 0, what_, ": commit twice");
  // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
  if (::fsync(fd_) != 0) fail(errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    VLM_FAIL(what_, ": cannot write '", tmp_, "': ", write_error_text(err, dest_));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int rerr = errno;
    ::unlink(tmp_.c_str());
    VLM_FAIL(what_, ": cannot rename '", tmp_, "' into place: ", std::strerror(rerr));
  }
}

void write_file_atomic(const std::string& path, const std::vector<ByteRange>& pieces,
                       const std::string& what, const std::string& dest) {
  AtomicFile file(path, what, dest);
  for (const ByteRange& piece : pieces) file.append(piece.data, piece.size);
  file.commit();
}

} // namespace vlm::io
