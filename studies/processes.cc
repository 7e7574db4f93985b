#include "studies/processes.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>

namespace servesim::studies {

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

namespace {

// Starts job i (returns its pid, or -1 if it could not start).
using Start = std::function<pid_t(size_t)>;

// Runs the jobs `start` starts, at most `parallel` at once, and collects
// their exit statuses.
std::vector<int> Supervise(size_t jobs, const Start& start, int parallel,
                           const std::function<void(size_t, int)>& on_done) {
  std::vector<int> status(jobs, -1);
  std::map<pid_t, size_t> running;
  size_t next = 0;
  while (next < jobs || !running.empty()) {
    while (static_cast<int>(running.size()) < std::max(1, parallel) && next < jobs) {
      const pid_t pid = start(next);
      if (pid < 0) {
        status[next] = -1;
        if (on_done) on_done(next, -1);
      } else {
        running[pid] = next;
      }
      ++next;
    }
    if (running.empty()) continue;
    int st = 0;
    const pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    status[it->second] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (on_done) on_done(it->second, status[it->second]);
    running.erase(it);
  }
  return status;
}

}  // namespace

std::vector<int> RunForked(const std::function<int(const std::vector<std::string>&)>& run,
                           const std::vector<std::vector<std::string>>& args,
                           const std::vector<std::string>& logs, int parallel,
                           const std::function<void(size_t, int)>& on_done) {
  auto start = [&](size_t i) -> pid_t {
    // Nothing buffered may be written twice, by the parent and the child.
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid != 0) return pid;  // the parent (-1: fork failed)
    // The child: stdout and stderr to the job's log, stdin from /dev/null;
    // then the job, and its exit status.
    const int log = open(logs[i].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = open("/dev/null", O_RDONLY);
    if (log < 0 || null < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0 || dup2(null, 0) < 0) {
      _exit(127);
    }
    close(log);
    close(null);
    const int rc = run(args[i]);
    std::cout.flush();
    std::cerr.flush();
    std::exit(rc);
  };
  return Supervise(args.size(), start, parallel, on_done);
}

}  // namespace servesim::studies
