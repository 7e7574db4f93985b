// Reading a user's whole file into memory, bounded: only a regular file
// (a folder, a device such as /dev/zero, a pipe or a socket is refused by
// name, before a byte is read), at most `max_bytes` (a larger file is
// refused, naming the cap), a gzip file named as such when the caller
// expects text, and the system's reason otherwise (ELOOP: a loop of
// symbolic links). For files read whole (scenarios, setup.json, tables to
// plot, token files); traces stream instead (workload/).
#ifndef SERVESIM_COMMON_READ_TEXT_H_
#define SERVESIM_COMMON_READ_TEXT_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace servesim {

inline absl::StatusOr<std::string> ReadTextFile(const std::string& path, int64_t max_bytes,
                                                const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    if (err == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a loop of symbolic links; expected ", what));
    }
    return absl::UnavailableError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st = {};
  if (::fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a folder"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a pipe"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", kind, "; expected ", what));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.st_size, " bytes, more than the ",
                                                   max_bytes, " allowed for ", what));
  }
  std::string text;
  text.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  // The size may change while reading: at most max_bytes + 1 are read.
  while (true) {
    if (got == text.size()) {
      if (static_cast<int64_t>(text.size()) > max_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": more than the ", max_bytes, " bytes allowed for ", what));
      }
      text.resize(text.size() + 4096);
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
      static_cast<unsigned char>(text[1]) == 0x8b) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is gzip-compressed; expected ", what, " as plain text (gunzip it)"));
  }
  return text;
}

}  // namespace servesim

#endif  // SERVESIM_COMMON_READ_TEXT_H_
