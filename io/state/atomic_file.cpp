#include "io/state/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

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

void write_file_atomic(const std::string& path, const std::vector<ByteRange>& pieces,
                       const std::string& what, const std::string& dest) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VLM_CHECK(fd >= 0, what, ": cannot create '", tmp, "': ", write_error_text(errno, dest));
  int err = 0; // errno of the first failure
  for (const ByteRange& piece : pieces) {
    const char* c = static_cast<const char*>(piece.data);
    size_t n = piece.size;
    while (n > 0 && err == 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        err = w < 0 ? errno : EIO;
        break;
      }
      c += w;
      n -= size_t(w);
    }
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    VLM_FAIL(what, ": cannot write '", tmp, "': ", write_error_text(err, dest));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    ::unlink(tmp.c_str());
    VLM_FAIL(what, ": cannot rename '", tmp, "' into place: ", std::strerror(rerr));
  }
}

} // namespace vlm::io
