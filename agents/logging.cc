#include "agents/logging.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace servesim::agents {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kQuiet)};

// gRPC's severities against servesim's levels.
LogLevel LevelOf(gpr_log_severity s) {
  switch (s) {
    case GPR_LOG_SEVERITY_ERROR:
      return LogLevel::kError;
    case GPR_LOG_SEVERITY_INFO:
      return LogLevel::kInfo;
    default:
      return LogLevel::kDebug;
  }
}

void GrpcLog(gpr_log_func_args* args) {
  if (args == nullptr) return;
  const LogLevel at = LevelOf(args->severity);
  if (static_cast<int>(at) > g_level.load(std::memory_order_relaxed)) return;
  const char letter = at == LogLevel::kError ? 'E' : at == LogLevel::kInfo ? 'I' : 'D';
  std::fprintf(stderr, "servesim: grpc %c %s:%d: %s\n", letter,
               args->file != nullptr ? args->file : "?", args->line,
               args->message != nullptr ? args->message : "");
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  if (name == "quiet") return LogLevel::kQuiet;
  if (name == "error") return LogLevel::kError;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level ", name, ": expected quiet, error, warning, info or debug"));
}

void SetThirdPartyLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
  gpr_set_log_function(GrpcLog);
  // gRPC skips formatting lines below this severity.
  gpr_set_log_verbosity(level >= LogLevel::kDebug  ? GPR_LOG_SEVERITY_DEBUG
                        : level >= LogLevel::kInfo ? GPR_LOG_SEVERITY_INFO
                                                   : GPR_LOG_SEVERITY_ERROR);
}

LogLevel ThirdPartyLogLevel() { return static_cast<LogLevel>(g_level.load()); }

std::string SimGridLogArg(LogLevel level) {
  const char* thres = level == LogLevel::kQuiet     ? "critical"
                      : level == LogLevel::kError   ? "error"
                      : level == LogLevel::kWarning ? "warning"
                      : level == LogLevel::kInfo    ? "info"
                                                    : "debug";
  return absl::StrCat("--log=root.thres:", thres);
}

absl::Status TakeLogLevelFlag(std::vector<std::string>* args) {
  LogLevel level = LogLevel::kQuiet;
  std::vector<std::string> kept;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    std::string value;
    if (a == "--log-level") {
      if (i + 1 >= args->size()) {
        return absl::InvalidArgumentError(
            "--log-level needs a level: quiet, error, warning, info or debug");
      }
      value = (*args)[++i];
    } else if (absl::StartsWith(a, "--log-level=")) {
      value = a.substr(12);
    } else {
      kept.push_back(a);
      continue;
    }
    auto parsed = ParseLogLevel(value);
    if (!parsed.ok()) return parsed.status();
    level = *parsed;
  }
  *args = std::move(kept);
  SetThirdPartyLogLevel(level);
  return absl::OkStatus();
}

}  // namespace servesim::agents
