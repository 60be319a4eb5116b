#include "sim/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace offsim::sim {

namespace {

std::string size_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30) && bytes % (std::int64_t{1} << 30) == 0) {
    return fmt::format("{} GiB", bytes >> 30);
  }
  if (bytes >= (std::int64_t{1} << 20) && bytes % (std::int64_t{1} << 20) == 0) {
    return fmt::format("{} MiB", bytes >> 20);
  }
  return fmt::format("{} bytes", bytes);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

const char* file_type_name(unsigned int st_mode) {
  const auto mode = static_cast<mode_t>(st_mode);
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Result<std::string> read_input_file(const std::string& path, const InputKind& kind) {
  // stat() first: opening a FIFO would block until a writer appears, and opening some devices
  // has side effects. The opened descriptor is checked again (the path may have been replaced).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // Any path that cannot be read is a problem of the input the user named: exit status 2.
    return fail(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInvalidInput,
                "{}: cannot open: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(ErrorCode::kInvalidInput, "{}: is {}, expected {} (a regular file)", path,
                file_type_name(st.st_mode), kind.what);
  }
  const auto too_large = [&](std::int64_t size, bool at_least) {
    return fail(ErrorCode::kLimitExceeded,
                "{}: file is {}{} bytes, more than the limit of {} for {}", path,
                at_least ? "at least " : "", size, size_text(kind.max_bytes), kind.what);
  };
  if (st.st_size > kind.max_bytes) return too_large(st.st_size, false);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    return fail(ErrorCode::kInvalidInput, "{}: cannot open: {}", path, std::strerror(errno));
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return fail(ErrorCode::kInvalidInput, "{}: is {}, expected {} (a regular file)", path,
                file_type_name(st.st_mode), kind.what);
  }
  if (st.st_size > kind.max_bytes) return too_large(st.st_size, false);
  std::string text;
  text.resize(static_cast<std::size_t>(st.st_size));
  std::size_t used = 0;
  // Read until end of file, but never more than max_bytes + 1: a file that grows while it is
  // read is caught by the limit instead of growing the buffer without bound.
  for (;;) {
    if (used == text.size()) {
      if (static_cast<std::int64_t>(used) > kind.max_bytes) {
        return too_large(static_cast<std::int64_t>(used), true);
      }
      const std::size_t cap = static_cast<std::size_t>(kind.max_bytes) + 1;
      text.resize(std::min(cap, std::max<std::size_t>(used * 2, used + 65536)));
    }
    const ssize_t n = ::read(fd.get(), text.data() + used, text.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(ErrorCode::kInvalidInput, "{}: cannot read: {}, expected {}", path,
                  std::strerror(errno), kind.what);
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  text.resize(used);
  return text;
}

Result<std::string> read_text_file(const std::string& path, std::int64_t max_bytes) {
  return read_input_file(path, InputKind{"a text file", max_bytes});
}

Status write_text_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(ErrorCode::kIo, "{}: cannot create: {}", path, std::strerror(errno));
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
