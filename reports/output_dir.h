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
//  - Cleared: the outputs an earlier run left (every name servesim writes,
//    and their temporary names) are removed, so a rerun that turns an
//    output off leaves no stale file beside the new ones. Other files are
//    left alone.
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

  // Makes `dir` ready as above. `holder` describes this process for a
  // second run's error ("servesim run x.pbtxt"); `also_clear` names more
  // files this command writes (replay's comparison, say). Errors:
  // INVALID_ARGUMENT for a path that is not a folder, FAILED_PRECONDITION
  // when another process holds the lock, UNAVAILABLE when the folder cannot
  // be created or written.
  static absl::StatusOr<std::unique_ptr<OutputDir>> Acquire(
      const std::string& dir, const std::string& holder,
      const std::vector<std::string>& also_clear = {});
  ~OutputDir();  // releases the lock
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& dir() const { return dir_; }
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
};

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_OUTPUT_DIR_H_
