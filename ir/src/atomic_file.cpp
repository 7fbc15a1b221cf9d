// atomic_file.cpp — temp file + fsync + rename, with every system call checked.
#include "tdpipe/ir/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::ir {
namespace {

[[noreturn]] void fail(std::string_view what, const std::string& path, std::string_view step, int err) {
  throw Error(fmt::format("cannot write {} '{}': {}: {}", what, path, step, std::strerror(err)));
}

/// write(2) until all of `data` is out; returns 0 or the errno of the failure.
int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

/// Closes `fd` once; a failed fsync or close loses data, so both count.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

void write_in_place(const std::string& path, std::string_view data, std::string_view what) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(what, path, "open", errno);
  if (const int err = write_all(fd.get(), data)) fail(what, path, "write", err);
  // Devices and pipes may not support fsync (EINVAL, EROFS): nothing to make durable.
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP)
    fail(what, path, "fsync", errno);
  if (const int err = fd.close()) fail(what, path, "close", err);
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view data, std::string_view what) {
  if (path.empty()) throw Error(fmt::format("cannot write {}: empty file name", what));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw Error(fmt::format("cannot write {} '{}': it is a directory", what, path));
    write_in_place(path, data, what);
    return;
  }
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  Fd fd(::mkstemp(name.data()));
  if (fd.get() < 0) fail(what, path, fmt::format("cannot create a temporary file in '{}'", dir.string()), errno);
  const std::string tmp(name.data());
  try {
    // mkstemp makes 0600; give the file what a plain open would (0666 less the umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    if (::fchmod(fd.get(), 0666 & ~mask) != 0) fail(what, path, "fchmod", errno);
    if (const int err = write_all(fd.get(), data)) fail(what, path, "write", err);
    if (::fsync(fd.get()) != 0) fail(what, path, "fsync", errno);
    if (const int err = fd.close()) fail(what, path, "close", err);
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(what, path, "rename", errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the folder is synced; a failure here loses nothing written.
  if (Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dfd.get() >= 0) ::fsync(dfd.get());
}

void finish_stdout() {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  int err = flushed ? 0 : errno;
  if (flushed && !std::ferror(stdout) && std::cout) return;
  if (err == 0) {
    // An earlier buffered write failed and its errno is gone. The output is incomplete
    // anyway, so one more byte asks the system why (a full disk, a closed pipe persist).
    if (::write(STDOUT_FILENO, "\n", 1) < 0) err = errno;
  }
  throw Error(fmt::format("cannot write to standard output: {} (the output is incomplete)",
                          err ? std::strerror(err) : "an earlier write failed"));
}

}  // namespace tdpipe::ir
