#include "studies/processes.h"

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>

extern char** environ;

namespace servesim::studies {

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::vector<int> RunProcesses(const std::string& binary,
                              const std::vector<std::vector<std::string>>& args,
                              const std::vector<std::string>& logs, int parallel,
                              const std::function<void(size_t, int)>& on_done) {
  std::vector<int> status(args.size(), -1);
  std::map<pid_t, size_t> running;
  size_t next = 0;
  while (next < args.size() || !running.empty()) {
    while (static_cast<int>(running.size()) < std::max(1, parallel) && next < args.size()) {
      std::vector<std::string> full = {binary};
      full.insert(full.end(), args[next].begin(), args[next].end());
      std::vector<char*> argv;
      for (std::string& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, 1, logs[next].c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
      pid_t pid = 0;
      const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      if (rc != 0) {
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

}  // namespace servesim::studies
