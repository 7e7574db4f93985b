// End-to-end tests of the servesim command line: they run the real binary
// (SERVESIM_BINARY) on small scenarios and read what it prints and writes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "studies/sweep.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_SOURCE_DIR
#error "SERVESIM_SOURCE_DIR must name the repository root"
#endif

namespace servesim::services {
namespace {

namespace fs = std::filesystem;

constexpr char kShareGpt[] = SERVESIM_SOURCE_DIR
    "/examples/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
constexpr char kAzureConv[] =
    SERVESIM_SOURCE_DIR "/examples/traces/AzureLLMInferenceTrace_conv.csv";

using studies::ShellQuote;
using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;
using RunResult = test_util::CommandResult;

std::string FreshDir() { return FreshDir("cli"); }

std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, ',');
  return f;
}

// Index of `name` in a CSV header line; -1 if absent.
int Column(const std::string& header, const std::string& name) {
  const std::vector<std::string> f = Fields(header);
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == name) return static_cast<int>(i);
  }
  ADD_FAILURE() << "no column " << name << " in " << header;
  return -1;
}

// The raw value of a top-level key of summary.json (one key per line).
std::string JsonValue(const std::string& json, const std::string& key) {
  const std::string tag = absl::StrCat("\n  \"", key, "\": ");
  const size_t at = json.find(tag);
  if (at == std::string::npos) {
    ADD_FAILURE() << "summary.json has no key " << key;
    return "";
  }
  const size_t start = at + tag.size();
  std::string v = json.substr(start, json.find('\n', start) - start);
  if (!v.empty() && v.back() == ',') v.pop_back();
  return v;
}

double JsonNumber(const std::string& json, const std::string& key) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(JsonValue(json, key), &v)) << key;
  return v;
}

// A field of a distribution object, e.g. JsonDistField(j, "ttft_s", "p50").
double JsonDistField(const std::string& json, const std::string& key,
                     const std::string& field) {
  const std::string obj = JsonValue(json, key);
  const std::string tag = absl::StrCat("\"", field, "\": ");
  const size_t at = obj.find(tag);
  if (at == std::string::npos) {
    ADD_FAILURE() << key << " has no " << field << ": " << obj;
    return 0;
  }
  const size_t start = at + tag.size();
  const size_t end = obj.find_first_of(",}", start);
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(obj.substr(start, end - start), &v)) << obj;
  return v;
}

// ------------------------------------------------------- command line ----

TEST(CliTest, HelpDescribesCommandsAndFlags) {
  for (const char* flag : {"help", "--help", "-h"}) {
    const RunResult r = RunServesim({flag});
    EXPECT_EQ(r.code, 0) << flag << ": " << r.out;
    for (const char* word : {"run", "validate", "presets", "--set", "--out",
                             "--seed", "--trace", "--quiet"}) {
      EXPECT_TRUE(absl::StrContains(r.out, word)) << flag << " lacks " << word;
    }
  }
}

TEST(CliTest, HelpAfterACommand) {
  const RunResult r = RunServesim({"run", "--help"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "Usage:")) << r.out;
}

TEST(CliTest, BadCommandLinesExitTwo) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, "model { preset: \"llama2-7b\" }\n");
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{}, "no command given"},
      {{"run", scenario, "--bogus"}, "unknown option --bogus"},
      {{"frobnicate"}, "unknown command frobnicate"},
      {{"run"}, "run needs a scenario file"},
      {{"validate"}, "validate needs a scenario file"},
      {{"run", scenario, "--seed", "abc"}, "--seed needs a non-negative integer"},
      {{"run", scenario, "--out"}, "--out needs a folder"},
      {{"run", scenario, "other.pbtxt"}, "unexpected argument other.pbtxt"},
      {{"presets", "gadgets"},
       "presets takes models, xpus, links, nodes, collectives, attacc, topick, spatten, cta or "
       "lad"},
  };
  for (const Case& c : cases) {
    const RunResult r = RunServesim(c.args);
    const std::string args = absl::StrJoin(c.args, " ");
    EXPECT_EQ(r.code, 2) << args << ": " << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, c.message)) << args << ": " << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "servesim --help")) << args << ": " << r.out;
  }
}

TEST(CliTest, PresetsListsEveryPreset) {
  const RunResult r = RunServesim({"presets"});
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* name :
       {"gpt3-175b", "llama-65b", "mt-nlg-530b", "llama2-7b", "llama2-13b",
        "llama2-70b", "opt-6.7b", "opt-13b", "opt-66b", "gpt2-medium",
        "gpt2-large", "gpt2-xl", "a100-40gb", "a100-80gb", "a100-hbm3",
        "h100-sxm-80gb", "nvlink3", "nvlink4", "pcie4", "pcie5",
        "ethernet-100g", "ethernet-400g", "cta_0", "cta_0.5", "cta_1"}) {
    EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("\n  ", name, "\n")))
        << name << " not listed";
  }
  EXPECT_TRUE(absl::StrContains(r.out, "device kinds: attacc, cta, gpu")) << r.out;
  // The parameter count follows gpt3-175b's own entry.
  const size_t gpt3 = r.out.find("\n  gpt3-175b\n");
  ASSERT_NE(gpt3, std::string::npos);
  const size_t next = r.out.find("\n  llama-65b\n", gpt3);
  ASSERT_NE(next, std::string::npos);
  const std::string entry = r.out.substr(gpt3, next - gpt3);
  EXPECT_TRUE(absl::StrContains(entry, "= 174.57B parameters, 349.14 GB fp16 weights"))
      << entry;
}

TEST(CliTest, PresetsOfOneKind) {
  const RunResult r = RunServesim({"presets", "xpus"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "a100-hbm3")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "gpt3-175b")) << r.out;
  // Links are listed by `presets links`; an xPU only names its own.
  EXPECT_FALSE(absl::StrContains(r.out, "links (cluster.interconnect.preset")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "profile_name: \"RTXPRO6000\"")) << r.out;
}

// ------------------------------------------------------------ validate ----

TEST(CliTest, ValidateEveryExample) {
  int examples = 0;
  for (const auto& entry :
       fs::recursive_directory_iterator(SERVESIM_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".pbtxt") continue;
    ++examples;
    const RunResult r = RunServesim({"validate", entry.path().string()});
    EXPECT_EQ(r.code, 0) << entry.path() << ": " << r.out;
    EXPECT_TRUE(absl::EndsWith(r.out, "OK\n")) << entry.path() << ": " << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "# KV capacity per replica: ")) << r.out;
  }
  EXPECT_GE(examples, 8);  // 4 GPU-only + 4 under examples/attacc/
}

TEST(CliTest, ValidatePrintsTheResolvedScenario) {
  const RunResult r = RunServesim({"validate",
                           SERVESIM_SOURCE_DIR "/examples/gpt3_175b_saturated_attacc.pbtxt",
                           "--set", "cluster.replicas=3"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "replicas: 3")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "num_layers: 96")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "memory_bw_bytes_per_s: 3350000000000")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, "# KV capacity per replica: 3487 blocks x 16 tokens = 55792 tokens"))
      << r.out;
}

TEST(CliTest, ValidateBadFileNamesFileAndLine) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/bad.pbtxt";
  WriteFile(path,
            "model { preset: \"llama2-7b\" }\n"
            "cluster {\n"
            "  replicas: 0\n"
            "  xpu { preset: \"a100-80gb\" }\n"
            "}\n"
            "workload { saturated { num_requests: 1 input_tokens: 1 output_tokens: 1 } }\n");
  const RunResult r = RunServesim({"validate", path});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, absl::StrCat("servesim: error: ", path,
                          ":3: cluster.replicas = 0: allowed range [1, 4096]")))
      << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "OK")) << r.out;

  // A syntax error names line and column.
  const std::string syntax = dir + "/syntax.pbtxt";
  WriteFile(syntax, "model {\n  preset \"llama2-7b\"\n}\n");
  const RunResult s = RunServesim({"validate", syntax});
  EXPECT_EQ(s.code, 1) << s.out;
  EXPECT_TRUE(absl::StrContains(s.out, syntax + ":2:")) << s.out;

  // So does the same error given by --set, naming the --set instead.
  WriteFile(path,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload { saturated { num_requests: 1 input_tokens: 1 output_tokens: 1 } }\n");
  const RunResult o = RunServesim({"validate", path, "--set", "cluster.replicas=0"});
  EXPECT_EQ(o.code, 1) << o.out;
  EXPECT_TRUE(absl::StrContains(
      o.out, absl::StrCat(path, " (--set cluster.replicas): cluster.replicas = 0")))
      << o.out;
}

TEST(CliTest, MissingScenarioFile) {
  const std::string path = FreshDir() + "/nope.pbtxt";
  const RunResult r = RunServesim({"run", path});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, path + ": cannot open scenario file")) << r.out;
}

// ---------------------------------------------------------------- run ----

constexpr char kSmallPoisson[] =
    "name: \"determinism\"\n"
    "model { preset: \"llama2-7b\" }\n"
    "cluster { replicas: 2 xpu { preset: \"a100-80gb\" } }\n"
    "workload {\n"
    "  poisson { rate_rps: 20 }\n"
    "  num_requests: 300\n"
    "  lengths { sampled_from: \"%SHAREGPT%\" }\n"
    "}\n"
    "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL }\n";

std::string SmallPoisson() {
  std::string text = kSmallPoisson;
  text.replace(text.find("%SHAREGPT%"), 10, kShareGpt);
  return text;
}

TEST(CliTest, RunsAreDeterministicAndSeeded) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, SmallPoisson());
  const RunResult a = RunServesim({"run", scenario, "--out", dir + "/a", "--quiet"});
  const RunResult b = RunServesim({"run", scenario, "--out", dir + "/b", "--quiet"});
  const RunResult c = RunServesim({"run", scenario, "--out", dir + "/c", "--quiet", "--seed", "2"});
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(a.out, "");  // --quiet
  for (const char* f : {"summary.json", "requests.csv", "iterations.csv"}) {
    const std::string fa = ReadFile(dir + "/a/" + f);
    EXPECT_FALSE(fa.empty()) << f;
    EXPECT_EQ(fa, ReadFile(dir + "/b/" + f)) << f << " differs between identical runs";
  }
  const std::string sa = ReadFile(dir + "/a/summary.json");
  const std::string sc = ReadFile(dir + "/c/summary.json");
  EXPECT_NE(sa, sc) << "--seed 2 changed nothing";
  EXPECT_EQ(JsonValue(sa, "seed"), "1");
  EXPECT_EQ(JsonValue(sc, "seed"), "2");
  EXPECT_EQ(JsonValue(sa, "requests"), "300");
  EXPECT_EQ(Lines(ReadFile(dir + "/a/requests.csv")).size(), 301u);
}

TEST(CliTest, PaceAndMetricsLeaveResultsByteIdentical) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, SmallPoisson());
  const RunResult a = RunServesim({"run", scenario, "--out", dir + "/a", "--quiet"});
  ASSERT_EQ(a.code, 0) << a.out;
  double simulated = 0;
  ASSERT_TRUE(absl::SimpleAtod(JsonValue(ReadFile(dir + "/a/summary.json"), "simulated_time_s"),
                               &simulated));
  // Paced to take 0.5 wall seconds, with the metrics endpoint up.
  const RunResult b =
      RunServesim({"run", scenario, "--out", dir + "/b", "--quiet", "--metrics", "127.0.0.1:0",
                   "--pace", absl::StrCat(simulated / 0.5)});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(absl::StrContains(b.out, "metrics: http://127.0.0.1:")) << b.out;
  for (const char* f : {"summary.json", "requests.csv", "iterations.csv"}) {
    EXPECT_EQ(ReadFile(dir + "/a/" + f), ReadFile(dir + "/b/" + f)) << f;
  }
  // The pace is a floor on wall time (never a ceiling on speed).
  double wall = 0;
  ASSERT_TRUE(absl::SimpleAtod(JsonValue(ReadFile(dir + "/b/run_info.json"), "wall_time_s"),
                               &wall));
  EXPECT_GE(wall, 0.45);
  // Bad values name the flag and the range.
  const RunResult bad = RunServesim({"run", scenario, "--pace", "0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "--pace needs simulated seconds per wall second, > 0"))
      << bad.out;
  const RunResult port = RunServesim({"run", scenario, "--metrics", "127.0.0.1:99999"});
  EXPECT_EQ(port.code, 1);
  EXPECT_TRUE(absl::StrContains(port.out, "[0, 65535]")) << port.out;
}

// Engines run iterations back to back between arrivals (no SimGrid event
// each); pacing turns that off (an event per iteration). Four DGX+AttAcc
// replicas on two minutes of the Azure trace must give the same bytes
// either way: the run-ahead is an optimisation, not a model.
TEST(CliTest, RunningAheadBetweenArrivalsChangesNoResult) {
  const std::string dir = FreshDir();
  const std::string scenario =
      SERVESIM_SOURCE_DIR "/examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt";
  const std::vector<std::string> common = {"--quiet", "--set", "workload.window_end_s=120",
                                           "--set", "output.timeline=true"};
  std::vector<std::string> fast = {"run", scenario, "--out", dir + "/fast"};
  std::vector<std::string> paced = {"run", scenario, "--out", dir + "/paced", "--pace", "1e12"};
  fast.insert(fast.end(), common.begin(), common.end());
  paced.insert(paced.end(), common.begin(), common.end());
  const RunResult a = RunServesim(fast);
  const RunResult b = RunServesim(paced);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(JsonValue(ReadFile(dir + "/fast/summary.json"), "requests"), "456");
  for (const char* f : {"summary.json", "requests.csv", "iterations.csv", "timeline.json"}) {
    const std::string fa = ReadFile(dir + "/fast/" + f);
    EXPECT_FALSE(fa.empty()) << f;
    EXPECT_EQ(fa, ReadFile(dir + "/paced/" + f)) << f;
  }
}

TEST(CliTest, TimelineAndReportOfTheAttAccExample) {
  const std::string dir = FreshDir();
  const RunResult r = RunServesim(
      {"run", std::string(SERVESIM_SOURCE_DIR) +
                  "/examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt",
       "--out", dir, "--quiet", "--set", "workload.window_end_s=60", "--set",
       "output.timeline_every=25"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string timeline = ReadFile(dir + "/timeline.json");
  ASSERT_TRUE(absl::StartsWith(timeline, "{\"displayTimeUnit\":\"ms\""));
  ASSERT_TRUE(absl::EndsWith(timeline, "\n]}\n"));
  // One event per line: complete events carry pid, tid, ts and dur.
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  int events = 0, groups_seen = 0, aggregated = 0;
  for (const std::string& line : Lines(timeline)) {
    if (!absl::StrContains(line, "\"ph\":\"X\"")) continue;
    ++events;
    int pid = -1, tid = -1;
    double ts = -1, dur = -1;
    const size_t at = line.find("\"pid\":");
    ASSERT_NE(at, std::string::npos) << line;
    ASSERT_EQ(std::sscanf(line.c_str() + at, "\"pid\":%d,\"tid\":%d,\"ts\":%lf,\"dur\":%lf",
                          &pid, &tid, &ts, &dur),
              4)
        << line;
    EXPECT_GE(dur, 0) << line;
    tracks[{pid, tid}].push_back({ts, ts + dur});
    if (absl::StrContains(line, "\"name\":\"attention g7\"")) ++groups_seen;
    if (absl::StrContains(line, "\"name\":\"layers 2-95\"")) ++aggregated;
  }
  EXPECT_GT(events, 100);
  EXPECT_GT(groups_seen, 0) << "head groups of head-level pipelining on the device track";
  EXPECT_GT(aggregated, 0);
  for (auto& [track, spans] : tracks) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      // Printed to the nanosecond: allow that rounding, nothing more.
      EXPECT_LE(spans[i - 1].second, spans[i].first + 1e-3)
          << "replica " << track.first << " track " << track.second << " span " << i;
    }
  }
  // A power counter per sampled iteration, above the replica's static
  // power (8 A100s idle at 80 W and 40 AttAcc stacks at 0.653 W: 666.12 W).
  {
    const std::string timeline = ReadFile(dir + "/timeline.json");
    const std::string key = R"("ph":"C","name":"power","pid":0,)";
    size_t counters = 0;
    for (size_t p = timeline.find(key); p != std::string::npos; p = timeline.find(key, p + 1)) {
      ++counters;
      const size_t w = timeline.find(R"("W":)", p);
      ASSERT_NE(w, std::string::npos);
      EXPECT_GT(std::atof(timeline.c_str() + w + 4), 666.12);
    }
    EXPECT_GT(counters, 0u);
  }
  if (std::system("python3 -c 'pass' 2>/dev/null") == 0) {
    EXPECT_EQ(std::system(("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' " +
                           ShellQuote(dir + "/timeline.json"))
                              .c_str()),
              0)
        << "timeline.json is not valid JSON";
  }
  const std::string html = ReadFile(dir + "/report.html");
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, 9u);  // 3 CDFs, throughput, batch, utilisation, power, energy, schedule
  EXPECT_TRUE(absl::StrContains(html, ">Power</text>"));
  EXPECT_FALSE(absl::StrContains(html, "<script"));
  for (size_t p = html.find("http"); p != std::string::npos; p = html.find("http", p + 1)) {
    EXPECT_EQ(html.compare(p, 26, "http://www.w3.org/2000/svg"), 0) << "a network reference";
  }
  EXPECT_TRUE(absl::StrContains(html, "overlap policy head_level_ff"));
}

TEST(CliTest, LadPoolRunsEveryFidelityDeterministically) {
  // GPT-2 medium with one LAD unit: 4 requests of (200, 16) at t = 0. FULL
  // runs the LAD kernel on all 24 x 16 heads at every decode step, its
  // state kept per request; runs repeat byte for byte, and summary.json
  // carries the measured active fraction and hit ratio. DRAM bytes are
  // compared with the ideal accelerator (preset `ideal`: every K/V row).
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 1 lad {\n"
            "  calibration { lengths: 128 lengths: 256 instances: 2 } } } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 200 output_tokens: 16 } }\n");
  auto run = [&](const std::string& out, std::vector<std::string> sets) {
    std::vector<std::string> args = {"run", scenario, "--out", dir + "/" + out, "--quiet"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const RunResult r = RunServesim(args);
    EXPECT_EQ(r.code, 0) << r.out;
    return ReadFile(dir + "/" + out + "/summary.json");
  };
  auto number = [](const std::string& json, const std::string& key) {
    double v = -1;
    EXPECT_TRUE(absl::SimpleAtod(JsonValue(json, key), &v)) << key;
    return v;
  };
  const std::string fidelity = "cluster.attention_pool.lad.fidelity=";
  const std::string full_a = run("full_a", {fidelity + "FULL"});
  const std::string full_b = run("full_b", {fidelity + "FULL"});
  EXPECT_EQ(full_a, full_b);
  EXPECT_EQ(ReadFile(dir + "/full_a/requests.csv"), ReadFile(dir + "/full_b/requests.csv"));
  EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device_fidelity\": \"full\"")) << full_a;
  EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device_ratios_source\": \"measured\""));
  EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device\": \"lad_1.5 x 1\""));
  EXPECT_TRUE(absl::StrContains(full_a, "\"active_fraction\": "));
  EXPECT_TRUE(absl::StrContains(full_a, "\"prefetch_hit_ratio\": "));
  EXPECT_EQ(number(full_a, "requests_completed"), 4);
  const std::string calibrated = run("cal", {fidelity + "CALIBRATED"});
  const std::string analytic = run("analytic", {fidelity + "ANALYTIC"});
  EXPECT_TRUE(absl::StrContains(calibrated, "\"attention_device_ratios_source\": \"calibrated\""));
  EXPECT_TRUE(absl::StrContains(analytic, "\"attention_device_ratios_source\": \"assumption\""));
  const std::string ideal =
      run("ideal", {fidelity + "ANALYTIC", "cluster.attention_pool.lad.lad.preset=ideal"});
  EXPECT_TRUE(absl::StrContains(calibrated, "\"attention_device_fidelity\": \"calibrated\""));
  for (const std::string* lad : {&full_a, &calibrated, &analytic, &ideal}) {
    EXPECT_EQ(number(*lad, "requests_completed"), 4);
  }
  // With the preset's assumed fractions LAD reads less than the ideal
  // accelerator even at these short contexts (about 210).
  EXPECT_LT(number(analytic, "attention_device_dram_bytes"),
            0.6 * number(ideal, "attention_device_dram_bytes"));
  // Measured on the synthetic data it reads more: at n ~ 210 and d 64 the
  // caches A-F (read and written back, 2 x 8,578 B) and every key as a
  // centre outweigh the K/V rows saved (README, LAD). FULL (these requests'
  // own decode) and CALIBRATED (a profile measured at start-up) agree
  // within 20%.
  const double full_bytes = number(full_a, "attention_device_dram_bytes");
  const double cal_bytes = number(calibrated, "attention_device_dram_bytes");
  EXPECT_GT(full_bytes, number(ideal, "attention_device_dram_bytes"));
  EXPECT_NEAR(full_bytes / cal_bytes, 1.0, 0.2);
}

TEST(CliTest, PruningPoolsRunEveryFidelityDeterministically) {
  // GPT-2 medium with one ToPick or SpAtten unit: 4 requests of (200, 16)
  // at t = 0. FULL runs the kernel on all 24 x 16 heads at every step; runs
  // repeat byte for byte, and pruning reads less DRAM than the preset that
  // does not prune.
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 1 } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 200 output_tokens: 16 } }\n");
  auto run = [&](const std::string& out, std::vector<std::string> sets) {
    std::vector<std::string> args = {"run", scenario, "--out", dir + "/" + out, "--quiet"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const RunResult r = RunServesim(args);
    EXPECT_EQ(r.code, 0) << r.out;
    return ReadFile(dir + "/" + out + "/summary.json");
  };
  auto number = [](const std::string& json, const std::string& key) {
    double v = -1;
    EXPECT_TRUE(absl::SimpleAtod(JsonValue(json, key), &v)) << key;
    return v;
  };
  for (const char* kind : {"topick", "spatten"}) {
    const std::string k = kind;
    const std::string fidelity = "cluster.attention_pool." + k + ".fidelity=";
    const std::string full_a = run(k + "_full_a", {fidelity + "FULL"});
    const std::string full_b = run(k + "_full_b", {fidelity + "FULL"});
    EXPECT_EQ(full_a, full_b) << k;
    EXPECT_EQ(ReadFile(dir + "/" + k + "_full_a/requests.csv"),
              ReadFile(dir + "/" + k + "_full_b/requests.csv"));
    EXPECT_TRUE(absl::StrContains(full_a, "\"fidelity\": 3")) << full_a;
    EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device_fidelity\": \"full\""));
    EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device\": \"" + k + " x 1\""));
    EXPECT_EQ(number(full_a, "requests_completed"), 4);
    const std::string calibrated = run(k + "_cal", {fidelity + "CALIBRATED"});
    const std::string dense =
        run(k + "_dense", {fidelity + "ANALYTIC", "cluster.attention_pool." + k + "." + k +
                                                      ".preset=" +
                                                      (k == "topick" ? "baseline" : "dense")});
    for (const std::string* pruned : {&full_a, &calibrated}) {
      EXPECT_LT(number(*pruned, "attention_device_dram_bytes"),
                0.8 * number(dense, "attention_device_dram_bytes"))
          << k;
    }
  }
}

TEST(CliTest, CtaPoolRunsEveryFidelityDeterministically) {
  // GPT-2 medium with one CTA unit: 4 requests of (200, 16) at t = 0. FULL
  // hashes every layer's tokens of each request at every decode step; runs
  // repeat byte for byte; the compressed KV (k1 + k2 rows per head instead
  // of L) reads less DRAM than `dense`, and summary.json carries the
  // compression ratios.
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta {} units: 1 } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 200 output_tokens: 16 } }\n");
  auto run = [&](const std::string& out, std::vector<std::string> sets) {
    std::vector<std::string> args = {"run", scenario, "--out", dir + "/" + out, "--quiet"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const RunResult r = RunServesim(args);
    EXPECT_EQ(r.code, 0) << r.out;
    return ReadFile(dir + "/" + out + "/summary.json");
  };
  auto number = [](const std::string& json, const std::string& key) {
    double v = -1;
    EXPECT_TRUE(absl::SimpleAtod(JsonValue(json, key), &v)) << key;
    return v;
  };
  const std::string fidelity = "cluster.attention_pool.cta.fidelity=";
  const std::string full_a = run("full_a", {fidelity + "FULL"});
  const std::string full_b = run("full_b", {fidelity + "FULL"});
  EXPECT_EQ(full_a, full_b);
  EXPECT_EQ(ReadFile(dir + "/full_a/requests.csv"), ReadFile(dir + "/full_b/requests.csv"));
  EXPECT_TRUE(absl::StrContains(full_a, "\"fidelity\": 3")) << full_a;
  EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device_fidelity\": \"full\""));
  EXPECT_TRUE(absl::StrContains(full_a, "\"attention_device\": \"cta_0 x 1\""));
  EXPECT_TRUE(absl::StrContains(full_a, "\"kv_compression_ratio\": ")) << full_a;
  EXPECT_EQ(number(full_a, "requests_completed"), 4);
  const std::string calibrated = run("cal", {fidelity + "CALIBRATED"});
  EXPECT_TRUE(absl::StrContains(calibrated, "\"rl\": ")) << calibrated;
  const std::string analytic = run("analytic", {fidelity + "ANALYTIC"});
  // The slides' CTA-0 reductions, as the ANALYTIC table holds them.
  EXPECT_TRUE(absl::StrContains(analytic, "\"rl\": 0.583, \"ra\": 0.352")) << analytic;
  const std::string dense =
      run("dense", {fidelity + "ANALYTIC", "cluster.attention_pool.cta.cta.preset=dense"});
  for (const std::string* compressed : {&full_a, &calibrated, &analytic}) {
    EXPECT_LT(number(*compressed, "attention_device_dram_bytes"),
              0.8 * number(dense, "attention_device_dram_bytes"));
    EXPECT_LT(number(*compressed, "attention_device_busy_s"),
              number(dense, "attention_device_busy_s"));
  }
}

TEST(CliTest, SaturatedBatchMatchesTheAnalyticSchedule) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n"
            "scheduler { batching: BATCHING_POLICY_PREFILL_FIRST }\n");
  const RunResult r = RunServesim({"run", scenario, "--out", dir + "/out", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.out;

  // Iterations: one prefill of all four prompts, then 15 decode steps.
  const std::vector<std::string> its = Lines(ReadFile(dir + "/out/iterations.csv"));
  ASSERT_EQ(its.size(), 17u);  // header + 16
  const int start = Column(its[0], "start_s");
  const int duration = Column(its[0], "duration_s");
  const int batch = Column(its[0], "batch_size");
  const int prefill = Column(its[0], "prefill_tokens");
  const int decode = Column(its[0], "decode_tokens");
  for (size_t i = 1; i < its.size(); ++i) {
    const std::vector<std::string> f = Fields(its[i]);
    EXPECT_EQ(f[batch], "4") << its[i];
    EXPECT_EQ(f[prefill], i == 1 ? "512" : "0") << its[i];
    EXPECT_EQ(f[decode], i == 1 ? "0" : "4") << its[i];
  }
  const std::vector<std::string> first = Fields(its[1]);
  double first_start = 0, first_duration = 0;
  ASSERT_TRUE(absl::SimpleAtod(first[start], &first_start));
  ASSERT_TRUE(absl::SimpleAtod(first[duration], &first_duration));
  const double first_end = first_start + first_duration;
  const std::vector<std::string> last = Fields(its.back());
  double last_start = 0, last_duration = 0;
  ASSERT_TRUE(absl::SimpleAtod(last[start], &last_start));
  ASSERT_TRUE(absl::SimpleAtod(last[duration], &last_duration));

  // Requests: all done, all with the same first-token and finish times.
  const std::vector<std::string> reqs = Lines(ReadFile(dir + "/out/requests.csv"));
  ASSERT_EQ(reqs.size(), 5u);
  const int status = Column(reqs[0], "status");
  const int first_token = Column(reqs[0], "first_token_s");
  const int finish = Column(reqs[0], "finish_s");
  const int ttft = Column(reqs[0], "ttft_s");
  const std::vector<std::string> r1 = Fields(reqs[1]);
  for (size_t i = 1; i < reqs.size(); ++i) {
    const std::vector<std::string> f = Fields(reqs[i]);
    EXPECT_EQ(f[status], "done") << reqs[i];
    EXPECT_EQ(f[first_token], r1[first_token]) << reqs[i];
    EXPECT_EQ(f[finish], r1[finish]) << reqs[i];
  }
  double ft = 0, fin = 0, tt = 0;
  ASSERT_TRUE(absl::SimpleAtod(r1[first_token], &ft));
  ASSERT_TRUE(absl::SimpleAtod(r1[finish], &fin));
  ASSERT_TRUE(absl::SimpleAtod(r1[ttft], &tt));
  // requests.csv has 6 decimals: the first token comes at the end of the
  // prefill iteration, the last at the end of the last iteration.
  EXPECT_NEAR(ft, first_end, 1e-6);
  EXPECT_NEAR(tt, first_end, 1e-6);  // arrival 0
  EXPECT_NEAR(fin, last_start + last_duration, 1e-6);

  const std::string summary = ReadFile(dir + "/out/summary.json");
  EXPECT_EQ(JsonValue(summary, "iterations"), "16");
  EXPECT_EQ(JsonValue(summary, "output_tokens"), "64");
  EXPECT_EQ(JsonValue(summary, "input_tokens"), "512");
  EXPECT_EQ(JsonValue(summary, "requests_completed"), "4");
  EXPECT_EQ(JsonValue(summary, "batch_size_max"), "4");
  EXPECT_EQ(JsonNumber(summary, "batch_size_mean"), 4.0);
  EXPECT_NEAR(JsonDistField(summary, "ttft_s", "p50"), first_end, 1e-8);
  EXPECT_NEAR(JsonDistField(summary, "ttft_s", "max"), first_end, 1e-8);
  EXPECT_NEAR(JsonDistField(summary, "e2e_s", "p99"), last_start + last_duration, 1e-8);
  EXPECT_EQ(JsonDistField(summary, "tbt_s", "count"), 4 * 15);
}

TEST(CliTest, AzureWindowKeepsTheFirstTwoMinutes) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, absl::StrCat(
                          "name: \"gpt3 azure window\"\n"
                          "model { preset: \"gpt3-175b\" max_context_tokens: 4096 }\n"
                          "cluster { replicas: 4 tensor_parallel: 8 xpu { preset: \"a100-hbm3\" } }\n"
                          "workload { trace { path: \"",
                          kAzureConv,
                          "\" } }\n"
                          "scheduler { routing: ROUTING_POLICY_LEAST_OUTSTANDING }\n"
                          "slo { ttft_s: 2.0 tpot_s: 0.05 }\n"));
  const RunResult r = RunServesim({"run", scenario, "--set", "workload.window_end_s=120",
                           "--out", dir + "/out"});
  ASSERT_EQ(r.code, 0) << r.out;
  // 456 of the 19,366 rows arrive less than 120 s after the first row
  // (last kept 119.899903 s, next 120.123244 s); counted with Python over
  // the CSV's TIMESTAMP column, and with awk over its HH:MM:SS.
  const std::string summary = ReadFile(dir + "/out/summary.json");
  EXPECT_EQ(JsonValue(summary, "requests"), "456");
  EXPECT_EQ(JsonValue(summary, "trace_rows_outside_window"), "18910");
  EXPECT_EQ(JsonValue(summary, "trace_rows_skipped_failed"), "0");
  EXPECT_EQ(JsonNumber(summary, "requests_completed") +
                JsonNumber(summary, "requests_rejected"),
            456);
  EXPECT_EQ(Lines(ReadFile(dir + "/out/requests.csv")).size(), 457u);
  EXPECT_TRUE(absl::StrContains(r.out, "456 arrived")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "window [0, 120) s")) << r.out;
}

TEST(CliTest, PipelineStagesAddTheirHandOffsToALoneRequestsSteps) {
  // One request: a single batch in flight, so each step is its round trip
  // through both stages, which split the model's time exactly, plus one
  // hand-off of the hidden states and residual: one token, 2 x 4096 x 2
  // bytes over NVLink 4 (3 us + 16,384 B / 450 GB/s).
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama3.1-8b\" }\n"
            "cluster { xpu { preset: \"h100-sxm-80gb\" } }\n"
            "workload {\n"
            "  constant { rate_rps: 1 }\n"
            "  num_requests: 1\n"
            "  lengths { fixed { input_tokens: 100 output_tokens: 6 } }\n"
            "}\n"
            "scheduler { batching: BATCHING_POLICY_VLLM_V1 }\n");
  const RunResult one = RunServesim({"run", scenario, "--quiet", "--out", dir + "/one"});
  const RunResult two = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/two", "--set", "cluster.pipeline_parallel=2"});
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_EQ(JsonValue(ReadFile(dir + "/two/summary.json"), "pipeline_parallel"), "2");
  const std::vector<std::string> a = Lines(ReadFile(dir + "/one/iterations.csv"));
  const std::vector<std::string> b = Lines(ReadFile(dir + "/two/iterations.csv"));
  ASSERT_EQ(a.size(), 7u);  // header, the prefill, 5 decodes
  ASSERT_EQ(b.size(), a.size());
  const int duration = Column(a[0], "duration_s");
  for (size_t i = 1; i < a.size(); ++i) {
    double da = 0, db = 0;
    ASSERT_TRUE(absl::SimpleAtod(Fields(a[i])[duration], &da));
    ASSERT_TRUE(absl::SimpleAtod(Fields(b[i])[duration], &db));
    const double hand_off = 3e-6 + 2.0 * (i == 1 ? 100 : 1) * 4096 * 2 / 450e9;
    EXPECT_NEAR(db - da, hand_off, 2e-9) << i;
  }
}

TEST(CliTest, TooLongRequestsAreRejectedAndCounted) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload {\n"
            "  constant { rate_rps: 10 }\n"
            "  num_requests: 20\n"
            "  lengths { fixed { input_tokens: 100 output_tokens: 10 } }\n"
            "}\n");
  const RunResult r = RunServesim({"run", scenario, "--set", "model.max_context_tokens=64",
                           "--out", dir + "/out"});
  // Nothing served: exit status 3, the outputs still written.
  ASSERT_EQ(r.code, 3) << r.out;
  const std::string summary = ReadFile(dir + "/out/summary.json");
  EXPECT_EQ(JsonValue(summary, "requests"), "20");
  EXPECT_EQ(JsonValue(summary, "requests_rejected_too_long"), "20");
  EXPECT_EQ(JsonValue(summary, "requests_rejected"), "20");
  EXPECT_EQ(JsonValue(summary, "requests_completed"), "0");
  EXPECT_EQ(JsonValue(summary, "requests_rejected_kv_capacity"), "0");
  EXPECT_EQ(JsonValue(summary, "iterations"), "0");
  EXPECT_EQ(JsonNumber(summary, "slo_attainment"), 0.0);
  EXPECT_EQ(JsonNumber(summary, "throughput_tokens_per_s"), 0.0);
  const std::vector<std::string> reqs = Lines(ReadFile(dir + "/out/requests.csv"));
  ASSERT_EQ(reqs.size(), 21u);
  const int status = Column(reqs[0], "status");
  for (size_t i = 1; i < reqs.size(); ++i) {
    EXPECT_EQ(Fields(reqs[i])[status], "rejected_too_long") << reqs[i];
  }
  EXPECT_TRUE(absl::StrContains(r.out, "20 rejected (20 too long")) << r.out;
}

TEST(CliTest, BadTraceRowNamesFileAndLine) {
  const std::string dir = FreshDir();
  const std::string trace = dir + "/bad.csv";
  WriteFile(trace,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.68,374,44\n"
            "2023-11-16 18:15:47.00,abc,10\n");
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload { trace { path: \"bad.csv\" } }\n");  // relative to the scenario
  for (const char* command : {"run", "validate"}) {
    const RunResult r = RunServesim({command, scenario});
    EXPECT_EQ(r.code, 1) << command << ": " << r.out;
    EXPECT_TRUE(absl::StrContains(
        r.out, absl::StrCat(trace, ":3: ContextTokens is \"abc\"; expected an integer in [1, 2147483647]")))
        << command << ": " << r.out;
  }
}

TEST(CliTest, TraceFlagReplacesTheWorkload) {
  const std::string dir = FreshDir();
  const std::string trace = dir + "/t.csv";
  WriteFile(trace,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.00,100,5\n"
            "2023-11-16 18:15:47.00,200,5\n"
            "2023-11-16 18:15:48.00,300,5\n");
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, SmallPoisson());
  const RunResult r = RunServesim({"run", scenario, "--trace", trace, "--out", dir + "/out", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string summary = ReadFile(dir + "/out/summary.json");
  EXPECT_EQ(JsonValue(summary, "requests"), "3");
  EXPECT_EQ(JsonValue(summary, "input_tokens"), "600");
  EXPECT_EQ(JsonValue(summary, "output_tokens"), "15");
}

TEST(CliTest, UnwritableOutputFailsBeforeTheRun) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n");
  const std::string file = dir + "/a_file";
  WriteFile(file, "not a folder\n");
  const RunResult r = RunServesim({"run", scenario, "--out", file + "/sub"});
  EXPECT_EQ(r.code, 1) << r.out;
  // Checked before the simulation: no table, the error alone.
  EXPECT_FALSE(absl::StrContains(r.out, "throughput")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, file + "/sub: cannot create the output folder")) << r.out;
}

TEST(CliTest, SummaryJsonHasTheDocumentedKeysAndNoWallTime) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario, SmallPoisson());
  const RunResult r = RunServesim({"run", scenario, "--out", dir + "/out"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "outputs    " + dir + "/out/")) << r.out;
  const std::string summary = ReadFile(dir + "/out/summary.json");
  ASSERT_TRUE(absl::StartsWith(summary, "{\n")) << summary;
  ASSERT_TRUE(absl::EndsWith(summary, "\n}\n")) << summary;
  for (const char* key :
       {"throughput_tokens_per_s", "throughput_requests_per_s", "slo_attainment",
        "goodput_requests_per_s", "batch_size_mean", "batch_size_max",
        "kv_utilization_mean", "energy_per_token_j", "simulated_time_s"}) {
    double v = -1;
    EXPECT_TRUE(absl::SimpleAtod(JsonValue(summary, key), &v)) << key;
    EXPECT_GE(v, 0) << key;
  }
  EXPECT_GT(JsonNumber(summary, "throughput_tokens_per_s"), 0);
  EXPECT_GT(JsonNumber(summary, "simulated_time_s"), 0);
  for (const char* key : {"ttft_s", "tbt_s", "tpot_s", "e2e_s"}) {
    const double p50 = JsonDistField(summary, key, "p50");
    const double p90 = JsonDistField(summary, key, "p90");
    const double p99 = JsonDistField(summary, key, "p99");
    const double mean = JsonDistField(summary, key, "mean");
    EXPECT_GT(p50, 0) << key;
    EXPECT_LE(p50, p90) << key;
    EXPECT_LE(p90, p99) << key;
    EXPECT_GT(mean, 0) << key;
  }
  // Wall time varies from run to run; it lives in run_info.json only.
  EXPECT_FALSE(absl::StrContains(summary, "wall")) << summary;
  EXPECT_FALSE(absl::StrContains(summary, "realtime")) << summary;
  const std::string info = ReadFile(dir + "/out/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "\"wall_time_s\": ")) << info;
  EXPECT_TRUE(absl::StrContains(info, "\"realtime_factor\": ")) << info;
}

TEST(CliTest, OutputCsvsCanBeTurnedOff) {
  const std::string dir = FreshDir();
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"llama2-7b\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } }\n"
            "workload { saturated { num_requests: 2 input_tokens: 8 output_tokens: 2 } }\n"
            "output { requests_csv: false }\n");
  const RunResult r = RunServesim({"run", scenario, "--out", dir + "/out", "--quiet",
                           "--set", "output.iterations_csv=false"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/out/summary.json"));
  EXPECT_TRUE(fs::exists(dir + "/out/run_info.json"));
  EXPECT_FALSE(fs::exists(dir + "/out/requests.csv"));
  EXPECT_FALSE(fs::exists(dir + "/out/iterations.csv"));
}

}  // namespace
}  // namespace servesim::services
