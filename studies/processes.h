// Child processes for studies: SimGrid allows one engine per process, so
// every run of a sweep, search or study is a `servesim run` child.
#ifndef SERVESIM_STUDIES_PROCESSES_H_
#define SERVESIM_STUDIES_PROCESSES_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace servesim::studies {

// Runs `binary` with each argument list, at most `parallel` at once, each
// writing stdout+stderr to its log file. Returns per-job exit statuses
// (0 = success; -1: could not start). `on_done(job, status)` is called as
// each ends (in completion order).
std::vector<int> RunProcesses(const std::string& binary,
                              const std::vector<std::vector<std::string>>& args,
                              const std::vector<std::string>& logs, int parallel,
                              const std::function<void(size_t, int)>& on_done);

// Cores this process may use (sched affinity).
int AvailableCores();

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_PROCESSES_H_
