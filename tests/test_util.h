// Helpers the end-to-end tests share: running commands (the real servesim
// binary among them), reading and writing files, a fresh folder per test.
#ifndef SERVESIM_TESTS_TEST_UTIL_H_
#define SERVESIM_TESTS_TEST_UTIL_H_

#include <string>
#include <vector>

namespace servesim::test_util {

// Whether this binary runs under AddressSanitizer (scripts/test_sanitized.sh),
// where code runs several times slower: timing bounds scale with it.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

struct CommandResult {
  int code = -1;    // exit status; -1 if it did not exit normally
  std::string out;  // stdout and stderr together
};

// `cmd` through the shell, stderr folded into stdout.
CommandResult RunCommand(const std::string& cmd);
// SERVESIM_BINARY with `args`, each shell-quoted.
CommandResult RunServesim(const std::vector<std::string>& args);

// The whole file; an empty string (and a test failure) if it cannot be read.
std::string ReadFile(const std::string& path);
// Writes `text` to `path`; a test failure if it cannot.
void WriteFile(const std::string& path, const std::string& text);
// A fresh, empty folder under the test temp dir, named after `prefix`, the
// running test and the process.
std::string FreshDir(const std::string& prefix);
// The non-empty lines of `text`.
std::vector<std::string> Lines(const std::string& text);

}  // namespace servesim::test_util

#endif  // SERVESIM_TESTS_TEST_UTIL_H_
