// SIGINT and SIGTERM during `servesim run`: the first asks the run to stop
// (the simulation sees the flag at its next step, then the partial outputs
// are written, flagged partial); a second ends the process at once, and
// says what it left: with an output folder whose summary.json is not yet
// written, every output already under its final name is renamed back to
// its temporary one (.NAME.partial), so that no final-named file is left
// without the summary that says whether the run was whole.
#ifndef SERVESIM_SERVICES_COMMANDS_STOP_SIGNALS_H_
#define SERVESIM_SERVICES_COMMANDS_STOP_SIGNALS_H_

#include <signal.h>

#include <atomic>

#include "reports/output_dir.h"

namespace servesim::services {

// The first signal's number while StopSignals is in scope; 0: none.
extern std::atomic<int> g_stop_signal;

// Installs the handlers for the scope; restores the previous ones.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The folder a second signal reports on (and renames back in); null:
  // none. Its paths are prepared here, outside the handler.
  void Watch(const reports::OutputDir* dir);

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

const char* SignalName(int sig);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_STOP_SIGNALS_H_
