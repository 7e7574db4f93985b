#include "reports/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::StatusOr<std::unique_ptr<OutputDir>> OutputDir::Acquire(const std::string& dir,
                                                              const std::string& holder,
                                                              const Options& options) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  const bool exists = !ec && fs::exists(st);
  if (exists && !fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": is ", KindOf(st),
                     ", not a folder; the outputs need a folder (new, or one an "
                     "earlier servesim run wrote)"));
  }
  // A folder that holds one of the command's inputs: its outputs would sit
  // beside them, and could replace them.
  const fs::path canonical_dir = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  for (const std::string& input : options.inputs) {
    if (input.empty()) continue;
    std::error_code ec2;
    const fs::path in = fs::weakly_canonical(fs::absolute(input, ec2), ec2);
    if (!ec2 && in.parent_path() == canonical_dir) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": holds ", input,
          ", which this command reads; give another output folder (servesim writes its "
          "outputs only where none of its inputs lies)"));
    }
  }
  std::vector<std::string> names;
  if (options.run_outputs) names = RunOutputs();
  names.insert(names.end(), options.also_clear.begin(), options.also_clear.end());
  // A folder that exists, holds anything and has no lock file was not
  // written by servesim.
  std::vector<std::string> forced;
  if (exists && !fs::exists(fs::path(dir) / kLockName, ec)) {
    std::vector<std::string> entries;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      entries.push_back(it->path().filename().string());
    }
    if (ec) {
      return absl::UnavailableError(absl::StrCat(dir, ": cannot read the folder: ", ec.message()));
    }
    std::sort(entries.begin(), entries.end());
    if (!entries.empty() && !options.force) {
      const size_t shown = std::min<size_t>(entries.size(), 3);
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": holds ", entries.size(), " entr", entries.size() == 1 ? "y" : "ies", " (",
          absl::StrJoin(entries.begin(), entries.begin() + shown, ", "),
          entries.size() > shown ? ", ..." : "", ") and no ", kLockName,
          ", so servesim did not write it; give a new or empty folder, or add --force to "
          "replace only servesim's own file names there"));
    }
    for (const std::string& name : names) {
      if (std::binary_search(entries.begin(), entries.end(), name)) forced.push_back(name);
    }
  }
  // Every output's name must be free, a file or a link before anything is
  // removed.
  for (const std::string& name : names) {
    for (const fs::path& path :
         {fs::path(dir) / name, fs::path(dir) / absl::StrCat(".", name, ".partial")}) {
      const fs::file_status ls = fs::symlink_status(path, ec);
      if (ec || !fs::exists(ls) || fs::is_regular_file(ls) || fs::is_symlink(ls)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ": is ", fs::is_directory(ls) ? "a folder" : KindOf(ls),
          " under the name of an output servesim writes; servesim removes only files it wrote: "
          "move it away or give another output folder"));
    }
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot create the output folder: ", ec.message()));
  }
  const std::string lock_path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
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
  out->forced_ = std::move(forced);
  const std::string text = absl::StrCat("pid ", ::getpid(), ": ", holder, "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
    return absl::UnavailableError(absl::StrCat(dir, ": cannot write in the output folder (",
                                               lock_path, ": ", std::strerror(errno), ")"));
  }
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

absl::Status OutputDir::MarkOwned(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  const std::string lock_path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(lock_path, ": cannot write: ", std::strerror(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
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
