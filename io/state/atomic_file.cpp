#include "io/state/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "src/base/check.h"

namespace vlm::io {

void write_file_atomic(const std::string& path, const std::vector<ByteRange>& pieces,
                       const std::string& what) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VLM_CHECK(fd >= 0, what, ": cannot create '", tmp, "': ", std::strerror(errno));
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
    VLM_FAIL(what, ": writing '", tmp, "' failed: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    ::unlink(tmp.c_str());
    VLM_FAIL(what, ": cannot rename '", tmp, "' into place: ", std::strerror(rerr));
  }
}

} // namespace vlm::io
