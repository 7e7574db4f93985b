#include "services/commands/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace servesim::services {
namespace {

// What the handler needs, prepared before it can run: only
// async-signal-safe calls (access, rename, write, raise) are made there.
struct LeftBehind {
  static constexpr int kNames = 8;
  static constexpr size_t kPath = 4096;
  volatile sig_atomic_t armed = 0;
  char summary[kPath] = {};
  char finals[kNames][kPath] = {};
  char temps[kNames][kPath] = {};
  int names = 0;
  char complete[kPath + 128] = {};
  char incomplete[kPath + 256] = {};
};
LeftBehind g_left;

void Say(const char* text) {
  const size_t n = std::strlen(text);
  ssize_t unused = ::write(STDERR_FILENO, text, n);
  (void)unused;
}

extern "C" void OnStopSignal(int sig) {
  if (g_stop_signal.exchange(sig) == 0) return;
  // The second: at once.
  if (g_left.armed == 0) {
    Say("servesim: second signal: stopped at once; no output folder\n");
  } else if (::access(g_left.summary, F_OK) == 0) {
    Say(g_left.complete);
  } else {
    for (int i = 0; i < g_left.names; ++i) ::rename(g_left.finals[i], g_left.temps[i]);
    Say(g_left.incomplete);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void Copy(const std::string& from, char* to, size_t size) {
  std::snprintf(to, size, "%s", from.c_str());
}

}  // namespace

std::atomic<int> g_stop_signal{0};

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  g_left.armed = 0;
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  g_left.armed = 0;
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

void StopSignals::Watch(const reports::OutputDir* dir) {
  g_left.armed = 0;
  if (dir == nullptr || dir->Path("summary.json").size() >= LeftBehind::kPath) return;
  Copy(dir->Path("summary.json"), g_left.summary, sizeof g_left.summary);
  g_left.names = 0;
  for (const std::string& name : reports::OutputDir::RunOutputs()) {
    if (name == "summary.json" || g_left.names == LeftBehind::kNames) continue;
    Copy(dir->Path(name), g_left.finals[g_left.names], LeftBehind::kPath);
    Copy(dir->TempPath(name), g_left.temps[g_left.names], LeftBehind::kPath);
    ++g_left.names;
  }
  Copy(absl::StrCat("servesim: second signal: stopped at once; ", dir->dir(),
                    "/ was already complete\n"),
       g_left.complete, sizeof g_left.complete);
  Copy(absl::StrCat("servesim: second signal: stopped at once; ", dir->dir(),
                    "/ is incomplete: no summary.json, and what was written is kept under "
                    ".NAME.partial names\n"),
       g_left.incomplete, sizeof g_left.incomplete);
  g_left.armed = 1;
}

const char* SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace servesim::services
