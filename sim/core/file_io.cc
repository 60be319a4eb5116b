#include "sim/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace offsim::sim {

Result<std::string> read_text_file(const std::string& path, std::int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return fail(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, "{}: cannot open: {}",
                path, std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return fail(ErrorCode::kIo, "{}: is a directory, expected a file", path);
  if (st.st_size > max_bytes) {
    return fail(ErrorCode::kLimitExceeded, "{}: file is {} bytes, more than the limit of {} bytes",
                path, static_cast<std::int64_t>(st.st_size), max_bytes);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorCode::kIo, "{}: cannot open for reading", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return fail(ErrorCode::kIo, "{}: read error", path);
  return buffer.str();
}

Status write_text_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(ErrorCode::kIo, "{}: cannot create: {}", tmp, std::strerror(errno));
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(ErrorCode::kIo, "{}: write failed: {}", path, std::strerror(err));
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(ErrorCode::kIo, "{}: cannot flush: {}", path, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(ErrorCode::kIo, "{}: cannot rename into place: {}", path, std::strerror(err));
  }
  return ok();
}

}  // namespace offsim::sim
