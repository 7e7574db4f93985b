// Third-party log lines (gRPC's, SimGrid's) go through servesim's own, at a
// level the user picks with --log-level (both binaries). By default they are
// quiet: servesim reports every failure itself, with the file, field or
// endpoint concerned, so gRPC's "E1125 ..." lines and SimGrid's INFO lines
// would only repeat it in another form.
//
//   quiet    (default) none
//   error    errors
//   warning  errors and warnings (gRPC has no warning level: its errors)
//   info     and informational lines (SimGrid's configuration changes)
//   debug    everything either library logs
//
// gRPC lines are printed as "servesim: grpc <E|I|D> <file>:<line>: <message>"
// on stderr; SimGrid's keep its own format, filtered by its threshold.
#ifndef SERVESIM_AGENTS_LOGGING_H_
#define SERVESIM_AGENTS_LOGGING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace servesim::agents {

enum class LogLevel { kQuiet = 0, kError, kWarning, kInfo, kDebug };

// "quiet", "error", "warning", "info", "debug"; INVALID_ARGUMENT naming
// them otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

// Sets the level and routes gRPC's log through servesim's. Call once, early.
void SetThirdPartyLogLevel(LogLevel level);
LogLevel ThirdPartyLogLevel();

// The SimGrid argument that sets its threshold for `level`
// ("--log=root.thres:critical" when quiet).
std::string SimGridLogArg(LogLevel level);

// Removes `--log-level LEVEL` / `--log-level=LEVEL` from `args` (anywhere)
// and applies it; the default when absent. An error for a bad level or a
// missing value.
absl::Status TakeLogLevelFlag(std::vector<std::string>* args);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_LOGGING_H_
