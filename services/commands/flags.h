// The command-line parser every servesim subcommand shares: each command
// declares its own flags and positional arguments, and a flag it does not
// declare is an error ("unknown option").
//
// Syntax: `--name value` or `--name=value`; switches take no value; `-h`
// or `--help` anywhere asks for the usage text. Exit codes (README "Using
// it"): 0 success, 1 bad input or a failed run, 2 a bad command line, 3 a
// run that served no request, 130 / 143 a run stopped by SIGINT / SIGTERM
// (its partial outputs written).
#ifndef SERVESIM_SERVICES_COMMANDS_FLAGS_H_
#define SERVESIM_SERVICES_COMMANDS_FLAGS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace servesim::services {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNothingServed = 3;

// Prints "servesim: MSG" and the pointer to --help on stderr; returns 2.
int UsageError(const std::string& msg);
// Prints "servesim: error: MSG" on stderr; returns 1.
int Fail(const absl::Status& status);

class FlagParser {
 public:
  // Checks and stores a value; returns "" when it is accepted, else the
  // message of the usage error.
  using Handler = std::function<std::string(const std::string& value)>;

  // A flag with a value. `missing` is the message when the value is absent
  // (the last argument); empty: the handler is called with "".
  void Value(const std::string& name, const std::string& missing, Handler handler);
  // The same under a second name (e.g. -j and --jobs).
  void Alias(const std::string& alias, const std::string& name);
  // A flag whose value must be attached (`--cfg=NAME:VALUE`).
  void Inline(const std::string& name, const std::string& missing, Handler handler);
  // A flag without a value.
  void Switch(const std::string& name, std::function<void()> on);
  // Convenience forms.
  void String(const std::string& name, std::string* out, const std::string& missing);
  void Repeated(const std::string& name, std::vector<std::string>* out, const std::string& missing);
  // Positional arguments, in order; the handler returns "" or the error.
  void Positional(Handler handler) { positional_ = std::move(handler); }

  enum class Result { kOk, kHelp, kError };
  // Parses `args` (after the command word). On kError the usage error is
  // printed and exit_code() is 2.
  Result Parse(const std::vector<std::string>& args);

 private:
  struct Spec {
    std::string missing;
    Handler handler;
    bool takes_value = true;
    bool inline_only = false;
    std::function<void()> on;
  };
  std::map<std::string, Spec> flags_;
  std::map<std::string, std::string> aliases_;
  Handler positional_;
};

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_FLAGS_H_
