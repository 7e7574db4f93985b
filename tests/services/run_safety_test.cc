// Runs that never mislead: the output folder is checked and locked before
// any simulation, an earlier run's outputs are replaced, SIGINT / SIGTERM
// stop cleanly with partial outputs flagged, time past its range is
// refused, a run that serves nothing says so, a search that cannot succeed
// stops with its reason, and messages name what is wrong.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "reports/output_dir.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

constexpr char kExample[] = SERVESIM_SOURCE_DIR "/examples/gpt3_175b_dgx_azure_conv.pbtxt";
constexpr char kShareGpt[] = SERVESIM_SOURCE_DIR "/examples/llama2_7b_poisson_sharegpt.pbtxt";

bool Exists(const std::string& path) {
  return test_util::RunCommand(absl::StrCat("test -e '", path, "'")).code == 0;
}

// Every line of a CSV has as many fields as its header.
void ExpectWholeRows(const std::string& path) {
  const std::vector<std::string> lines = test_util::Lines(test_util::ReadFile(path));
  ASSERT_GE(lines.size(), 2u) << path;
  const size_t fields = std::vector<std::string>(absl::StrSplit(lines[0], ',')).size();
  for (size_t i = 1; i < lines.size(); ++i) {
    ASSERT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ',')).size(), fields)
        << path << " line " << i + 1 << ": " << lines[i];
  }
  EXPECT_TRUE(absl::EndsWith(test_util::ReadFile(path), "\n")) << path;
}

TEST(OutputFolderTest, NotAFolderFailsBeforeAnySimulation) {
  const std::string dir = test_util::FreshDir("notafolder");
  const std::string file = dir + "/results";
  test_util::WriteFile(file, "mine\n");
  const test_util::CommandResult r = test_util::RunServesim({"run", kExample, "--out", file});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, file + ": is a file, not a folder")) << r.out;
  // No table: the run never started (the table is printed after it).
  EXPECT_FALSE(absl::StrContains(r.out, "throughput")) << r.out;
  EXPECT_EQ(test_util::ReadFile(file), "mine\n");

  const test_util::CommandResult null =
      test_util::RunServesim({"run", kExample, "--out", "/dev/null"});
  EXPECT_EQ(null.code, 1) << null.out;
  EXPECT_TRUE(absl::StrContains(null.out, "/dev/null: is a character device, not a folder"))
      << null.out;
  EXPECT_FALSE(absl::StrContains(null.out, "throughput")) << null.out;
}

TEST(OutputFolderTest, UnwritableFolderFailsBeforeAnySimulation) {
  // procfs takes no new files, even from root (--force: servesim did not
  // write /proc, which is refused on that ground first).
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--out", "/proc", "--force"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "/proc: cannot write in the output folder")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "throughput")) << r.out;
}

TEST(OutputFolderTest, ASecondRunIntoALockedFolderFailsAtOnceNamingTheHolder) {
  const std::string dir = test_util::FreshDir("locked");
  auto held = reports::OutputDir::Acquire(dir, "servesim run the-first.pbtxt");
  ASSERT_TRUE(held.ok()) << held.status();
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--out", dir, "--set", "workload.window_end_s=60"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "another servesim is writing its outputs there (pid "))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "servesim run the-first.pbtxt")) << r.out;
  EXPECT_FALSE(Exists(dir + "/summary.json"));
  held->reset();  // released: the folder is free again
  const test_util::CommandResult again = test_util::RunServesim(
      {"run", kExample, "--out", dir, "--quiet", "--set", "workload.window_end_s=60"});
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(Exists(dir + "/summary.json"));
}

TEST(OutputFolderTest, ARerunLeavesOnlyItsOwnOutputs) {
  const std::string dir = test_util::FreshDir("rerun");
  ASSERT_EQ(test_util::RunServesim(
                {"run", kExample, "--out", dir, "--quiet", "--set", "workload.window_end_s=60"})
                .code,
            0);
  // The user's own file beside servesim's.
  test_util::WriteFile(dir + "/notes.txt", "the user's\n");
  for (const char* f : {"summary.json", "run_info.json", "requests.csv", "iterations.csv",
                        "timeline.json", "report.html"}) {
    EXPECT_TRUE(Exists(dir + "/" + f)) << f;
  }
  ASSERT_EQ(
      test_util::RunServesim({"run", kExample, "--out", dir, "--quiet", "--set",
                              "workload.window_end_s=60", "--set", "output.timeline=false", "--set",
                              "output.report_html=false", "--set", "output.iterations_csv=false"})
          .code,
      0);
  EXPECT_FALSE(Exists(dir + "/timeline.json"));
  EXPECT_FALSE(Exists(dir + "/report.html"));
  EXPECT_FALSE(Exists(dir + "/iterations.csv"));
  EXPECT_TRUE(Exists(dir + "/summary.json"));
  EXPECT_TRUE(Exists(dir + "/requests.csv"));
  EXPECT_EQ(test_util::ReadFile(dir + "/notes.txt"), "the user's\n");
  // No temporary names left behind.
  EXPECT_EQ(test_util::RunCommand(absl::StrCat("ls -A '", dir, "' | grep -c partial")).out, "0\n");
}

// Runs the example paced (3,000 simulated seconds at 1,000x: ~3 s), sends
// `signal` 0.5 s after its simulation has started (its requests.csv is
// open under the temporary name), and returns the output and exit status.
test_util::CommandResult Interrupt(const std::string& dir, const char* signal) {
  const test_util::CommandResult r = test_util::RunCommand(
      absl::StrCat("'", SERVESIM_BINARY, "' run '", kExample, "' --out '", dir,
                   "' --quiet --set workload.window_end_s=3000 --pace 1000 2>&1 & pid=$!; n=0; "
                   "while [ ! -e '",
                   dir,
                   "/.requests.csv.partial' ] && [ $n -lt 600 ]; do sleep 0.05; "
                   "n=$((n+1)); done; sleep 0.5; kill -",
                   signal, " $pid; wait $pid; echo \"exit=$?\""));
  return r;
}

void ExpectPartialOutputs(const std::string& dir, const std::string& why) {
  EXPECT_TRUE(absl::StrContains(test_util::ReadFile(dir + "/summary.json"), "\"partial\": true"));
  const std::string info = test_util::ReadFile(dir + "/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "\"partial\": true")) << info;
  EXPECT_TRUE(absl::StrContains(info, why)) << info;
  EXPECT_TRUE(absl::StrContains(test_util::ReadFile(dir + "/timeline.json"),
                                absl::StrCat("\"partial\":true,\"stopped\":\"", why, "\"")));
  const std::string html = test_util::ReadFile(dir + "/report.html");
  EXPECT_TRUE(absl::StrContains(html, "<title>servesim (PARTIAL)")) << html.substr(0, 400);
  EXPECT_TRUE(absl::StrContains(html, "<body>\n<p class=\"partial\"><b>PARTIAL RUN</b>"));
  ExpectWholeRows(dir + "/requests.csv");
  ExpectWholeRows(dir + "/iterations.csv");
}

TEST(InterruptTest, SigintStopsCleanlyWithPartialOutputs) {
  const std::string dir = test_util::FreshDir("sigint");
  const test_util::CommandResult r = Interrupt(dir, "INT");
  EXPECT_TRUE(absl::StrContains(r.out, "exit=130")) << r.out;
  // One line, servesim's: no SimGrid actor dump.
  const std::vector<std::string> lines = test_util::Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "servesim: interrupted by SIGINT at t = ")) << r.out;
  EXPECT_TRUE(absl::EndsWith(lines[0], "s simulated; partial results written to " + dir + "/"))
      << r.out;
  ExpectPartialOutputs(dir, "interrupted by SIGINT");
}

TEST(InterruptTest, SigtermStopsCleanlyWithPartialOutputs) {
  const std::string dir = test_util::FreshDir("sigterm");
  const test_util::CommandResult r = Interrupt(dir, "TERM");
  EXPECT_TRUE(absl::StrContains(r.out, "exit=143")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "servesim: interrupted by SIGTERM at t = ")) << r.out;
  ExpectPartialOutputs(dir, "interrupted by SIGTERM");
}

TEST(SimulatedTimeTest, ArrivalsPastTheLimitAreRefusedBeforeTheRun) {
  const std::string dir = test_util::FreshDir("farfuture");
  // 1e-9 x the trace's rate: its second request would arrive at ~4.3e9 s.
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--out", dir, "--set", "workload.rate_scale=1e-9"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "workload: request 1 arrives at t = 4.31458e+09 s"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "past the simulated-time limit of 1e+09 s")) << r.out;
  EXPECT_FALSE(Exists(dir + "/summary.json"));
  // A synthetic rate alike.
  const test_util::CommandResult p = test_util::RunServesim(
      {"run", kShareGpt, "--quiet", "--set", "workload.poisson.rate_rps=1e-12"});
  EXPECT_EQ(p.code, 1) << p.out;
  EXPECT_TRUE(absl::StrContains(p.out, "past the simulated-time limit")) << p.out;
}

TEST(NothingServedTest, AllRejectedExitsThreeWithUndefinedLatencies) {
  const std::string dir = test_util::FreshDir("allrejected");
  // A 16-token context: every prompt of the trace is too long.
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--out", dir, "--set", "workload.window_end_s=60",
                              "--set", "model.max_context_tokens=16"});
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "  TTFT              -          -          -          -\n"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "servesim: warning: no request was served")) << r.out;
  const std::string summary = test_util::ReadFile(dir + "/summary.json");
  EXPECT_TRUE(
      absl::StrContains(summary,
                        "\"ttft_s\": {\"count\": 0, \"mean\": null, \"p50\": null, \"p90\": null, "
                        "\"p99\": null, \"max\": null}"))
      << summary;
  // Every null figure says why, last in the file.
  EXPECT_TRUE(absl::StrContains(
      summary,
      "  \"nulls\": {\"ttft_s\": \"no request got its first token\", \"tbt_s\": \"no "
      "request got a second token\", \"tpot_s\": \"no request finished with more than "
      "one output token\", \"e2e_s\": \"no request finished\""))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "\"e2e_s\": \"no request finished\"}\n}\n")) << summary;
}

TEST(NothingServedTest, FewCompletedRequestsAreFlagged) {
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kExample, "--quiet", "--set", "workload.max_requests=3"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out,
      "servesim: warning: only 3 request(s) completed: p90 and p99 both lie between the "
      "two largest samples"))
      << r.out;
}

TEST(SearchStopTest, UnreachableAttainmentStopsAtTheFirstProbeWithSearchCsv) {
  const std::string dir = test_util::FreshDir("unreachable");
  // A quarter of the ShareGPT requests are longer than the context: at
  // most ~76% can meet any SLO, under the default 90% attainment.
  const test_util::CommandResult r = test_util::RunServesim(
      {"search", kShareGpt, "--slo", "ttft_p99=2s", "--vary-rate", "--out", dir});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "the SLO cannot be met: 485 of 2000 requests are rejected"))
      << r.out;
  const std::vector<std::string> rows = test_util::Lines(test_util::ReadFile(dir + "/search.csv"));
  ASSERT_EQ(rows.size(), 3u);  // header, the one probe, the stop
  EXPECT_TRUE(absl::StartsWith(rows[1], "1,probe,6,fail,")) << rows[1];
  EXPECT_TRUE(absl::StartsWith(rows[2], ",stopped,")) << rows[2];
  EXPECT_TRUE(absl::StrContains(rows[2], "slo_attainment <= 0.7575 < --attainment 0.9")) << rows[2];
}

TEST(SearchStopTest, AWindowedTraceNeedsTwoProbesToShowTheBound) {
  // A 512-token context rejects most of the conversation trace's prompts;
  // a rate scale changes which rows its 300 s window keeps, so one probe
  // is not proof.
  const std::string dir = test_util::FreshDir("windowed");
  const test_util::CommandResult r = test_util::RunServesim(
      {"search", kExample, "--slo", "ttft_p99=2s", "--vary-rate", "--set",
       "workload.window_end_s=300", "--set", "model.max_context_tokens=512", "--out", dir});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out,
                                "rejected (too long for the context or the KV cache) at "
                                "this and an earlier rate"))
      << r.out;
  const std::vector<std::string> rows = test_util::Lines(test_util::ReadFile(dir + "/search.csv"));
  ASSERT_EQ(rows.size(), 4u);  // header, two probes, the stop
}

TEST(SearchStopTest, MaxProbesCapsTheSearch) {
  const std::string dir = test_util::FreshDir("maxprobes");
  const test_util::CommandResult r = test_util::RunServesim(
      {"search", kShareGpt, "--slo", "ttft_p99=2s", "--attainment", "0.5", "--vary-rate",
       "--max-probes", "2", "--set", "workload.num_requests=200", "--out", dir});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "stopped after 2 probes (--max-probes 2)")) << r.out;
  const std::vector<std::string> rows = test_util::Lines(test_util::ReadFile(dir + "/search.csv"));
  ASSERT_EQ(rows.size(), 4u);  // header, two probes, the stop
}

TEST(MessagesTest, EmptyFileOrFolderAsScenario) {
  const std::string dir = test_util::FreshDir("emptyscenario");
  test_util::WriteFile(dir + "/empty.pbtxt", "");
  test_util::WriteFile(dir + "/comments.pbtxt", "# nothing here\n");
  const test_util::CommandResult e = test_util::RunServesim({"run", dir + "/empty.pbtxt"});
  EXPECT_EQ(e.code, 1);
  EXPECT_TRUE(absl::StrContains(e.out, dir + "/empty.pbtxt: is empty; expected a scenario"))
      << e.out;
  const test_util::CommandResult c = test_util::RunServesim({"validate", dir + "/comments.pbtxt"});
  EXPECT_TRUE(absl::StrContains(c.out, "sets nothing (only comments)")) << c.out;
  const test_util::CommandResult d = test_util::RunServesim({"run", dir});
  EXPECT_EQ(d.code, 1);
  EXPECT_TRUE(absl::StrContains(d.out, dir + ": is a folder; expected a scenario file")) << d.out;
}

TEST(MessagesTest, MissingLengthsFileNamesTheField) {
  const test_util::CommandResult r =
      test_util::RunServesim({"run", kShareGpt, "--set", "workload.lengths.sampled_from=nope.csv"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(absl::StrContains(r.out, "workload.lengths.sampled_from \"nope.csv\": ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "nope.csv: cannot open")) << r.out;
}

TEST(MessagesTest, BadTlsFilesAreNamedNotReportedAsListenErrors) {
  const std::string dir = test_util::FreshDir("badtls");
  test_util::WriteFile(dir + "/cert.pem", "not a certificate\n");
  test_util::WriteFile(dir + "/key.pem",
                       "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n");
  const test_util::CommandResult r = test_util::RunCommand(
      absl::StrCat("'", SERVESIM_AGENT_BINARY, "' --device gpu --listen 127.0.0.1:0 --tls-cert '",
                   dir, "/cert.pem' --tls-key '", dir, "/key.pem'"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out,
      "--tls-cert " + dir + "/cert.pem: not a PEM certificate (-----BEGIN CERTIFICATE-----)"))
      << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "cannot listen")) << r.out;
}

TEST(MessagesTest, GrpcLinesAreQuietUnlessAsked) {
  // An agent that is not there: servesim's own error, and no gRPC log line
  // ("E1125 ...") unless --log-level asks for them.
  const std::string dir = test_util::FreshDir("grpcquiet");
  const std::vector<std::string> args = {
      "run",     kExample,          "--quiet",          "--set", "workload.window_end_s=10",
      "--agent", "gpu=127.0.0.1:1", "--agent-deadline", "0.2"};
  const test_util::CommandResult quiet = test_util::RunServesim(args);
  EXPECT_EQ(quiet.code, 1) << quiet.out;
  for (const std::string& line : test_util::Lines(quiet.out)) {
    EXPECT_TRUE(absl::StartsWith(line, "servesim: ")) << line;
  }
  std::vector<std::string> loud = args;
  loud.insert(loud.begin(), {"--log-level", "debug"});
  const test_util::CommandResult debug = test_util::RunServesim(loud);
  EXPECT_EQ(debug.code, 1) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "servesim: grpc ")) << debug.out;
  const test_util::CommandResult bad = test_util::RunServesim({"--log-level", "loud", "presets"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "expected quiet, error, warning, info or debug"))
      << bad.out;
}

}  // namespace
}  // namespace servesim
