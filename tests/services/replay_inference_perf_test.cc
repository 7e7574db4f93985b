// `servesim replay` of an inference-perf run: a fixture with two stages and
// a shared prefix, on the constant-time bundle of replay_cli_test.cc
// (prefill step 48 us, decode step 44 us), so every simulated figure is
// known by hand; and the errors of runs it cannot replay.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

namespace fs = std::filesystem;
using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;

const std::string kFixture = std::string(SERVESIM_SOURCE_DIR) + "/tests/testdata/replay";

std::vector<std::string> Args(const std::string& run, const std::string& out) {
  return {"replay",     run,
          "--profiles", kFixture + "/profiles",
          "--set",      "cluster.frontend.latency_s=0",
          "--set",      "cluster.frontend.bandwidth_bytes_per_s=1e15",
          "--out",      out};
}

// A copy of the fixture run, its config's load section from `from` up to
// `server:` replaced by `load`; without `skip`.
std::string EditedRun(const std::string& name, const std::string& from, const std::string& load,
                      const std::string& skip = "") {
  const std::string run = FreshDir(name);
  for (const auto& e : fs::directory_iterator(kFixture + "/inference_perf_run")) {
    if (e.path().filename() != skip) fs::copy_file(e.path(), fs::path(run) / e.path().filename());
  }
  std::string config = ReadFile(run + "/config.yml");
  const size_t at = config.find(from);
  config.replace(at, config.find("server:") - at, load);
  WriteFile(run + "/config.yml", config);
  return run;
}

// replay_stages.csv as "stage.metric.stat" -> {measured, simulated, error}.
std::map<std::string, std::vector<std::string>> StageRows(const std::string& path) {
  std::map<std::string, std::vector<std::string>> rows;
  const std::vector<std::string> lines = Lines(ReadFile(path));
  EXPECT_EQ(lines.at(0), "stage,rate,metric,stat,measured,simulated,error_pct");
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    EXPECT_EQ(f.size(), 7u) << lines[i];
    rows[absl::StrCat(f[0], ".", f[2], ".", f[3])] = {f[4], f[5], f[6]};
  }
  return rows;
}

// config.yml: one system prompt of 16 tokens before two questions of 16,
// 4 output tokens; stage 0 sends 2 requests over 1 s, stage 1 2 over 2 s,
// load.interval 1 s. Each request runs alone: TTFT 48 us, ITL and TPOT
// 44 us, E2E 48 + 3 x 44 = 180 us. Stage 0's last request is sent at its
// end, 1 s (the constant timer's gaps sum to the duration), and finishes at
// 1.000180; stage 1 starts 1 + 1 s later (the client's interval and its
// one-second start), so its last request is sent at 3.000180 + 2.
TEST(ReplayInferencePerfTest, TwoStagesWithASharedPrefixAgainstTheirReports) {
  const std::string out = FreshDir("replay_ip");
  const auto r = RunServesim(Args(kFixture + "/inference_perf_run", out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 stages placed after their drains (1 provisional run)"), std::string::npos)
      << r.out;
  const std::vector<std::string> trace = Lines(ReadFile(out + "/trace.csv"));
  ASSERT_EQ(trace.size(), 5u);
  EXPECT_EQ(trace[0], "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens,prompt_id");
  EXPECT_EQ(trace[2].substr(0, trace[2].find(',')), "1.000000");
  EXPECT_EQ(trace[4].substr(0, trace[4].find(',')), "5.000180");
  for (size_t i = 1; i < trace.size(); ++i) {
    EXPECT_NE(trace[i].find(",32,4,g0,16,p"), std::string::npos) << trace[i];
  }
  const auto rows = StageRows(out + "/replay_stages.csv");
  EXPECT_EQ(rows.at("0.e2e_s.mean"), (std::vector<std::string>{"0.0002", "0.00018", "-10.00"}));
  EXPECT_EQ(rows.at("1.e2e_s.p99"), (std::vector<std::string>{"0.00018", "0.00018", "0.00"}));
  EXPECT_EQ(rows.at("0.ttft_s.mean")[1], "4.8e-05");
  EXPECT_EQ(rows.at("1.itl_s.p90")[1], "4.4e-05");
  EXPECT_EQ(rows.at("1.tpot_s.mean")[1], "4.4e-05");
  EXPECT_EQ(rows.at("0.prompt_len.mean")[1], "32");
  EXPECT_EQ(rows.at("1.successes.count")[1], "2");
  EXPECT_EQ(rows.at("1.failures.count")[1], "0");
  // Stage 1: 8 tokens from its first send to its last finish, 5.000360.
  const std::string first = trace[3].substr(0, trace[3].find(','));
  double t0 = 0, tps = 0;
  ASSERT_TRUE(absl::SimpleAtod(first, &t0));
  ASSERT_TRUE(absl::SimpleAtod(rows.at("1.output_tokens_per_s.value")[1], &tps));
  EXPECT_NEAR(tps, 8 / (5.000360 - t0), 1e-3 * tps);
  // Prefix caching: the second prompt finds the system prompt's block in
  // stage 0 (16 tokens); stage 1 sends both prompts again and each finds
  // its first block (vLLM computes a prompt's last token, so a 32-token
  // prompt seen before reuses one of its two blocks): 16 + 2 x 16.
  EXPECT_NE(ReadFile(out + "/summary.json").find("\"prefix_cache_hit_tokens\": 48,"),
            std::string::npos);
  EXPECT_NE(ReadFile(out + "/scenario.pbtxt")
                .find("# workload: 4 requests in 2 stages from the inference-perf config"),
            std::string::npos);
  EXPECT_NE(r.out.find("measured vs simulated, per stage"), std::string::npos) << r.out;
  // The provisional run leaves nothing behind.
  EXPECT_FALSE(fs::exists(out + "/.inference_perf_pass"));
}

// The client's concurrency limit: one worker of one request. Four requests
// due within 40 us are sent one at a time, each when the one before
// finishes, so each runs alone (E2E 180 us from its send) and the stage
// ends 4 x 180 us after the first send.
TEST(ReplayInferencePerfTest, TheClientsConcurrencyLimitHoldsRequestsBack) {
  const std::string run = EditedRun("replay_ip_cap", "  stages:",
                                    "  num_workers: 1\n  worker_max_concurrency: 1\n  stages:\n"
                                    "  - {rate: 100000, duration: 0.00004}\n",
                                    "stage_1_lifecycle_metrics.json");
  const std::string out = FreshDir("replay_ip_cap_out");
  const auto r = RunServesim(Args(run, out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(ReadFile(out + "/scenario.pbtxt").find("max_in_flight: 1"), std::string::npos);
  const std::vector<std::string> requests = Lines(ReadFile(out + "/requests.csv"));
  ASSERT_EQ(requests.size(), 5u);
  double previous_finish = -1;
  for (size_t i = 1; i < requests.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(requests[i], ',');
    double arrival = 0, finish = 0;
    ASSERT_TRUE(absl::SimpleAtod(f.at(1), &arrival) && absl::SimpleAtod(f.at(3), &finish));
    EXPECT_EQ(f.at(8), "0.000180") << requests[i];
    if (previous_finish >= 0) {
      EXPECT_NEAR(arrival, previous_finish, 1e-9) << requests[i];
    }
    previous_finish = finish;
  }
  EXPECT_NEAR(previous_finish, 4 * 180e-6, 1e-9);
  const std::string info = ReadFile(out + "/run_info.json");
  EXPECT_NE(info.find("\"client\": {\"max_in_flight\": 1, \"held_requests\": 3,"),
            std::string::npos)
      << info;
}

// A stage still draining when the first provisional run starts the next:
// stage 0 sends 7,000 requests within 70 ms to a client that keeps one in
// flight, so they run one after another, 180 us each, and stage 0 drains
// 1.26 s after its first send; the first run placed stage 1 at 1.14 s
// (its sends, as long again, and the one-second start, load.interval
// being 0). The second run places it after the drain: its one request
// (sent at the end of its one-second stage) goes at the first send +
// 1.26 + 1 + 1 s.
TEST(ReplayInferencePerfTest, AStageThatHadNotDrainedIsPlacedAgain) {
  const std::string run =
      EditedRun("replay_ip_overlap", "  interval: 1.0",
                "  interval: 0\n  num_workers: 1\n  worker_max_concurrency: 1\n  stages:\n"
                "  - {rate: 100000, duration: 0.07}\n  - {rate: 1, duration: 1}\n");
  const std::string out = FreshDir("replay_ip_overlap_out");
  const auto r = RunServesim(Args(run, out));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 stages placed after their drains (2 provisional runs)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("started"), std::string::npos) << r.out;  // no misplaced stage
  const std::vector<std::string> trace = Lines(ReadFile(out + "/trace.csv"));
  ASSERT_EQ(trace.size(), 7002u);
  double first = 0, last = 0;
  ASSERT_TRUE(absl::SimpleAtod(trace[1].substr(0, trace[1].find(',')), &first));
  ASSERT_TRUE(absl::SimpleAtod(trace.back().substr(0, trace.back().find(',')), &last));
  // The drain, in the run's clock (which starts at the first send): 7,000
  // x 180 us, plus SimGrid's rounding of each event to its precision.
  const std::vector<std::string> requests = Lines(ReadFile(out + "/requests.csv"));
  std::vector<std::string> f = absl::StrSplit(requests.at(7000), ',');
  double drain = 0;
  ASSERT_TRUE(absl::SimpleAtod(f.at(3), &drain));
  EXPECT_NEAR(drain, 7000 * 180e-6, 1e-4);
  EXPECT_NEAR(last, first + drain + 1 + 1, 2e-6);
  const auto rows = StageRows(out + "/replay_stages.csv");
  EXPECT_EQ(rows.at("0.e2e_s.p99")[1], "0.00018");
  EXPECT_EQ(rows.at("1.e2e_s.mean")[1], "0.00018");
}

TEST(ReplayInferencePerfTest, RunsItCannotReplayNameTheFileAndTheField) {
  const std::string run = FreshDir("replay_ip_bad");
  for (const auto& e : fs::directory_iterator(kFixture + "/inference_perf_run")) {
    fs::copy_file(e.path(), fs::path(run) / e.path().filename());
  }
  const std::string config = ReadFile(run + "/config.yml");
  {
    std::string bad = config;
    bad.replace(bad.find("type: constant"), 14, "type: concurrent");
    WriteFile(run + "/config.yml", bad);
    const auto r = RunServesim(Args(run, FreshDir("replay_ip_out")));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("config.yml:15: load.type is concurrent; the replay reads constant and "
                         "poisson"),
              std::string::npos)
        << r.out;
  }
  {
    std::string bad = config;
    bad.replace(bad.find("- {rate: 1, duration: 2}"), 24, "");
    WriteFile(run + "/config.yml", bad);
    const auto r = RunServesim(Args(run, FreshDir("replay_ip_out")));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("1 stages in load.stages but 2 stage reports"), std::string::npos)
        << r.out;
  }
  {
    fs::remove(run + "/config.yml");
    const auto r = RunServesim(Args(run, FreshDir("replay_ip_out")));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("inference-perf stage reports but no config beside them"),
              std::string::npos)
        << r.out;
  }
  // The measured run's own folder is never an output.
  WriteFile(run + "/config.yml", config);
  const auto r = RunServesim(Args(run, run));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(fs::exists(run + "/stage_0_lifecycle_metrics.json"));
}

}  // namespace
}  // namespace servesim
