// Child processes for studies: SimGrid allows one engine per process, so
// every run of a sweep, search or study is a `servesim run` in a child.
#ifndef SERVESIM_STUDIES_PROCESSES_H_
#define SERVESIM_STUDIES_PROCESSES_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace servesim::studies {

// Runs each argument list as a job, at most `parallel` at once, each a
// fork of this process that calls `run(args)` and exits with its result,
// writing stdout+stderr to its log file: a new process per job (SimGrid
// allows one engine per process) that starts with the libraries loaded and
// initialised, which a new program would spend about 30 ms on. The caller
// must hold no threads, no SimGrid engine and no gRPC state (a child
// builds its own). Returns per-job exit statuses (0 = success; -1: could
// not start). Each job runs in its own process group and gets SIGTERM if
// this process dies. `on_done(job, status)` is called as each ends (in completion
// order).
std::vector<int> RunForked(const std::function<int(const std::vector<std::string>&)>& run,
                           const std::vector<std::vector<std::string>>& args,
                           const std::vector<std::string>& logs, int parallel,
                           const std::function<void(size_t, int)>& on_done);

// The signal (SIGINT, SIGTERM) that stopped the last RunForked, 0 if none:
// it was passed to every running job, no further job started (their
// statuses are -1), and the running ones were waited for. The caller
// reports and exits 128 + the signal.
int StoppedBySignal();

// Cores this process may use (sched affinity).
int AvailableCores();

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_PROCESSES_H_
