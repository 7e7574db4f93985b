// Running a study's points (sweep points, search probes) as child
// `servesim run` processes, each in its own folder (studies/sweep.h).
#ifndef SERVESIM_SERVICES_COMMANDS_POINTS_H_
#define SERVESIM_SERVICES_COMMANDS_POINTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/commands/flags.h"
#include "studies/sweep.h"

namespace servesim::services {

// Runs the points not already finished in their folders, `jobs` at once,
// with a progress line per finished run on stderr; `ran` is how many ran.
// Errors list every failed point with the last line of its log; CANCELLED
// when SIGINT or SIGTERM stopped them (studies::StoppedBySignal), saying
// what finished, what stopped partway and what never started.
absl::Status RunPoints(const std::vector<studies::PointSpec>& specs,
                       const std::vector<std::string>& dirs, int jobs, int* ran);

// Fail(status), except after a signal stopped the points: the message and
// 128 + the signal (130, 143), a run's own convention.
int FailPoints(const absl::Status& status);

// -j N / --jobs N / -jN: child runs at once, 1 to the cores available.
void AddJobsFlag(FlagParser& flags, int* jobs);

// Writes `text` to `path`; UNAVAILABLE naming the file when it cannot.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_POINTS_H_
