#include "tests/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "studies/sweep.h"
#include "gtest/gtest.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif

namespace servesim::test_util {

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CommandResult RunServesim(const std::vector<std::string>& args) {
  std::string cmd = studies::ShellQuote(SERVESIM_BINARY);
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", studies::ShellQuote(a));
  return RunCommand(cmd);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

std::string FreshDir(const std::string& prefix) {
  namespace fs = std::filesystem;
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(testing::TempDir()) /
                       absl::StrCat("servesim_", prefix, "_", info->test_suite_name(), "_",
                                    info->name(), "_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

}  // namespace servesim::test_util
