// A run's output folder, made ready before the simulation starts so that a
// bad folder fails at once rather than after the run, and so that what the
// folder holds afterwards is exactly this run's outputs.
//
//  - Checked: the path must be a folder (or not exist yet: it is created);
//    a file, a device such as /dev/null, or a folder that cannot be written
//    (a read-only file system) is an error naming the path.
//  - Locked: an exclusive flock(2) on DIR/.servesim.lock for the run's
//    life. A second run into the same folder fails at once, naming the
//    holder (pid and command, written into the lock file). The kernel drops
//    the lock when the process ends, however it ends, so a crashed run
//    leaves no stale lock. The file itself stays (removing it would let two
//    runs lock two different files of the same name).
//  - Only servesim's: a folder that exists, holds anything, and has no
//    .servesim.lock was not written by servesim and is refused (the user's
//    own files could share an output's name), unless `force` says
//    otherwise; then only servesim's file names are touched, and
//    `forced()` lists those present. A folder that holds one of the
//    command's own inputs (a scenario, trace or measured run read from it)
//    is refused, force or not.
//  - Cleared: the outputs an earlier run left (every name servesim writes,
//    and their temporary names) are removed, so a rerun that turns an
//    output off leaves no stale file beside the new ones. Only regular
//    files and symbolic links are removed: anything else under an
//    output's name (a folder, a pipe) is an error. Other files are left
//    alone.
//  - Written whole: every file is written under a temporary name
//    (.NAME.partial) and renamed when complete, so a reader never sees a
//    half-written file under an output's name.
#ifndef SERVESIM_REPORTS_OUTPUT_DIR_H_
#define SERVESIM_REPORTS_OUTPUT_DIR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace servesim::reports {

class OutputDir {
 public:
  // The files a run writes (summary.json, run_info.json, requests.csv,
  // iterations.csv, timeline.json, report.html).
  static const std::vector<std::string>& RunOutputs();

  struct Options {
    // Files this command writes besides RunOutputs() (replay's comparison,
    // say); cleared with them.
    std::vector<std::string> also_clear;
    // Whether RunOutputs() are this command's (a sweep's folder holds none).
    bool run_outputs = true;
    // Files this command reads: a folder that holds one is refused.
    std::vector<std::string> inputs;
    // Take a non-empty folder without servesim's lock (--force).
    bool force = false;
  };

  // Makes `dir` ready as above. `holder` describes this process for a
  // second run's error ("servesim run x.pbtxt"). Errors: INVALID_ARGUMENT
  // for a path that is not a folder, a folder holding an input, or an
  // output's name taken by something that is not a file;
  // FAILED_PRECONDITION when another process holds the lock or the folder
  // is not servesim's; UNAVAILABLE when the folder cannot be created or
  // written.
  static absl::StatusOr<std::unique_ptr<OutputDir>> Acquire(const std::string& dir,
                                                            const std::string& holder,
                                                            const Options& options);
  static absl::StatusOr<std::unique_ptr<OutputDir>> Acquire(const std::string& dir,
                                                            const std::string& holder) {
    return Acquire(dir, holder, Options());
  }
  // Marks `dir` (created if missing) as servesim's without locking it: a
  // sweep's point folder, which its child run then acquires.
  static absl::Status MarkOwned(const std::string& dir);
  ~OutputDir();  // releases the lock
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& dir() const { return dir_; }
  // With Options::force on a folder servesim had not written: the
  // servesim file names it held (replaced or removed); empty otherwise.
  const std::vector<std::string>& forced() const { return forced_; }
  std::string Path(absl::string_view name) const;
  // Where a file streamed during the run is written until Commit renames it.
  std::string TempPath(absl::string_view name) const;
  absl::Status Commit(absl::string_view name) const;
  // Writes `name` whole: to TempPath(name), then renamed.
  absl::Status Write(absl::string_view name, absl::string_view text) const;

 private:
  OutputDir(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  std::string dir_;
  int lock_fd_ = -1;
  std::vector<std::string> forced_;
};

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_OUTPUT_DIR_H_
