// `servesim run`'s flags and body, shared with `servesim replay` (which
// writes a scenario for a measured run and runs it the same way).
#ifndef SERVESIM_SERVICES_COMMANDS_RUN_H_
#define SERVESIM_SERVICES_COMMANDS_RUN_H_

#include <string>
#include <vector>

#include "services/commands/scenario_args.h"

namespace servesim::services {

struct RunFlags {
  ScenarioArgs scenario;
  std::string out;
  bool quiet = false;
  std::string metrics;  // --metrics [HOST:]PORT
  std::string web_dir = SERVESIM_WEB_DIR;
  double pace = 0;
  double linger_s = 0;
  std::vector<std::string> simgrid;  // --cfg=..., --log=...
  // Fallbacks the caller took before the run (a replay's unrecorded
  // knobs): warned about and listed in run_info.json with the run's own.
  std::vector<std::string> fallbacks;
};

// Runs the scenario: prints the summary table (unless quiet), writes the
// outputs. Returns the exit status.
int RunWithFlags(const RunFlags& flags);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_RUN_H_
