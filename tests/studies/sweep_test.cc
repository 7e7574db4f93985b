// Studies: `servesim sweep`, `merge` and `search`, through the real binary
// (SERVESIM_BINARY) on small scenarios (each run is a fraction of a second),
// plus the search driver on synthetic predicates.
#include "studies/sweep.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "studies/processes.h"
#include "studies/search.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif

namespace servesim::studies {
namespace {

namespace fs = std::filesystem;

using Result = test_util::CommandResult;
using test_util::Lines;
Result Sh(const std::string& cmd) { return test_util::RunCommand(cmd); }
Result Servesim(const std::vector<std::string>& args) { return test_util::RunServesim(args); }
std::string Read(const std::string& path) { return test_util::ReadFile(path); }
void Write(const std::string& path, const std::string& text) { test_util::WriteFile(path, text); }
std::string FreshDir() { return test_util::FreshDir("sweep"); }

TEST(RunForkedTest, EachJobIsAForkWithItsOwnLogAndExitStatus) {
  const std::string dir = FreshDir();
  // Written before the forks and still unflushed in a buffered stream:
  // a child must not write it again.
  std::ofstream parent_out(dir + "/parent.txt");
  parent_out << "parent line\n";
  std::vector<std::vector<std::string>> args = {{"a", "0"}, {"b", "3"}, {"c", "7"}};
  std::vector<std::string> logs = {dir + "/a.log", dir + "/b.log", dir + "/c.log"};
  std::vector<size_t> done;
  int parent_counter = 5;
  const std::vector<int> status = RunForked(
      [&](const std::vector<std::string>& a) {
        ++parent_counter;  // the child's copy: the parent's stays 5
        std::cout << "job " << a[0] << " counter " << parent_counter << "\n";
        std::cerr << "to stderr\n";
        int rc = 0;
        EXPECT_TRUE(absl::SimpleAtoi(a[1], &rc));
        return rc;
      },
      args, logs, 2, [&](size_t i, int) { done.push_back(i); });
  EXPECT_EQ(status, (std::vector<int>{0, 3, 7}));
  EXPECT_EQ(done.size(), 3u);
  EXPECT_EQ(parent_counter, 5);
  EXPECT_EQ(Read(dir + "/a.log"), "job a counter 6\nto stderr\n");
  EXPECT_EQ(Read(dir + "/c.log"), "job c counter 6\nto stderr\n");
  parent_out.close();
  EXPECT_EQ(Read(dir + "/parent.txt"), "parent line\n");
}

// LLaMA-2 7B on single-A100 replicas, 60 Poisson requests: about 30 ms a run.
constexpr char kPoisson[] = R"(name: "sweep test"
model { preset: "llama2-7b" }
cluster { replicas: 1 xpu { preset: "a100-80gb" } }
workload {
  poisson { rate_rps: 4 }
  num_requests: 60
  lengths { fixed { input_tokens: 256 output_tokens: 16 } }
}
slo { ttft_s: 1.0 tpot_s: 0.1 }
seed: 3
)";

const std::vector<std::string> kVary = {"--vary", "workload.poisson.rate_rps=2,8",
                                        "--vary", "cluster.replicas=1,2,3"};

std::vector<std::string> SweepArgs(const std::string& scenario, const std::string& out,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"sweep", scenario, "--out", out, "--quiet"};
  a.insert(a.end(), kVary.begin(), kVary.end());
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(SweepTest, CrossProductRowsAndColumns) {
  const std::string dir = FreshDir();
  Write(dir + "/s.pbtxt", kPoisson);
  const Result r = Servesim({"sweep", dir + "/s.pbtxt", "--out", dir + "/sw", "--vary",
                             "workload.poisson.rate_rps=2,8", "--vary", "cluster.replicas=1,2,3"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> rows = Lines(Read(dir + "/sw/sweep.csv"));
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[0],
            "point,workload.poisson.rate_rps,cluster.replicas,requests,completed,rejected,"
            "throughput_tokens_per_s,ttft_p50_s,ttft_p99_s,tbt_p50_s,tbt_p99_s,tpot_p99_s,"
            "e2e_p99_s,slo_attainment,goodput_requests_per_s,energy_per_token_j,batch_size_mean");
  // The last --vary changes fastest.
  const std::vector<std::string> expect = {"0_rate_rps-2_replicas-1,2,1,60,60,0,",
                                           "1_rate_rps-2_replicas-2,2,2,60,60,0,",
                                           "2_rate_rps-2_replicas-3,2,3,60,60,0,",
                                           "3_rate_rps-8_replicas-1,8,1,60,60,0,",
                                           "4_rate_rps-8_replicas-2,8,2,60,60,0,",
                                           "5_rate_rps-8_replicas-3,8,3,60,60,0,"};
  for (size_t i = 0; i < expect.size(); ++i) {
    EXPECT_TRUE(absl::StartsWith(rows[i + 1], expect[i])) << rows[i + 1];
  }
  // The printed table has the same rows; a point equals a direct run.
  EXPECT_TRUE(absl::StrContains(r.out, "4_rate_rps-8_replicas-2")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "6 points (6 run, 0 already finished)")) << r.out;
  const Result direct = Servesim({"run", dir + "/s.pbtxt", "--quiet", "--out", dir + "/direct",
                                  "--set", "workload.poisson.rate_rps=8", "--set",
                                  "cluster.replicas=2"});
  ASSERT_EQ(direct.code, 0) << direct.out;
  EXPECT_EQ(Read(dir + "/direct/summary.json"),
            Read(dir + "/sw/points/4_rate_rps-8_replicas-2/summary.json"));
  // Different points differ (the columns are the points' own figures).
  EXPECT_NE(rows[1].substr(rows[1].find(",60,60,0,")), rows[4].substr(rows[4].find(",60,60,0,")));
}

TEST(SweepTest, ResultsDoNotDependOnJobs) {
  if (AvailableCores() < 2) GTEST_SKIP() << "one core: -j2 is refused";
  const std::string dir = FreshDir();
  Write(dir + "/s.pbtxt", kPoisson);
  const Result a = Servesim(SweepArgs(dir + "/s.pbtxt", dir + "/j1", {"-j", "1"}));
  const Result b = Servesim(SweepArgs(dir + "/s.pbtxt", dir + "/j2", {"-j2"}));
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string csv = Read(dir + "/j1/sweep.csv");
  EXPECT_EQ(Lines(csv).size(), 7u);
  EXPECT_EQ(csv, Read(dir + "/j2/sweep.csv"));
}

TEST(SweepTest, JobsBeyondTheCoresIsRefused) {
  const std::string dir = FreshDir();
  Write(dir + "/s.pbtxt", kPoisson);
  const Result r =
      Servesim(SweepArgs(dir + "/s.pbtxt", dir + "/x", {"-j", absl::StrCat(AvailableCores() + 1)}));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("expected 1 to ", AvailableCores()))) << r.out;
  const Result z = Servesim(SweepArgs(dir + "/s.pbtxt", dir + "/x", {"-j", "0"}));
  EXPECT_EQ(z.code, 2) << z.out;
}

TEST(SweepTest, ResumeSkipsFinishedPointsAndRerunsChangedOnes) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  Write(scenario, kPoisson);
  const std::string out = dir + "/sw";
  ASSERT_EQ(Servesim(SweepArgs(scenario, out)).code, 0);
  const std::string csv = Read(out + "/sweep.csv");
  const std::string p0 = out + "/points/0_rate_rps-2_replicas-1";
  const std::string p4 = out + "/points/4_rate_rps-8_replicas-2";
  const auto t0 = fs::last_write_time(p0 + "/summary.json");
  // Everything finished: nothing runs, same table.
  Result r = Servesim(SweepArgs(scenario, out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "6 points (0 run, 6 already finished)")) << r.out;
  EXPECT_EQ(fs::last_write_time(p0 + "/summary.json"), t0);
  EXPECT_EQ(Read(out + "/sweep.csv"), csv);
  // An interrupted point (truncated summary.json) and a missing one rerun.
  const std::string s4 = Read(p4 + "/summary.json");
  Write(p4 + "/summary.json", s4.substr(0, s4.size() / 2));
  fs::remove(out + "/points/5_rate_rps-8_replicas-3/summary.json");
  r = Servesim(SweepArgs(scenario, out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "6 points (2 run, 4 already finished)")) << r.out;
  EXPECT_EQ(Read(p4 + "/summary.json"), s4);
  EXPECT_EQ(Read(out + "/sweep.csv"), csv);
  // Changed overrides rerun every point (and change results).
  r = Servesim(SweepArgs(scenario, out, {"--set", "seed=4"}));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "6 points (6 run, 0 already finished)")) << r.out;
  EXPECT_NE(Read(out + "/sweep.csv"), csv);
  EXPECT_TRUE(absl::StrContains(Read(p0 + "/point.json"), "\"seed=4\"")) << Read(p0 + "/point.json");
  // So does a changed scenario text.
  Write(scenario, absl::StrCat(kPoisson, "# edited\n"));
  r = Servesim(SweepArgs(scenario, out, {"--set", "seed=4"}));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "6 points (6 run, 0 already finished)")) << r.out;
}

TEST(SweepTest, EmitJobsRunBySh_ThenMergeEqualsSweep) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  Write(scenario, kPoisson);
  ASSERT_EQ(Servesim(SweepArgs(scenario, dir + "/direct")).code, 0);
  const std::string jobs = dir + "/jobs.txt";
  Result r = Servesim(SweepArgs(scenario, dir + "/batch", {"--emit-jobs", jobs}));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> lines = Lines(Read(jobs));
  ASSERT_EQ(lines.size(), 6u);
  for (const std::string& l : lines) {
    EXPECT_TRUE(absl::StrContains(l, " run ")) << l;
    EXPECT_TRUE(absl::StrContains(l, "--out " + dir + "/batch/points/")) << l;
    EXPECT_TRUE(absl::StrContains(l, "--set cluster.replicas=")) << l;
  }
  EXPECT_FALSE(fs::exists(dir + "/batch/sweep.csv"));
  // Before the jobs ran, merge names the first unfinished point.
  r = Servesim({"merge", dir + "/batch"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "points/0_rate_rps-2_replicas-1: no summary.json")) << r.out;
  r = Sh("sh " + ShellQuote(jobs));
  ASSERT_EQ(r.code, 0) << r.out;
  r = Servesim({"merge", dir + "/batch"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Read(dir + "/batch/sweep.csv"), Read(dir + "/direct/sweep.csv"));
  // Points split over two folders (two machines) merge the same.
  fs::create_directories(dir + "/m2/points");
  fs::rename(dir + "/batch/points/5_rate_rps-8_replicas-3",
             dir + "/m2/points/5_rate_rps-8_replicas-3");
  fs::remove(dir + "/batch/points.txt");
  r = Servesim({"merge", dir + "/batch", dir + "/m2", "--out", dir + "/merged"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Read(dir + "/merged/sweep.csv"), Read(dir + "/direct/sweep.csv"));
  // A malformed summary.json is named.
  Write(dir + "/m2/points/5_rate_rps-8_replicas-3/summary.json", "{\n  \"requests\": 60\n");
  r = Servesim({"merge", dir + "/batch", dir + "/m2"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "5_rate_rps-8_replicas-3/summary.json: malformed")) << r.out;
}

TEST(SweepTest, BadVaryNamesTheFieldAndValueBeforeAnyRun) {
  const std::string dir = FreshDir();
  Write(dir + "/s.pbtxt", kPoisson);
  Result r = Servesim({"sweep", dir + "/s.pbtxt", "--out", dir + "/a", "--vary",
                       "cluster.replicaz=1,2"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--vary cluster.replicaz=1: ClusterSpec has no field")) << r.out;
  // The bad value is the last point: nothing ran.
  r = Servesim({"sweep", dir + "/s.pbtxt", "--out", dir + "/b", "--vary",
                "cluster.replicas=1,2,0"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "cluster.replicas = 0: allowed range [1, 4096]")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--vary cluster.replicas=0")) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/b/points"));
  r = Servesim({"sweep", dir + "/s.pbtxt", "--vary", "workload.poisson.rate_rps=2,,4"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "empty value in the list of workload.poisson.rate_rps"))
      << r.out;
  r = Servesim({"sweep", dir + "/s.pbtxt"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "sweep needs at least one --vary")) << r.out;
}

// ------------------------------------------------------------- search ----

// Identical requests (1,024-token prompt, one output token: a request is
// one prefill iteration) on one replica that runs one request per
// iteration (max_batch_size 1): a D/D/1 queue. One request alone measures
// the service time S (its iteration's duration) and the fixed delay d0
// before the iteration starts (routing), so TTFT alone = d0 + S.
// With constant arrivals every T = 1/rate < S, request k (from 0) waits
// k (S - T): TTFT_k = d0 + S + k (S - T), linear in k, so the p99 over N
// requests (linear interpolation at rank 0.99 (N - 1)) is
// d0 + S + 0.99 (N - 1) (S - T); for T >= S it is d0 + S. The largest rate
// with TTFT p99 <= L (L > d0 + S) is therefore
//   rate* = 1 / (S - (L - d0 - S) / (0.99 (N - 1))).
// (slo_attainment: at rate*, requests with k <= (L - d0 - S) / (S - T) =
// 0.99 (N - 1) meet the TTFT limit: 49 of 50 >= 0.9, so p99 binds.)
constexpr char kConstant[] = R"(name: "D/D/1"
model { preset: "llama2-7b" }
cluster { replicas: 1 xpu { preset: "a100-80gb" } }
workload {
  constant { rate_rps: 1 }
  num_requests: 50
  lengths { fixed { input_tokens: 1024 output_tokens: 1 } }
}
scheduler { max_batch_size: 1 routing: ROUTING_POLICY_ROUND_ROBIN }
seed: 1
)";

// S and d0 from a one-request run's iterations.csv.
void ServiceTime(const std::string& dir, const std::string& scenario, double* s, double* d0) {
  const Result r = Servesim({"run", scenario, "--quiet", "--out", dir + "/one", "--set",
                             "workload.num_requests=1"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> rows = Lines(Read(dir + "/one/iterations.csv"));
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_TRUE(absl::StartsWith(rows[0], "replica,start_s,duration_s,")) << rows[0];
  const std::vector<std::string> f = absl::StrSplit(rows[1], ',');
  ASSERT_TRUE(absl::SimpleAtod(f[1], d0));
  ASSERT_TRUE(absl::SimpleAtod(f[2], s));
  ASSERT_GT(*s, 0.01);
}

double AnswerOf(const std::string& csv) {
  for (const std::string& line : Lines(csv)) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() > 3 && f[1] == "answer") {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(f[2], &v)) << line;
      return v;
    }
  }
  ADD_FAILURE() << "no answer row in " << csv;
  return 0;
}

TEST(SearchTest, FindsTheHandComputedMaxRate) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/c.pbtxt";
  Write(scenario, kConstant);
  double s = 0, d0 = 0;
  ServiceTime(dir, scenario, &s, &d0);
  const double limit = d0 + s + 0.1;  // 100 ms of queueing allowed at p99
  const double expected = 1 / (s - (limit - d0 - s) / (0.99 * 49));
  const double tol = 0.005;
  const std::vector<std::string> args = {"search", scenario, "--vary-rate", "--slo",
                                         absl::StrCat("ttft_p99=", limit * 1e3, "ms"),
                                         "--tolerance", "0.005"};
  std::vector<std::string> a1 = args;
  a1.insert(a1.end(), {"--out", dir + "/j1", "-j", "1"});
  const Result r = Servesim(a1);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string csv = Read(dir + "/j1/search.csv");
  const double answer = AnswerOf(csv);
  // The answer passes, so it is at most rate*; bisection stops within the
  // tolerance of the first failing rate, which is above rate*.
  EXPECT_LE(answer, expected * (1 + 1e-6)) << csv;
  EXPECT_GE(answer, expected / (1 + tol) * (1 - 1e-6)) << csv;
  EXPECT_TRUE(absl::StrContains(r.out, "answer: max workload.constant.rate_rps = ")) << r.out;
  EXPECT_TRUE(absl::StrContains(csv, ",bracket,1,pass,")) << csv;  // from the scenario's rate
  EXPECT_TRUE(absl::StrContains(csv, ",bisect,")) << csv;
  // Speculative parallel probes leave the answer and the path unchanged.
  if (AvailableCores() >= 2) {
    std::vector<std::string> a2 = args;
    a2.insert(a2.end(), {"--out", dir + "/j2", "-j", "2"});
    const Result r2 = Servesim(a2);
    ASSERT_EQ(r2.code, 0) << r2.out;
    EXPECT_EQ(Read(dir + "/j2/search.csv"), csv);
  }
  // A probe writes its summary only.
  for (const char* f : {"summary.json", "run_info.json", "point.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/j1/probes/rate_rps-1/" + f)) << f;
  }
  for (const char* f : {"requests.csv", "iterations.csv", "timeline.json", "report.html"}) {
    EXPECT_FALSE(fs::exists(dir + "/j1/probes/rate_rps-1/" + f)) << f;
  }
  // A rerun (with the default -j: the cores available) reuses every probe.
  const auto t = fs::last_write_time(dir + "/j1/probes/rate_rps-1/summary.json");
  std::vector<std::string> rerun = args;
  rerun.insert(rerun.end(), {"--out", dir + "/j1"});
  ASSERT_EQ(Servesim(rerun).code, 0);
  EXPECT_EQ(fs::last_write_time(dir + "/j1/probes/rate_rps-1/summary.json"), t);
  EXPECT_EQ(Read(dir + "/j1/search.csv"), csv);
}

// The same queue on r round-robin replicas at rate 3.5 / S: each replica
// gets a request every r S / 3.5, so it keeps up (TTFT = d0 + S for every
// request) iff r >= 3.5, and with r = 3 each replica's backlog grows by
// S / 7 per request (its last of 20 waits 19 S / 7 > S / 2). With the limit
// d0 + 1.5 S the fewest replicas are ceil(3.5) = 4.
TEST(SearchTest, FindsTheHandComputedMinReplicas) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/c.pbtxt";
  Write(scenario, kConstant);
  double s = 0, d0 = 0;
  ServiceTime(dir, scenario, &s, &d0);
  const Result r = Servesim(
      {"search", scenario, "--vary-replicas", "--out", dir + "/r", "--slo",
       absl::StrCat("ttft_p99=", (d0 + 1.5 * s) * 1e3, "ms"), "--set",
       absl::StrCat("workload.constant.rate_rps=", 3.5 / s), "--set", "workload.num_requests=60"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string csv = Read(dir + "/r/search.csv");
  EXPECT_EQ(AnswerOf(csv), 4) << csv;
  EXPECT_TRUE(absl::StrContains(csv, ",bisect,3,fail,")) << csv;
  EXPECT_TRUE(absl::StrContains(r.out, "answer: min cluster.replicas = 4 meets the SLO; 3 does not"))
      << r.out;
}

TEST(SearchTest, BadCommandLinesNameTheFlag) {
  const std::string dir = FreshDir();
  Write(dir + "/c.pbtxt", kConstant);
  Result r = Servesim({"search", dir + "/c.pbtxt", "--vary-rate", "--slo", "tbt_p98=50ms"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--slo tbt_p98=50ms: unknown statistic 'p98'")) << r.out;
  r = Servesim({"search", dir + "/c.pbtxt", "--slo", "ttft_p99=2s"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "exactly one of --vary-rate and --vary-replicas")) << r.out;
  r = Servesim({"search", dir + "/c.pbtxt", "--vary-rate", "--slo", "ttft_p99=2s",
                "--attainment", "1.5"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--attainment 1.5: expected a fraction in (0, 1]")) << r.out;
  r = Servesim({"search", dir + "/c.pbtxt", "--vary-rate", "--slo", "ttft_p99=2s", "--set",
                "workload.saturated.num_requests=4",
                "--set", "workload.saturated.input_tokens=8", "--set",
                "workload.saturated.output_tokens=8"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--vary-rate: the scenario's workload has no arrival rate"))
      << r.out;
}

TEST(SearchTest, SloParsing) {
  auto slo = ParseSlo("ttft_p99=2s,tbt_p99=50ms,tpot_mean=800us,e2e_max=3");
  ASSERT_TRUE(slo.ok()) << slo.status();
  ASSERT_EQ(slo->size(), 4u);
  EXPECT_EQ((*slo)[0].key, "ttft_s");
  EXPECT_DOUBLE_EQ((*slo)[0].limit_s, 2);
  EXPECT_DOUBLE_EQ((*slo)[1].limit_s, 0.05);
  EXPECT_EQ((*slo)[2].field, "mean");
  EXPECT_DOUBLE_EQ((*slo)[2].limit_s, 8e-4);
  EXPECT_DOUBLE_EQ((*slo)[3].limit_s, 3);
  EXPECT_FALSE(ParseSlo("ttft_p99=-1s").ok());
  EXPECT_FALSE(ParseSlo("latency_p99=1s").ok());
  EXPECT_FALSE(ParseSlo("ttft_p99=1s,ttft_p99=2s").ok());
  std::string reason;
  const std::map<std::string, std::string> figures = {
      {"ttft_s.p99", "1.5"}, {"tbt_s.p99", "0.06"}, {"slo_attainment", "0.95"}};
  auto two = ParseSlo("ttft_p99=2s,tbt_p99=50ms");
  ASSERT_TRUE(two.ok());
  auto pass = ProbePasses(figures, *two, 0.9, &reason);
  ASSERT_TRUE(pass.ok());
  EXPECT_FALSE(*pass);
  EXPECT_EQ(reason, "tbt_p99 0.06 s > 0.05 s");
  auto one = ParseSlo("ttft_p99=2s");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(*ProbePasses(figures, *one, 0.9, &reason));
  EXPECT_FALSE(*ProbePasses(figures, *one, 0.96, &reason));
  EXPECT_EQ(reason, "slo_attainment 0.95 < 0.96");
}

// The driver on predicates with known thresholds: answers and paths are
// the same for every degree of parallelism.
TEST(SearchTest, DriverIsExactAndIndependentOfParallelism) {
  for (double threshold : {0.3, 13.7, 1000.0}) {
    std::vector<SearchStep> first;
    for (int parallel : {1, 2, 3, 7}) {
      int calls = 0;
      auto result = SearchMaxRate(1.0, 0.01, parallel,
                                  [&](const std::vector<double>& v) -> absl::StatusOr<std::vector<bool>> {
                                    ++calls;
                                    EXPECT_LE(static_cast<int>(v.size()), parallel);
                                    std::vector<bool> out;
                                    for (double x : v) out.push_back(x <= threshold);
                                    return out;
                                  });
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_LE(result->answer, threshold);
      EXPECT_GT(result->hi, threshold);
      EXPECT_LE((result->hi - result->lo) / result->lo, 0.01);
      if (parallel == 1) {
        first = result->path;
        EXPECT_EQ(calls, static_cast<int>(first.size()));
      } else {
        ASSERT_EQ(result->path.size(), first.size());
        for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(result->path[i].value, first[i].value);
        EXPECT_LT(calls, static_cast<int>(first.size())) << "parallel " << parallel;
      }
    }
  }
  for (int64_t need : {1, 5, 64}) {
    for (int64_t start : {1, 8, 100}) {
      for (int parallel : {1, 3}) {
        auto result = SearchMinReplicas(start, 1024, parallel,
                                        [&](const std::vector<double>& v) {
                                          std::vector<bool> out;
                                          for (double x : v) out.push_back(x >= need);
                                          return absl::StatusOr<std::vector<bool>>(out);
                                        });
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->answer, need) << "start " << start;
      }
    }
  }
  auto never = SearchMinReplicas(2, 16, 1, [](const std::vector<double>& v) {
    return absl::StatusOr<std::vector<bool>>(std::vector<bool>(v.size(), false));
  });
  EXPECT_FALSE(never.ok());
  EXPECT_TRUE(absl::StrContains(never.status().message(), "--max-replicas 16")) << never.status();
}

// Stops are decided on the sequential algorithm's probes: a stop from
// on_step (at its k-th probe) or from the probe cap reports the same probes,
// in the same order, with the same message, at any parallelism.
TEST(SearchTest, StopsAreIndependentOfParallelism) {
  const double threshold = 13.7;
  auto passes = [&](const std::vector<double>& v) -> absl::StatusOr<std::vector<bool>> {
    std::vector<bool> out;
    for (double x : v) out.push_back(x <= threshold);
    return out;
  };
  for (int stop_at : {1, 3, 6}) {
    std::vector<double> first;
    for (int parallel : {1, 2, 4, 7}) {
      std::vector<double> seen;
      auto r = SearchMaxRate(1.0, 0.01, parallel, passes, [&](const SearchStep& s) {
        seen.push_back(s.value);
        return static_cast<int>(seen.size()) == stop_at ? absl::FailedPreconditionError("stop")
                                                        : absl::OkStatus();
      });
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().message(), "stop");
      ASSERT_EQ(seen.size(), static_cast<size_t>(stop_at)) << "parallel " << parallel;
      if (parallel == 1) first = seen;
      EXPECT_EQ(seen, first) << "parallel " << parallel;
    }
  }
  for (int cap : {1, 2, 5}) {
    for (int parallel : {1, 2, 4, 7}) {
      int steps = 0, ran = 0;
      auto r = SearchMaxRate(
          1.0, 0.01, parallel,
          [&](const std::vector<double>& v) {
            ran += static_cast<int>(v.size());
            return passes(v);
          },
          [&](const SearchStep&) {
            ++steps;
            return absl::OkStatus();
          },
          cap);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().message(), absl::StrCat("stopped after ", cap, " probes (--max-probes ",
                                                   cap, ") without an answer"));
      EXPECT_EQ(steps, cap) << "parallel " << parallel;
      // Speculation never runs more than the cap's worth of probes at once.
      EXPECT_LE(ran, cap * parallel) << "parallel " << parallel;
    }
  }
}

}  // namespace
}  // namespace servesim::studies
