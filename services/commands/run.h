// `servesim run`'s flags and body, shared with `servesim replay` (which
// writes a scenario for a measured run and runs it the same way).
#ifndef SERVESIM_SERVICES_COMMANDS_RUN_H_
#define SERVESIM_SERVICES_COMMANDS_RUN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reports/output_dir.h"
#include "services/commands/scenario_args.h"

namespace servesim::services {

struct RunFlags {
  ScenarioArgs scenario;
  std::string out;
  bool force = false;  // --force: take a folder servesim did not write
  bool quiet = false;
  std::string progress = "auto";  // --progress auto|always|never
  std::string metrics;  // --metrics [HOST:]PORT
  std::string metrics_token_file;  // --metrics-token-file: /metrics wants its token
  std::string web_dir = SERVESIM_WEB_DIR;
  double pace = 0;
  double linger_s = 0;
  std::vector<std::string> simgrid;  // --cfg=..., --log=...
  // Fallbacks the caller took before the run (a replay's unrecorded
  // knobs): warned about and listed in run_info.json with the run's own.
  std::vector<std::string> fallbacks;
  // Any fallback (the caller's or the scenario's own) is an error before
  // the run starts (`servesim replay --strict`).
  bool strict = false;
  // The output folder, already acquired by the caller (replay writes its
  // workload there first); null: RunWithFlags acquires `out` itself once
  // the scenario has loaded, before the simulation starts.
  const reports::OutputDir* output_dir = nullptr;
};

// Acquires `out` (reports/output_dir.h) with --force as given, and says on
// stderr which of servesim's file names a forced folder held.
absl::StatusOr<std::unique_ptr<reports::OutputDir>> AcquireOutputs(
    const std::string& out, const std::string& holder, bool force,
    reports::OutputDir::Options options);

// Runs the scenario: prints the summary table (unless quiet), writes the
// outputs. SIGINT and SIGTERM stop the run cleanly: complete rows, partial
// outputs flagged, one line on stderr, exit 130 / 143. Returns the exit
// status (services/commands/flags.h).
int RunWithFlags(const RunFlags& flags);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_RUN_H_
