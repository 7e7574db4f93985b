// `servesim replay` on a fixture run with a known answer, and its errors
// on runs it cannot replay as given.
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

// The fixture: a two-layer model whose bundle measures every op at one
// constant time, so each step's time is a sum by hand:
//   prefill of 16 tokens: 2 x (norm 1 + qkv 2 + attention 5 + o 1 + norm 1 +
//     gate_up 4 + act 1 + down 2) + embedding 1 + final norm 1 + lm_head 10
//     + sampler 2 = 48 us
//   decode: the same with attention 3: 44 us
// Two requests of 16 prompt and 4 output tokens, one second apart: TTFT
// 48 us, TPOT 44 us, E2E 48 + 3 x 44 = 180 us; the last finishes at
// 1.000180 s. truth.csv records exactly that.
std::vector<std::string> FixtureArgs(const std::string& run, const std::string& out) {
  return {"replay", run,
          "--profiles", kFixture + "/profiles",
          "--set", "cluster.frontend.latency_s=0",
          "--set", "cluster.frontend.bandwidth_bytes_per_s=1e15",
          "--out", out};
}

std::map<std::string, std::pair<double, double>> CompareRows(const std::string& path) {
  std::map<std::string, std::pair<double, double>> rows;
  const std::vector<std::string> lines = Lines(ReadFile(path));
  EXPECT_EQ(lines.at(0), "metric,stat,measured,simulated,error_pct");
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    double m = 0, s = 0;
    EXPECT_TRUE(absl::SimpleAtod(f.at(2), &m) && absl::SimpleAtod(f.at(3), &s)) << lines[i];
    rows[f[0] + "." + f[1]] = {m, s};
  }
  return rows;
}

TEST(ReplayCliTest, FixtureRunWithAKnownAnswer) {
  const std::string out = FreshDir("replay");
  const auto r = RunServesim(FixtureArgs(kFixture + "/tiny_run", out));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = CompareRows(out + "/replay_compare.csv");
  ASSERT_EQ(rows.size(), 14u);
  const std::map<std::string, double> expect = {
      {"ttft_s", 48e-6}, {"tpot_s", 44e-6}, {"e2e_s", 180e-6}};
  for (const auto& [metric, v] : expect) {
    for (const char* stat : {"mean", "p50", "p90", "p99"}) {
      const auto& [measured, simulated] = rows.at(absl::StrCat(metric, ".", stat));
      EXPECT_NEAR(measured, v, 1e-12) << metric << " " << stat;
      EXPECT_NEAR(simulated, v, 1e-9) << metric << " " << stat;
    }
  }
  EXPECT_NEAR(rows.at("makespan_s.value").second, 1.000180, 1e-9);
  EXPECT_NEAR(rows.at("output_tokens_per_s.value").second, 8 / 1.000180, 1e-6);
  // The usual outputs, requests in arrival order, and the charts.
  const std::vector<std::string> requests = Lines(ReadFile(out + "/requests.csv"));
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1], "0,0.000000,0.000048,0.000180,16,4,0.000048,0.000044,0.000180,0,0,done");
  EXPECT_EQ(requests[2], "1,1.000000,1.000048,1.000180,16,4,0.000048,0.000044,0.000180,0,0,done");
  EXPECT_NE(ReadFile(out + "/replay_e2e.svg").find("simulated = measured"), std::string::npos);
  EXPECT_NE(ReadFile(out + "/replay_queue.svg").find("running, measured"), std::string::npos);
  // The scenario it ran, and where the costs came from.
  EXPECT_NE(ReadFile(out + "/scenario.pbtxt").find("num_kv_blocks: 100"), std::string::npos);
  const std::string info = ReadFile(out + "/run_info.json");
  EXPECT_NE(info.find("\"beyond_grid\": 0,"), std::string::npos) << info;
  EXPECT_NE(info.find("\"op_costs\": {\"gemm\": \"profile\", \"attention\": \"profile\""),
            std::string::npos)
      << info;
  EXPECT_NE(info.find("\"missing_layer\": 0,"), std::string::npos) << info;
  EXPECT_NE(info.find("model test-org/tiny: no preset; dimensions from setup.json's model block"),
            std::string::npos)
      << info;
  EXPECT_NE(r.out.find("e2e_s                mean"), std::string::npos) << r.out;
}

// A mixture-of-experts run on two data-parallel ranks with expert
// parallelism (vLLM's DP2 + EP2), its bundle measuring the MoE block at 7 us
// whatever its load, so a rank's step is the dense fixture's: prefill 48 us,
// decode 44 us, and a rank with no work runs only the MoE layers, 2 x 7 =
// 14 us. The links cost nothing. r0 arrives at 0 and takes rank 0; r1, at
// 20 us, takes rank 1 (4 x 0 waiting + 0 running beats rank 0's 1 running).
// The ranks step together, each step as long as the slower rank:
//   0-48     rank 0 prefills r0, rank 1 idle (14)     -> r0's first token at 48
//   48-96    r0 decodes (44), r1 prefills (48)         -> r0 waits for r1: 48
//   96-140   both decode                               -> r0 3rd, r1 2nd token
//   140-184  both decode                               -> r0 done at 184
//   184-228  rank 0 idle (14), r1 decodes (44)         -> r1 done at 228
// r0: TTFT 48, E2E 184, TPOT (184 - 48) / 3; r1: TTFT 76, E2E 208, TPOT 44.
TEST(ReplayCliTest, DataParallelExpertParallelRanksStepTogether) {
  const std::string out = FreshDir("replay_moe");
  std::vector<std::string> args = FixtureArgs(kFixture + "/tiny_moe_run", out);
  args.insert(args.end(), {"--set", "cluster.interconnect.latency_s=0", "--set",
                           "cluster.interconnect.bandwidth_bytes_per_s=1e15"});
  const auto r = RunServesim(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> requests = Lines(ReadFile(out + "/requests.csv"));
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1], "0,0.000000,0.000048,0.000184,16,4,0.000048,0.000045,0.000184,0,0,done");
  EXPECT_EQ(requests[2], "1,0.000020,0.000096,0.000228,16,4,0.000076,0.000044,0.000208,0,0,done");
  const std::string scenario = ReadFile(out + "/scenario.pbtxt");
  EXPECT_NE(scenario.find("data_parallel: 2"), std::string::npos) << scenario;
  EXPECT_NE(scenario.find("expert_parallel: true"), std::string::npos) << scenario;
  EXPECT_NE(r.out.find("DP=2"), std::string::npos) << r.out;
  const std::string info = ReadFile(out + "/run_info.json");
  EXPECT_NE(info.find("\"missing_layer\": 0,"), std::string::npos) << info;
  // Five lockstep steps, each recording both ranks' batches.
  const std::vector<std::string> its = Lines(ReadFile(out + "/iterations.csv"));
  EXPECT_EQ(its.size(), 6u);
}

// scheduler.step_overhead_s: a CPU time added to every step, here 1 ms on
// the fixture's four steps per request.
TEST(ReplayCliTest, StepOverheadAddsToEveryStep) {
  const std::string out = FreshDir("overhead");
  std::vector<std::string> args = FixtureArgs(kFixture + "/tiny_run", out);
  args.insert(args.end(), {"--set", "scheduler.step_overhead_s=0.001", "--quiet"});
  const auto r = RunServesim(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = CompareRows(out + "/replay_compare.csv");
  EXPECT_NEAR(rows.at("ttft_s.mean").second, 1e-3 + 48e-6, 1e-9);
  EXPECT_NEAR(rows.at("tpot_s.mean").second, 1e-3 + 44e-6, 1e-9);
  EXPECT_NEAR(rows.at("e2e_s.mean").second, 4e-3 + 180e-6, 1e-9);
}

// A copy of the fixture run with one file replaced.
std::string EditedRun(const std::string& file, const std::string& text) {
  const std::string dir = FreshDir("run");
  for (const char* f : {"setup.json", "trace.csv", "truth.csv", "timeseries.csv"}) {
    fs::copy_file(kFixture + "/tiny_run/" + f, dir + "/" + f);
  }
  WriteFile(dir + "/" + file, text);
  return dir;
}

TEST(ReplayCliTest, TruthThatDoesNotMatchTheTraceNamesTheFirstMismatch) {
  const std::string run = EditedRun(
      "truth.csv",
      "request_id,arrival_s,ttft_s,e2e_s,tpot_s,tokens,input_tokens,finish_s\n"
      "r0,0.000000,0.000048,0.000180,0.000044,4,16,0.000180\n"
      "r1,1.000000,0.000048,0.000180,0.000044,4,17,1.000180\n");
  const auto r = RunServesim(FixtureArgs(run, FreshDir("out")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(run + "/truth.csv:3: request r1 arrives at 1.000000 with 17 input tokens "
                             "but " + run + "/trace.csv:3 has 1.000000 and 16; truth.csv must "
                             "list the trace's requests in its order"),
            std::string::npos)
      << r.out;
  const std::string fewer = EditedRun(
      "truth.csv",
      "request_id,arrival_s,ttft_s,e2e_s,tpot_s,tokens,input_tokens,finish_s\n"
      "r0,0.000000,0.000048,0.000180,0.000044,4,16,0.000180\n");
  const auto f = RunServesim(FixtureArgs(fewer, FreshDir("out")));
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.out.find(fewer + "/truth.csv: 1 requests but " + fewer + "/trace.csv has 2"),
            std::string::npos)
      << f.out;
}

TEST(ReplayCliTest, SetupErrorsNameTheFieldAndHowToGiveIt) {
  std::string setup = ReadFile(kFixture + "/tiny_run/setup.json");
  const std::string gpu = "\"NVIDIA RTX PRO 6000 Blackwell Server Edition\"";
  std::string no_gpu = setup;
  no_gpu.replace(no_gpu.find(gpu), gpu.size(), "null");
  const std::string run = EditedRun("setup.json", no_gpu);
  auto r = RunServesim(FixtureArgs(run, FreshDir("out")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(run + "/setup.json: hardware.gpu.name is null (the run did not record its "
                             "GPU); name it with --set cluster.xpu.preset=PRESET (known: a100-40gb,"),
            std::string::npos)
      << r.out;
  // Named on the command line, it runs.
  std::vector<std::string> args = FixtureArgs(run, FreshDir("out"));
  args.insert(args.end(), {"--set", "cluster.xpu.preset=rtx-pro-6000"});
  EXPECT_EQ(RunServesim(args).code, 0);

  std::string no_seqs = setup;
  no_seqs.replace(no_seqs.find("\"max_num_seqs\": 8,"), 18, "");
  const std::string run2 = EditedRun("setup.json", no_seqs);
  r = RunServesim(FixtureArgs(run2, FreshDir("out")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(run2 + "/setup.json: engine_knobs.max_num_seqs is not recorded"),
            std::string::npos)
      << r.out;

  std::string unknown = setup;
  unknown.replace(unknown.find(gpu), gpu.size(), "\"Imaginary GPU 9000\"");
  const std::string run3 = EditedRun("setup.json", unknown);
  r = RunServesim(FixtureArgs(run3, FreshDir("out")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("hardware.gpu.name \"Imaginary GPU 9000\" is no xPU preset's; give --set "
                       "cluster.xpu.preset=PRESET"),
            std::string::npos)
      << r.out;
}

// The prompts' token-id file setup.json names: a replay that cannot find
// it says where it looked and runs without shared prompts, or with
// --strict refuses; --workloads names where it is.
TEST(ReplayCliTest, AMissingTokenIdFileIsAFallbackThatStrictRefuses) {
  std::string setup = ReadFile(kFixture + "/tiny_run/setup.json");
  setup.replace(setup.find("\"prefix_caching\": false"), 23, "\"prefix_caching\": true");
  setup.replace(setup.rfind('}'), 1, ",\n  \"workload\": {\"file\": \"workloads/ids.jsonl\"}\n}");
  const std::string run = EditedRun("setup.json", setup);
  std::vector<std::string> args = FixtureArgs(run, FreshDir("out"));
  args.push_back("--strict");
  auto r = RunServesim(args);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--strict: the replay would assume"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("workload: workloads/ids.jsonl (the prompts' token ids, setup.json "
                       "workload.file) not found (looked in " +
                       run + "/workloads/ids.jsonl"),
            std::string::npos)
      << r.out;
  // Without --strict: a warning, the same run without shared prompts.
  r = RunServesim(FixtureArgs(run, FreshDir("out")));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: workload: workloads/ids.jsonl"), std::string::npos) << r.out;
  // Where --workloads says: the two prompts share their first block.
  const std::string ids = FreshDir("ids");
  std::string lines;
  for (int i = 0; i < 2; ++i) {
    lines += "{\"input_toks\": 16, \"output_toks\": 4, \"arrival_time_ns\": " +
             std::to_string(i * 1000000000LL) +
             ", \"input_tok_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}\n";
  }
  fs::create_directories(ids + "/workloads");
  WriteFile(ids + "/workloads/ids.jsonl", lines);
  const std::string out = FreshDir("out");
  args = FixtureArgs(run, out);
  args.insert(args.end(), {"--workloads", ids, "--strict"});
  r = RunServesim(args);
  // Found: the one thing left assumed is the fixture model's lack of a
  // preset.
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--strict: the replay would assume 1 thing the run did not record: model "
                       "test-org/tiny: no preset"),
            std::string::npos)
      << r.out;
  args = FixtureArgs(run, out);
  args.insert(args.end(), {"--workloads", ids, "--force"});
  r = RunServesim(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(ReadFile(out + "/scenario.pbtxt").find("TRACE_FORMAT_TOKEN_IDS"), std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/workload.jsonl"));
}

// The shipped measured run replays with its bundle; the run's figures are
// in the docs (pinned by DocFiguresTest), here only that it runs whole.
TEST(ReplayCliTest, ShippedRunReplays) {
  const std::string out = FreshDir("shipped");
  const auto r = RunServesim({"replay",
                              std::string(SERVESIM_SOURCE_DIR) +
                                  "/examples/vllm/runs/RTXPRO6000_Llama-3.1-8B_tp1",
                              "--profiles", std::string(SERVESIM_SOURCE_DIR) + "/examples/vllm/profiles",
                              "--out", out, "--quiet"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(CompareRows(out + "/replay_compare.csv").size(), 14u);
  EXPECT_EQ(Lines(ReadFile(out + "/requests.csv")).size(), 301u);
  // The run's workload file lies beside it: prompts carry their token ids.
  EXPECT_NE(ReadFile(out + "/summary.json").find("\"prefix_cache_hit_rate\""), std::string::npos);
}

}  // namespace
}  // namespace servesim
