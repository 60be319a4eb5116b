#include "scenarios/output_paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "sim/core/escape.h"
#include "sim/core/file_io.h"

namespace offsim::scenarios {

namespace {

using sim::ErrorCode;

std::string extension_of(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  const auto dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? std::string() : name.substr(dot);
}

std::string join(std::initializer_list<std::string_view> items) {
  std::string out;
  for (std::string_view s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// The same file: device and inode when both exist, else the same absolute, normalised path.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0;
  const bool eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  std::error_code ec;
  const auto ca = std::filesystem::weakly_canonical(a, ec);
  const auto cb = std::filesystem::weakly_canonical(b, ec);
  return !ec && ca == cb;
}

}  // namespace

sim::Status check_output_path(const std::string& flag, const std::string& path,
                              std::initializer_list<std::string_view> extensions,
                              const std::vector<std::string>& inputs) {
  const std::string shown = sim::escape_for_message(path);
  if (path.empty()) return sim::fail(ErrorCode::kInvalidInput, "{}: expected a file name", flag);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{} {}: is a directory, expected a file name (e.g. {}/out{})", flag, shown,
                     shown, extensions.size() > 0 ? *extensions.begin() : "");
  }
  if (exists && !S_ISREG(st.st_mode)) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{} {}: is {}, expected a regular file or a new file name", flag, shown,
                     sim::file_type_name(st.st_mode));
  }
  for (const char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} {}: the name holds a control character; expected a plain file name",
                       flag, shown);
    }
  }
  if (path.back() == '/') {
    return sim::fail(ErrorCode::kInvalidInput, "{} {}: expected a file name, not a folder", flag,
                     shown);
  }
  // The folder must exist: refused here, before any work, rather than when the file is opened.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  struct stat pst {};
  const std::string folder = parent.empty() ? std::string(".") : parent.string();
  if (::stat(folder.c_str(), &pst) != 0 || !S_ISDIR(pst.st_mode)) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{} {}: {} {}; expected a file in an existing folder", flag, shown,
                     sim::escape_for_message(folder),
                     ::stat(folder.c_str(), &pst) != 0 ? "does not exist" : "is not a folder");
  }
  for (const std::string& input : inputs) {
    if (!input.empty() && same_file(path, input)) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} {}: is the input file {}; writing it would destroy the input, choose "
                       "another output path",
                       flag, shown, sim::escape_for_message(input));
    }
  }
  if (extensions.size() > 0) {
    const std::string ext = extension_of(path);
    bool known = false;
    for (std::string_view e : extensions) known = known || ext == e;
    if (!known) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} {}: {} is not a format this output has; expected a name ending in {}",
                       flag, shown,
                       ext.empty() ? std::string("no extension")
                                   : fmt::format("extension '{}'", sim::escape_for_message(ext)),
                       join(extensions));
    }
  }
  return sim::ok();
}

OutputFiles::OutputFiles(std::vector<std::string> inputs) : inputs_(std::move(inputs)) {}

OutputFiles::~OutputFiles() { discard(); }

void OutputFiles::discard() {
  for (Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);
    o.fd = -1;
    if (!o.tmp.empty()) ::unlink(o.tmp.c_str());
    o.tmp.clear();
  }
}

sim::Status OutputFiles::reserve(const std::string& flag, const std::string& path,
                                 std::initializer_list<std::string_view> extensions) {
  if (path.empty()) return sim::ok();
  OFFSIM_RETURN_IF_ERROR(check_output_path(flag, path, extensions, inputs_));
  const std::string shown = sim::escape_for_message(path);
  for (const Output& o : outputs_) {
    if (same_file(path, o.path)) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} {}: is also the output of {}; give each output its own path", flag,
                       shown, o.flag);
    }
  }
  Output out{.flag = flag, .path = path};
  // Beside the destination, so that the final rename stays within one file system. O_EXCL: never
  // reuse or follow an existing file.
  for (int attempt = 0; attempt < 100 && out.fd < 0; ++attempt) {
    out.tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), outputs_.size() * 100 + attempt);
    out.fd = ::open(out.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out.fd < 0 && errno != EEXIST) break;
  }
  if (out.fd < 0) {
    const int err = errno;
    out.tmp.clear();
    return sim::fail(err == ENOENT || err == ENOTDIR ? ErrorCode::kInvalidInput : ErrorCode::kIo,
                     "{} {}: cannot create the file: {}", flag, shown,
                     err == ENOENT ? "its folder does not exist" : std::strerror(err));
  }
  outputs_.push_back(std::move(out));
  return sim::ok();
}

sim::Status OutputFiles::write(const std::string& path, const std::string& contents) {
  for (Output& o : outputs_) {
    if (o.path != path) continue;
    OFFSIM_CHECK_MSG(o.fd >= 0, "output {} written twice or after commit", path);
    const char* data = contents.data();
    std::size_t left = contents.size();
    while (left > 0) {
      const ssize_t n = ::write(o.fd, data, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return sim::fail(ErrorCode::kIo, "{} {}: write failed: {}", o.flag,
                         sim::escape_for_message(path), std::strerror(errno));
      }
      data += n;
      left -= static_cast<std::size_t>(n);
    }
    const int fd = o.fd;
    o.fd = -1;
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
      return sim::fail(ErrorCode::kIo, "{} {}: cannot flush: {}", o.flag,
                       sim::escape_for_message(path), std::strerror(errno));
    }
    o.written = true;
    return sim::ok();
  }
  OFFSIM_CHECK_MSG(false, "output {} was not reserved", path);
  return sim::ok();
}

sim::Status OutputFiles::commit() {
  for (Output& o : outputs_) {
    if (!o.written) continue;
    if (::rename(o.tmp.c_str(), o.path.c_str()) != 0) {
      const int err = errno;
      discard();
      return sim::fail(ErrorCode::kIo, "{} {}: cannot move into place: {}", o.flag,
                       sim::escape_for_message(o.path), std::strerror(err));
    }
    o.tmp.clear();
  }
  discard();
  return sim::ok();
}

}  // namespace offsim::scenarios
