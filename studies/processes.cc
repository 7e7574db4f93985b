#include "studies/processes.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
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

// SIGINT / SIGTERM while jobs run: the first signal's number (0: none).
volatile sig_atomic_t g_signal = 0;
// How many arrived.
volatile sig_atomic_t g_signals = 0;

extern "C" void OnSupervisorSignal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_signals = g_signals + 1;
}

// Installs OnSupervisorSignal for SIGINT and SIGTERM for the scope (without
// SA_RESTART, so a sleep or wait returns at once); restores the previous
// handlers.
class SupervisorSignals {
 public:
  SupervisorSignals() {
    g_signal = 0;
    g_signals = 0;
    struct sigaction sa = {};
    sa.sa_handler = OnSupervisorSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SupervisorSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SupervisorSignals(const SupervisorSignals&) = delete;
  SupervisorSignals& operator=(const SupervisorSignals&) = delete;

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

int g_stopped_by = 0;

// Runs the jobs `start` starts, at most `parallel` at once, and collects
// their exit statuses. A SIGINT or SIGTERM to this process is passed to
// every running job (each in its own process group, so a terminal's ^C
// reaches this process only); no job starts after it, and the running ones
// are waited for (they write their partial outputs). Jobs never started
// keep status -1.
std::vector<int> Supervise(size_t jobs, const Start& start, int parallel,
                           const std::function<void(size_t, int)>& on_done) {
  SupervisorSignals signals;
  g_stopped_by = 0;
  std::vector<int> status(jobs, -1);
  std::map<pid_t, size_t> running;
  size_t next = 0;
  sig_atomic_t forwarded = 0;  // signals passed on so far (a second one too)
  while ((next < jobs && g_signal == 0) || !running.empty()) {
    while (g_signal == 0 && static_cast<int>(running.size()) < std::max(1, parallel) &&
           next < jobs) {
      const pid_t pid = start(next);
      if (pid < 0) {
        status[next] = -1;
        if (on_done) on_done(next, -1);
      } else {
        running[pid] = next;
      }
      ++next;
    }
    if (g_signals > forwarded) {
      // The first stops each job cleanly; a second ends them at once.
      g_stopped_by = g_signal;
      for (const auto& [pid, job] : running) kill(pid, g_signal);
      forwarded = forwarded + 1;
    }
    if (running.empty()) continue;
    int st = 0;
    const pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) {
      // Nothing ended yet: a short sleep, which a signal cuts short.
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, nullptr);
      continue;
    }
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
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid > 0) setpgid(pid, pid);  // (the child does the same: whichever runs first)
    if (pid != 0) return pid;  // the parent (-1: fork failed)
    // The child: its own process group (a terminal's ^C goes to the
    // supervisor, which passes it on), the default signal dispositions
    // until the job installs its own, and SIGTERM when the supervisor dies.
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);  // it died before prctl
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

int StoppedBySignal() { return g_stopped_by; }

}  // namespace servesim::studies
