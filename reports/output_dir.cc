#include "reports/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace servesim::reports {
namespace {

namespace fs = std::filesystem;

constexpr char kLockName[] = ".servesim.lock";

std::string KindOf(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::regular:
      return "a file";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::fifo:
      return "a pipe";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "not a folder";
  }
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  if (::lseek(fd, 0, SEEK_SET) < 0) return out;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

const std::vector<std::string>& OutputDir::RunOutputs() {
  static const auto* names = new std::vector<std::string>{
      "summary.json", "run_info.json", "requests.csv", "iterations.csv",
      "links.csv",    "timeline.json", "report.html"};
  return *names;
}

absl::StatusOr<std::unique_ptr<OutputDir>> OutputDir::Acquire(
    const std::string& dir, const std::string& holder, const std::vector<std::string>& also_clear) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!ec && fs::exists(st) && !fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": is ", KindOf(st),
                     ", not a folder; the outputs need a folder (new, or one an "
                     "earlier servesim run wrote)"));
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot create the output folder: ", ec.message()));
  }
  const std::string lock_path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(dir, ": cannot write in the output folder (",
                                               lock_path, ": ", std::strerror(errno), ")"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string who(absl::StripAsciiWhitespace(ReadAll(fd)));
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": another servesim is writing its outputs there (",
                       who.empty() ? "its lock file names no holder" : who,
                       "); wait for it to finish, or give another output folder"));
    }
    return absl::UnavailableError(absl::StrCat(lock_path, ": cannot lock: ", std::strerror(err)));
  }
  auto out = std::unique_ptr<OutputDir>(new OutputDir(dir, fd));
  const std::string text = absl::StrCat("pid ", ::getpid(), ": ", holder, "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
    return absl::UnavailableError(absl::StrCat(dir, ": cannot write in the output folder (",
                                               lock_path, ": ", std::strerror(errno), ")"));
  }
  std::vector<std::string> names = RunOutputs();
  names.insert(names.end(), also_clear.begin(), also_clear.end());
  for (const std::string& name : names) {
    for (const std::string& path : {out->Path(name), out->TempPath(name)}) {
      if (!fs::remove(path, ec) && ec && ec != std::errc::no_such_file_or_directory) {
        return absl::UnavailableError(
            absl::StrCat(path, ": cannot remove an earlier run's output: ", ec.message()));
      }
    }
  }
  return out;
}

OutputDir::~OutputDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string OutputDir::Path(absl::string_view name) const {
  return (fs::path(dir_) / std::string(name)).string();
}

std::string OutputDir::TempPath(absl::string_view name) const {
  return (fs::path(dir_) / absl::StrCat(".", name, ".partial")).string();
}

absl::Status OutputDir::Commit(absl::string_view name) const {
  if (std::rename(TempPath(name).c_str(), Path(name).c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat(Path(name), ": cannot write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status OutputDir::Write(absl::string_view name, absl::string_view text) const {
  const std::string tmp = TempPath(name);
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) {
    const int err = errno;
    std::error_code ec;
    fs::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat(Path(name), ": cannot write: ", std::strerror(err)));
  }
  return Commit(name);
}

}  // namespace servesim::reports
