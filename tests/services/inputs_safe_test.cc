// What servesim never does to a user: delete or overwrite a file it did not
// write, leave a final-named output without the summary that says whether
// the run was whole, leave a child running after a study is stopped, or
// believe a number (a NaN, an infinity) at a border. Each test runs the
// command a user would.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

constexpr char kExample[] = SERVESIM_SOURCE_DIR "/examples/gpt3_175b_dgx_azure_conv.pbtxt";
constexpr char kShareGpt[] = SERVESIM_SOURCE_DIR "/examples/llama2_7b_poisson_sharegpt.pbtxt";
constexpr char kMeasuredRun[] =
    SERVESIM_SOURCE_DIR "/examples/vllm/runs_otel/GPU80GB_Llama-2-7b-hf_tp1_mbt4096_train-sweep";

bool Exists(const std::string& path) {
  return test_util::RunCommand(absl::StrCat("test -e '", path, "'")).code == 0;
}

std::string Sh(const std::string& cmd) { return test_util::RunCommand(cmd).out; }

// Copies an example scenario to `to` with its trace path made absolute;
// `sed` edits it further.
void CopyScenario(const std::string& from, const std::string& to, const std::string& sed = "") {
  ASSERT_EQ(
      test_util::RunCommand(absl::StrCat("sed -e 's|path: \"traces/|path: \"", SERVESIM_SOURCE_DIR,
                                         "/examples/traces/|' ", sed, " '", from, "' > '", to, "'"))
          .code,
      0);
}

TEST(InputsSafeTest, AFolderServesimDidNotWriteIsRefusedUnlessForced) {
  const std::string dir = test_util::FreshDir("foreign");
  test_util::WriteFile(dir + "/requests.csv", "the user's own\n");
  test_util::WriteFile(dir + "/notes.txt", "mine\n");
  const test_util::CommandResult r = test_util::RunServesim(
      {"run", kExample, "--out", dir, "--quiet", "--set", "workload.window_end_s=60"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, dir + ": holds 2 entries (notes.txt, requests.csv) and no .servesim.lock, so "
                   "servesim did not write it"))
      << r.out;
  EXPECT_EQ(test_util::ReadFile(dir + "/requests.csv"), "the user's own\n");
  EXPECT_FALSE(Exists(dir + "/.servesim.lock"));
  EXPECT_FALSE(Exists(dir + "/summary.json"));

  // --force: only servesim's names, listed first; the user's other file stays.
  const test_util::CommandResult forced = test_util::RunServesim(
      {"run", kExample, "--out", dir, "--quiet", "--force", "--set", "workload.window_end_s=60"});
  EXPECT_EQ(forced.code, 0) << forced.out;
  EXPECT_TRUE(absl::StrContains(forced.out, "servesim: --force: " + dir +
                                                " was not written by servesim; replacing only "
                                                "requests.csv there"))
      << forced.out;
  EXPECT_EQ(test_util::ReadFile(dir + "/notes.txt"), "mine\n");
  EXPECT_TRUE(absl::StartsWith(test_util::ReadFile(dir + "/requests.csv"), "id,"));

  // An empty folder is free to take.
  const std::string empty = test_util::FreshDir("empty");
  EXPECT_EQ(test_util::RunServesim(
                {"run", kExample, "--out", empty, "--quiet", "--set", "workload.window_end_s=60"})
                .code,
            0);
}

TEST(InputsSafeTest, AFolderUnderAnOutputsNameIsNeverRemoved) {
  const std::string dir = test_util::FreshDir("folder_named");
  ASSERT_EQ(test_util::RunServesim(
                {"run", kExample, "--out", dir, "--quiet", "--set", "workload.window_end_s=60"})
                .code,
            0);
  ASSERT_EQ(test_util::RunCommand(
                absl::StrCat("rm '", dir, "/timeline.json' && mkdir '", dir, "/timeline.json'"))
                .code,
            0);
  const test_util::CommandResult r = test_util::RunServesim(
      {"run", kExample, "--out", dir, "--quiet", "--set", "workload.window_end_s=60"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, dir + "/timeline.json: is a folder under the name of an "
                                             "output servesim writes"))
      << r.out;
  EXPECT_EQ(test_util::RunCommand(absl::StrCat("test -d '", dir, "/timeline.json'")).code, 0);
  // Nothing removed before the refusal.
  EXPECT_TRUE(Exists(dir + "/summary.json"));
}

TEST(InputsSafeTest, AFolderHoldingTheCommandsInputsIsRefused) {
  // replay RUN --out RUN: the measured run's files are its inputs.
  const std::string run = test_util::FreshDir("measured");
  ASSERT_EQ(test_util::RunCommand(absl::StrCat("cp -r '", kMeasuredRun, "'/. '", run, "'")).code,
            0);
  const std::string before = Sh(absl::StrCat("cd '", run, "' && ls -A && md5sum *"));
  for (const std::vector<std::string>& force :
       {std::vector<std::string>{}, std::vector<std::string>{"--force"}}) {
    std::vector<std::string> args = {"replay", run, "--out", run, "--quiet"};
    args.insert(args.end(), force.begin(), force.end());
    const test_util::CommandResult r = test_util::RunServesim(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, run + ": holds " + run +
                                             "/setup.json, which this "
                                             "command reads"))
        << r.out;
    EXPECT_EQ(Sh(absl::StrCat("cd '", run, "' && ls -A && md5sum *")), before);
  }
  // run S --out DIR where DIR holds S.
  const std::string dir = test_util::FreshDir("holds_scenario");
  CopyScenario(kExample, dir + "/s.pbtxt");
  const test_util::CommandResult r =
      test_util::RunServesim({"run", dir + "/s.pbtxt", "--out", dir, "--force"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "which this command reads")) << r.out;
}

TEST(InputsSafeTest, ASecondSignalLeavesNoFinalNamedFileWithoutTheSummary) {
  const std::string dir = test_util::FreshDir("second_signal");
  // Two SIGINTs at once, while the paced run is under way.
  const test_util::CommandResult r = test_util::RunCommand(
      absl::StrCat("'", SERVESIM_BINARY, "' run '", kExample, "' --out '", dir,
                   "' --quiet --set workload.window_end_s=3000 --pace 1000 2>&1 & pid=$!; n=0; "
                   "while [ ! -e '",
                   dir,
                   "/.requests.csv.partial' ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; "
                   "sleep 0.3; kill -INT $pid; kill -INT $pid; wait $pid; echo \"exit=$?\""));
  EXPECT_TRUE(absl::StrContains(r.out, "exit=130")) << r.out;
  if (absl::StrContains(r.out, "second signal")) {
    EXPECT_TRUE(absl::StrContains(r.out, "servesim: second signal: stopped at once; " + dir +
                                             "/ is incomplete: no summary.json"))
        << r.out;
  }
  // Whichever signal won: a final-named output only beside summary.json.
  if (!Exists(dir + "/summary.json")) {
    for (const char* f :
         {"requests.csv", "iterations.csv", "run_info.json", "timeline.json", "report.html"}) {
      EXPECT_FALSE(Exists(dir + "/" + f)) << f << "\n" << r.out;
    }
  } else {
    EXPECT_TRUE(absl::StrContains(test_util::ReadFile(dir + "/summary.json"), "\"partial\": true"));
  }
}

TEST(InputsSafeTest, SigtermToASweepsParentEndsEveryChild) {
  const std::string dir = test_util::FreshDir("sweep_term");
  // Twelve points of the whole hour (half a second each), one at a time:
  // SIGTERM once the first has finished; the children are counted as soon
  // as the parent has exited. The
  // children are forks, with the parent's command line ("[-]-out": the
  // pattern does not match the shell that runs pgrep).
  const test_util::CommandResult r = test_util::RunCommand(absl::StrCat(
      "'", SERVESIM_BINARY, "' sweep '", kExample, "' --out '", dir,
      "' -j 1 --vary seed=1,2,3,4,5,6,7,8,9,10,11,12 > '", dir,
      ".log' 2>&1 & pid=$!; n=0; while ! grep -q '\\[1/12\\]' '", dir,
      ".log' && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done; kill -TERM $pid; wait $pid; "
      "echo \"exit=$?\"; pgrep -f -- '[-]-out ",
      dir, "' | wc -l"));
  const std::vector<std::string> lines = test_util::Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0], "exit=143") << test_util::ReadFile(dir + ".log");
  EXPECT_EQ(lines[1], "0") << "a child outlived its sweep";
  const std::string log = test_util::ReadFile(dir + ".log");
  EXPECT_TRUE(absl::StrContains(log, "servesim: interrupted by SIGTERM: ")) << log;
  EXPECT_TRUE(absl::StrContains(log, "the same command resumes")) << log;
  EXPECT_FALSE(absl::StrContains(log, "[12/12]")) << log;
}

TEST(BordersTest, PlotRefusesNonFiniteValuesItsOwnInputAndControlBytes) {
  const std::string dir = test_util::FreshDir("plot");
  test_util::WriteFile(dir + "/t.csv", "x,y\n1,2\n2,nan\n");
  test_util::CommandResult r =
      test_util::RunServesim({"plot", dir + "/t.csv", "--x", "x", "--y", "y"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "t.csv:3: column 'y' = 'nan' is not a finite number"))
      << r.out;
  EXPECT_FALSE(Exists(dir + "/t.svg"));

  test_util::WriteFile(dir + "/u.csv", "x,y\n1,2\n2,3\n");
  r = test_util::RunServesim(
      {"plot", dir + "/u.csv", "--x", "x", "--y", "y", "--out", dir + "/./u.csv"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "is the table plotted")) << r.out;
  EXPECT_EQ(test_util::ReadFile(dir + "/u.csv"), "x,y\n1,2\n2,3\n");

  test_util::WriteFile(dir + "/c.csv", "x,\x1b[2Jy\n1,2\n");
  r = test_util::RunServesim({"plot", dir + "/c.csv", "--x", "x", "--y", "z"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "\x1b")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "columns: x, \\x1b[2Jy")) << r.out;
}

TEST(BordersTest, ScenariosAreReadOnlyFromRegularFilesUnderTheCap) {
  test_util::CommandResult r = test_util::RunServesim({"validate", "/dev/zero"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "/dev/zero: is a character device; expected a scenario"))
      << r.out;
  const std::string dir = test_util::FreshDir("big");
  ASSERT_EQ(test_util::RunCommand(absl::StrCat("truncate -s 17M '", dir, "/big.pbtxt'")).code, 0);
  r = test_util::RunServesim({"validate", dir + "/big.pbtxt"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "17825792 bytes, more than the 16777216 allowed")) << r.out;
  ASSERT_EQ(test_util::RunCommand(absl::StrCat("ln -s loop '", dir, "/loop'")).code, 0);
  r = test_util::RunServesim({"validate", dir + "/loop"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "a loop of symbolic links")) << r.out;
}

TEST(BordersTest, WorkloadFieldsTheSourceIgnoresAreRefusedByRunAndFlaggedByValidate) {
  const std::string dir = test_util::FreshDir("ignored");
  CopyScenario(kExample, dir + "/s.pbtxt", "-e 's|^workload {|workload { num_requests: 50|'");
  test_util::CommandResult r = test_util::RunServesim({"run", dir + "/s.pbtxt", "--quiet"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out,
                                "workload.num_requests applies to synthetic arrivals only "
                                "(poisson, gamma, constant); this workload reads a trace"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, dir + "/s.pbtxt:")) << r.out;
  r = test_util::RunServesim({"validate", dir + "/s.pbtxt"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "servesim: warning: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "(ignored here; `servesim run` refuses it)")) << r.out;
  // A source from the command line makes the file's lengths moot.
  r = test_util::RunServesim({"validate", kShareGpt, "--trace",
                              SERVESIM_SOURCE_DIR
                              "/examples/traces/AzureLLMInferenceTrace_conv.csv"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "ignored here")) << r.out;
}

// Settings other settings make moot: each named with where it was set and
// the condition it needs.
TEST(BordersTest, SettingsTheScenarioIgnoresAreRefusedByRunAndFlaggedByValidate) {
  struct Case {
    const char* scenario;
    std::vector<std::string> sets;
    std::string message;
  };
  const Case cases[] = {
      {kExample,
       {"scheduler.long_prefill_token_threshold=256"},
       "scheduler.long_prefill_token_threshold applies to VLLM_V1 batching only"},
      {kExample,
       {"scheduler.cuda_graph_max_tokens=512"},
       "scheduler.cuda_graph_max_tokens applies to data-parallel MoE ranks only"},
      {kExample,
       {"output.timeline=false", "output.timeline_every=5"},
       "output.timeline_every shapes the timeline, and output.timeline is false"},
      {kShareGpt,
       {"cluster.collectives.preset=auto"},
       "cluster.collectives costs collectives, and each replica is one GPU (none run)"},
  };
  for (const auto& [scenario, sets, message] : cases) {
    std::vector<std::string> args = {"run", scenario, "--quiet"};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    test_util::CommandResult r = test_util::RunServesim(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, message)) << message << "\n" << r.out;
    args[0] = "validate";
    args.erase(args.begin() + 2);  // --quiet
    r = test_util::RunServesim(args);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, message)) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "(ignored here; `servesim run` refuses it)")) << r.out;
  }
  // A condition --set changes makes the file's own fields for it moot: a
  // file that shapes its timeline, run with output.timeline=false.
  const std::string dir = test_util::FreshDir("moot");
  CopyScenario(kExample, dir + "/s.pbtxt",
               "-e 's|^workload {|output { timeline_every: 7 }\\nworkload {|'");
  test_util::CommandResult moot =
      test_util::RunServesim({"validate", dir + "/s.pbtxt", "--set", "output.timeline=false"});
  EXPECT_EQ(moot.code, 0) << moot.out;
  EXPECT_FALSE(absl::StrContains(moot.out, "ignored here")) << moot.out;
  // The same file with its own timeline off: listed, at its line.
  CopyScenario(kExample, dir + "/t.pbtxt",
               "-e 's|^workload {|output { timeline: false timeline_every: 7 }\\nworkload {|'");
  moot = test_util::RunServesim({"validate", dir + "/t.pbtxt"});
  EXPECT_TRUE(absl::StrContains(moot.out, dir + "/t.pbtxt:22: output.timeline_every shapes the "
                                                "timeline, and output.timeline is false"))
      << moot.out;
  // Where they apply, they run: VLLM_V1 batching with its threshold.
  const test_util::CommandResult r = test_util::RunServesim(
      {"validate", kExample, "--set", "scheduler.batching=BATCHING_POLICY_VLLM_V1", "--set",
       "scheduler.long_prefill_token_threshold=256"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "ignored here")) << r.out;
}

TEST(BordersTest, ARepeatPastTheTimeLimitIsRefusedAfterOnePass) {
  const test_util::CommandResult r =
      test_util::RunServesim({"validate", kExample, "--set", "workload.repeat=10000", "--set",
                              "workload.rate_scale=0.001"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "with workload.repeat 10000 (period ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "past the simulated-time limit of 1e+09 s")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "lower workload.repeat to at most ")) << r.out;
}

TEST(BordersTest, AnInconsistentPlatformFileIsAnErrorNotAnAbort) {
  const std::string dir = test_util::FreshDir("platform");
  // Six hosts where the fat tree's parameters need eight.
  ASSERT_EQ(test_util::RunCommand(
                absl::StrCat(
                    "mkdir -p '", dir, "/platforms' && sed 's/radical=\"0-7\"/radical=\"0-5\"/' '",
                    SERVESIM_SOURCE_DIR, "/examples/platforms/fat_tree_8x200g_2to1.xml' > '", dir,
                    "/platforms/fat_tree_8x200g_2to1.xml'"))
                .code,
            0);
  CopyScenario(SERVESIM_SOURCE_DIR "/examples/llama3.1_70b_pd_fat_tree_platform.pbtxt",
               dir + "/s.pbtxt");
  const test_util::CommandResult r = test_util::RunServesim({"validate", dir + "/s.pbtxt"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "cluster.disaggregation.fabric.platform_file: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "SimGrid cannot build this platform: ")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "Backtrace")) << r.out;
}

TEST(BordersTest, AMissingWebDirIsRefusedBeforeTheRun) {
  const test_util::CommandResult r = test_util::RunServesim(
      {"run", kExample, "--quiet", "--metrics", "0", "--web-dir", "/nonexistent/web"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--web-dir /nonexistent/web: no such folder")) << r.out;
}

TEST(BordersTest, AMetricsTokenFileIsCheckedBeforeTheRun) {
  const std::string dir = test_util::FreshDir("token");
  test_util::WriteFile(dir + "/blank", "\n");
  test_util::CommandResult r = test_util::RunServesim(
      {"run", kExample, "--quiet", "--metrics", "0", "--metrics-token-file", dir + "/blank"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, "--metrics-token-file " + dir + "/blank (first line): the token is empty"))
      << r.out;
  r = test_util::RunServesim(
      {"run", kExample, "--quiet", "--metrics", "0", "--metrics-token-file", "/dev/zero"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "--metrics-token-file /dev/zero: is a character device"))
      << r.out;
}

TEST(BordersTest, MergeRefusesPointsOfDifferentScenarios) {
  const std::string a = test_util::FreshDir("merge_a"), b = test_util::FreshDir("merge_b");
  ASSERT_EQ(test_util::RunServesim({"sweep", kExample, "--out", a, "--quiet", "--set",
                                    "workload.window_end_s=30", "--vary", "seed=1"})
                .code,
            0);
  ASSERT_EQ(test_util::RunServesim({"sweep", kExample, "--out", b, "--quiet", "--set",
                                    "workload.window_end_s=20", "--vary", "seed=2"})
                .code,
            0);
  const test_util::CommandResult r =
      test_util::RunServesim({"merge", a, b, "--out", test_util::FreshDir("merged")});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ran with --set workload.window_end_s=20 but ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "merge points of one sweep")) << r.out;
}

}  // namespace
}  // namespace servesim
