// Watching a run: progress off a terminal comes as lines, --linger keeps
// the dashboard up after the table and the files, --version says what was
// built.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/progress.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

constexpr char kExample[] = SERVESIM_SOURCE_DIR "/examples/gpt3_175b_dgx_azure_conv.pbtxt";

std::string Contents(std::FILE* f) {
  std::string out;
  std::rewind(f);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

TEST(ProgressTest, OffATerminalALineEveryInterval) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  services::ProgressBar lines(f, 100, 3600, /*every_s=*/10);
  lines.OnFinish(0, 0);
  lines.OnClock(100, 5);      // before the first interval: nothing
  lines.OnClock(1000, 10);    // the first line
  lines.OnClock(1100, 15);    // within the interval: nothing
  lines.OnClock(2000, 20.5);  // the second
  lines.OnDone(3600, 30);     // nothing to clear
  const std::vector<std::string> got = test_util::Lines(Contents(f));
  ASSERT_EQ(got.size(), 2u) << Contents(f);
  EXPECT_EQ(got[0],
            "servesim: progress: 1000/3600 s simulated  1/100 requests  100x real time  ETA 26s");
  EXPECT_EQ(got[1],
            "servesim: progress: 2000/3600 s simulated  1/100 requests  98x real time  ETA 16s");
  std::fclose(f);
}

TEST(ProgressTest, AnUnattendedRunPrintsProgressLines) {
  // ~12 wall seconds (pace 250 over 3,000 simulated s), stderr a pipe:
  // --progress always gives a line at 10 s, even with --quiet.
  const std::string dir = test_util::FreshDir("progress");
  test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--out", dir, "--quiet", "--progress", "always",
                              "--pace", "250", "--set", "workload.window_end_s=3000"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "servesim: progress: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "s simulated  ")) << r.out;
  r = test_util::RunServesim({"run", kExample, "--out", dir, "--quiet", "--progress", "sometimes"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--progress sometimes: expected auto, always or never"))
      << r.out;
}

TEST(LingerTest, TheTableAndTheFilesComeBeforeTheLinger) {
  const std::string dir = test_util::FreshDir("linger");
  // --linger 60, ended by SIGINT once it has begun: the outputs are
  // complete by then, and the exit status is the run's.
  const test_util::CommandResult r = test_util::RunCommand(
      absl::StrCat("'", SERVESIM_BINARY, "' run '", kExample, "' --out '", dir,
                   "' --metrics 127.0.0.1:0 --linger 60 --set workload.window_end_s=60 > '", dir,
                   ".log' 2>&1 & pid=$!; n=0; while ! grep -q 'stays up' '", dir,
                   ".log' && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; test -e '", dir,
                   "/summary.json' && echo summary-before-linger; grep -c 'throughput' '", dir,
                   ".log'; kill -INT $pid; wait $pid; echo \"exit=$?\""));
  EXPECT_TRUE(absl::StrContains(r.out, "summary-before-linger")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\n1\n")) << r.out;  // the table was printed
  EXPECT_TRUE(absl::StrContains(r.out, "exit=0")) << r.out;
  const std::string log = test_util::ReadFile(dir + ".log");
  EXPECT_TRUE(
      absl::StrContains(log, "servesim: the dashboard stays up 60 s (--linger; ^C ends it)"))
      << log;
  EXPECT_FALSE(absl::StrContains(test_util::ReadFile(dir + "/summary.json"), "partial"));
}

TEST(VersionTest, VersionRevisionAndBuildType) {
  const test_util::CommandResult r = test_util::RunServesim({"--version"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StartsWith(r.out, "servesim 0.1.0 (git ")) << r.out;
  EXPECT_TRUE(absl::EndsWith(r.out, " build)\n")) << r.out;
}

}  // namespace
}  // namespace servesim
