#include "services/commands/points.h"

#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "services/commands/commands.h"
#include "services/commands/scenario_args.h"
#include "studies/processes.h"

namespace servesim::services {
namespace {

std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

absl::Status RunPoints(const std::vector<studies::PointSpec>& specs,
                       const std::vector<std::string>& dirs, int jobs, int* ran) {
  std::vector<std::vector<std::string>> args;
  std::vector<std::string> logs, names;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (studies::PointFinished(dirs[i], specs[i])) continue;
    RETURN_IF_ERROR(studies::PreparePoint(dirs[i], specs[i]));
    args.push_back(studies::RunArgs(specs[i], dirs[i]));
    logs.push_back(dirs[i] + "/run.log");
    names.push_back(dirs[i]);
  }
  *ran = static_cast<int>(args.size());
  if (args.empty()) return absl::OkStatus();
  size_t finished = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> status = studies::RunForked(
      // args: "run", then its arguments (studies::RunArgs).
      [](const std::vector<std::string>& a) { return RunCommand(Args(a.begin() + 1, a.end())); },
      args, logs, jobs,
      [&](size_t i, int st) {
        ++finished;
        std::cerr << absl::StrFormat(
            "[%d/%d] %s %s (%.1f s)\n", finished, args.size(), names[i],
            st == 0                    ? "done"
            : st == kExitNothingServed ? "done, served no request"
            : studies::StoppedBySignal() != 0 && st == 128 + studies::StoppedBySignal()
                ? absl::StrCat("stopped by ", st == 128 + SIGINT ? "SIGINT" : "SIGTERM")
                : absl::StrCat("FAILED, exit ", st),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      });
  if (const int sig = studies::StoppedBySignal(); sig != 0) {
    // Stopped: the points that ran to the end are kept, the ones the signal
    // reached wrote partial outputs (and run again on the next try).
    int done = 0, stopped = 0, not_started = 0;
    for (int st : status) {
      if (st == 0 || st == kExitNothingServed) {
        ++done;
      } else if (st == -1) {
        ++not_started;
      } else {
        ++stopped;
      }
    }
    return absl::CancelledError(absl::StrCat(
        "interrupted by ", sig == SIGINT ? "SIGINT" : "SIGTERM", ": ", done, " of ", args.size(),
        " runs finished, ", stopped, " stopped partway (partial outputs, marked so), ", not_started,
        " not started; the same command resumes"));
  }
  std::vector<std::string> failed;
  for (size_t i = 0; i < status.size(); ++i) {
    // A point that served nothing wrote its outputs (null latencies): a
    // result like any other for the table.
    if (status[i] != 0 && status[i] != kExitNothingServed) {
      failed.push_back(absl::StrCat(names[i], " (exit ", status[i], "; ", logs[i], ": ",
                                    LastLine(logs[i]), ")"));
    }
  }
  if (!failed.empty()) {
    return absl::InternalError(absl::StrCat(failed.size(), " of ", args.size(),
                                            " runs failed: ", absl::StrJoin(failed, "; ")));
  }
  return absl::OkStatus();
}

int FailPoints(const absl::Status& status) {
  if (absl::IsCancelled(status) && studies::StoppedBySignal() != 0) {
    std::cerr << "servesim: " << status.message() << "\n";
    return 128 + studies::StoppedBySignal();
  }
  return Fail(status);
}

void AddJobsFlag(FlagParser& flags, int* jobs) {
  flags.Value("-j", "", [jobs](const std::string& v) -> std::string {
    const int cores = studies::AvailableCores();
    if (!absl::SimpleAtoi(v, jobs) || *jobs < 1 || *jobs > cores) {
      return absl::StrCat("-j ", v, ": expected 1 to ", cores,
                          " (the cores available to this process)");
    }
    return "";
  });
  flags.Alias("--jobs", "-j");
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace servesim::services
