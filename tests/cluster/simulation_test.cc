// The simulation over a long run: what the metrics collector holds at once
// is set by the load, not by the run's length.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "scenario/scenario.h"
#include "cluster/simulation.h"
#include "workload/workload.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/test_util.h"

namespace servesim::cluster {
namespace {

using metrics::MetricsCollector;
using scenario::ApplyOverride;
using scenario::LoadScenarioFile;
using scenario::Normalize;
using scenario::Resolve;
using workload::OpenWorkload;

// A long run in a child process (SimGrid allows one engine per process):
// the golden 5-minute Azure scenario replayed 12 times. The collector's
// live requests and buffered iterations stay near what one pass needs.
struct RunStats {
  int64_t requests = 0, iterations = 0, max_live = 0, max_buffered = 0, live_at_end = -1,
          buffered_at_end = -1;
};

RunStats RunInChild(int64_t repeat) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    RunStats stats;
    auto loaded = LoadScenarioFile(SERVESIM_SOURCE_DIR
                                   "/tests/testdata/golden_llama2_13b_azure_5min.pbtxt");
    if (loaded.ok() && ApplyOverride(&*loaded, absl::StrCat("workload.repeat=", repeat)).ok() &&
        Normalize(&*loaded).ok()) {
      auto sc = Resolve(*loaded);
      if (sc.ok()) {
        auto stream = OpenWorkload(sc->proto.workload(), sc->base_dir, "", sc->seed);
        if (stream.ok()) {
          auto result = RunSimulation(*sc, **stream, RunOptions{});
          if (result.ok()) {
            const MetricsCollector& m = *result->metrics;
            stats = {m.request_totals().requests, m.iteration_totals().iterations,
                     m.max_live_requests(), m.max_buffered_iterations(), m.live_requests(),
                     m.buffered_iterations()};
          }
        }
      }
    }
    const std::string line =
        absl::StrCat(stats.requests, " ", stats.iterations, " ", stats.max_live, " ",
                     stats.max_buffered, " ", stats.live_at_end, " ", stats.buffered_at_end);
    (void)!write(fds[1], line.data(), line.size());
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  RunStats s;
  const std::vector<std::string> f = absl::StrSplit(text, ' ');
  EXPECT_EQ(f.size(), 6u) << text;
  if (f.size() == 6) {
    EXPECT_TRUE(absl::SimpleAtoi(f[0], &s.requests) && absl::SimpleAtoi(f[1], &s.iterations) &&
                absl::SimpleAtoi(f[2], &s.max_live) && absl::SimpleAtoi(f[3], &s.max_buffered) &&
                absl::SimpleAtoi(f[4], &s.live_at_end) &&
                absl::SimpleAtoi(f[5], &s.buffered_at_end));
  }
  return s;
}

TEST(MetricsCollectorTest, LongRepeatedRunStaysBounded) {
  const RunStats one = RunInChild(1);
  const RunStats twelve = RunInChild(12);
  std::cout << "1 pass: " << one.requests << " requests, " << one.iterations
            << " iterations, at most " << one.max_live << " live requests and "
            << one.max_buffered << " buffered iterations; 12 passes: " << twelve.requests
            << ", " << twelve.iterations << ", " << twelve.max_live << ", "
            << twelve.max_buffered << "\n";
  ASSERT_GT(one.requests, 1000);
  EXPECT_EQ(twelve.requests, 12 * one.requests);
  EXPECT_GT(twelve.iterations, 11 * one.iterations);
  EXPECT_EQ(twelve.live_at_end, 0);
  EXPECT_EQ(twelve.buffered_at_end, 0);
  // What is held at once is set by the load, not the run's length: a few
  // dozen requests in flight, a handful of iterations of run-ahead.
  EXPECT_LE(twelve.max_live, 2 * one.max_live);
  EXPECT_LT(twelve.max_live, one.requests / 4);
  EXPECT_LE(twelve.max_buffered, 2 * one.max_buffered + 8);
  EXPECT_LT(twelve.max_buffered, 1000);
}

// --------------------------------------------------------------- CLI ----


}  // namespace
}  // namespace servesim::cluster
