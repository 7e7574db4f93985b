// servesim: the command-line front end. Dispatches to one subcommand
// (services/commands/); no model logic lives here.
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agents/logging.h"
#include "services/commands/commands.h"

int main(int argc, char** argv) {
  namespace svc = servesim::services;
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detection on: every lock of gRPC's mutexes updates a graph of
  // lock orders (2-4% of an agent's and its client's CPU). servesim's own
  // locking is std::mutex, which never had it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::vector<std::string> args(argv + 1, argv + argc);
  // --log-level (any command, anywhere): gRPC's and SimGrid's own lines.
  if (absl::Status st = servesim::agents::TakeLogLevelFlag(&args); !st.ok()) {
    return svc::UsageError(std::string(st.message()));
  }
  if (args.empty()) return svc::UsageError("no command given");
  const std::string& command = args[0];
  if (command == "help" || command == "--help" || command == "-h") {
    // `servesim help COMMAND`: that command's part.
    return svc::PrintUsage(command == "help" && args.size() > 1 ? args[1] : "");
  }
  if (command == "--version" || command == "version") {
    // The revision is the source tree's when the build was configured.
    std::cout << "servesim " << SERVESIM_VERSION << " (git " << SERVESIM_GIT_REVISION << ", "
              << (std::string(SERVESIM_BUILD_TYPE).empty() ? "default" : SERVESIM_BUILD_TYPE)
              << " build)\n";
    return 0;
  }
  static const std::map<std::string, int (*)(const svc::Args&)> kCommands = {
      {"run", svc::RunCommand},         {"validate", svc::ValidateCommand},
      {"presets", svc::PresetsCommand}, {"study", svc::StudyCommand},
      {"sweep", svc::SweepCommand},     {"merge", svc::MergeCommand},
      {"search", svc::SearchCommand},   {"plot", svc::PlotCommand},
      {"replay", svc::ReplayCommand},   {"calibrate", svc::CalibrateCommand},
  };
  const auto it = kCommands.find(command);
  if (it == kCommands.end()) return svc::UsageError(absl::StrCat("unknown command ", command));
  // `servesim COMMAND --help`: that command's part of the usage.
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") return svc::PrintUsage(command);
  }
  return it->second(svc::Args(args.begin() + 1, args.end()));
}
