// Device agents end to end, with real servesim-agent processes: outputs
// byte-identical to in process, an agent killed mid-run, token, TLS and
// graceful shutdown, command-line errors.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/attacc/attacc_device.h"
#include "devices/attention_data.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/topick/topick_device.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "studies/sweep.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_AGENT_BINARY
#error "SERVESIM_AGENT_BINARY must name the servesim-agent executable"
#endif
#include "tests/agents/agent_test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_AGENT_BINARY
#error "SERVESIM_AGENT_BINARY must name the servesim-agent executable"
#endif

namespace servesim::agents {
namespace {

namespace fs = std::filesystem;
namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;
using test::AttAccSpec;
using test::Bits;
using test::ExpectSameBits;
using test::FastClient;
using test::FreshDir;
using test::GpuSpec;
using test::LocalAgent;
using test::MakeCerts;
using test::Ramp;
using test::SampleOps;
using test::StartLocal;
using test_util::ReadFile;
using test_util::WriteFile;

// ---------------------------------------------------- real processes ----

using servesim::studies::ShellQuote;

struct Proc {
  pid_t pid = -1;
  std::string address;  // agents: where they listen
  std::string log;
};

// Starts servesim-agent on a free loopback port; waits for its address.
Proc StartAgent(const std::string& dir, const std::string& kind,
                const std::vector<std::string>& extra = {}) {
  static int n = 0;
  Proc p;
  p.log = absl::StrCat(dir, "/agent", n++, ".log");
  // Created here, before the child runs: a loaded machine may poll it
  // before the child gets to open it.
  ::close(::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  p.pid = fork();
  if (p.pid == 0) {
    const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    dup2(fd, 1);
    std::vector<std::string> args = {SERVESIM_AGENT_BINARY, "--device", kind, "--listen",
                                     "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 300 && p.address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string log = ReadFile(p.log);
    const size_t at = log.find(" on ");
    const size_t end = log.find('\n', at == std::string::npos ? 0 : at);
    if (at != std::string::npos && end != std::string::npos) {
      p.address = log.substr(at + 4, std::min(end, log.find(' ', at + 4)) - at - 4);
    }
  }
  EXPECT_FALSE(p.address.empty()) << ReadFile(p.log);
  return p;
}

int Stop(Proc& p, int sig) {
  if (p.pid <= 0) return -1;
  kill(p.pid, sig);
  int status = 0;
  waitpid(p.pid, &status, 0);
  p.pid = -1;
  return status;
}

struct Agents {
  std::vector<Proc> procs;
  ~Agents() {
    for (Proc& p : procs) Stop(p, SIGKILL);
  }
  std::string List(size_t from, size_t to) const {
    std::vector<std::string> a;
    for (size_t i = from; i < to; ++i) a.push_back(procs[i].address);
    return absl::StrJoin(a, ",");
  }
};

struct Result {
  int code = -1;
  std::string out;
};

Result RunServesim(const std::vector<std::string>& args) {
  std::string cmd = ShellQuote(SERVESIM_BINARY);
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", ShellQuote(a));
  absl::StrAppend(&cmd, " 2>&1");
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void ExpectSameOutputs(const std::string& a, const std::string& b) {
  for (const char* f : {"summary.json", "requests.csv", "iterations.csv"}) {
    const std::string fa = ReadFile(a + "/" + f);
    EXPECT_FALSE(fa.empty()) << a << "/" << f;
    EXPECT_TRUE(fa == ReadFile(b + "/" + f)) << f << " differs: " << a << " vs " << b;
  }
}

std::string SmallGpuScenario(const std::string& dir, const std::string& cluster_extra = "",
                             const std::string& name = "gpu.pbtxt") {
  const std::string path = dir + "/" + name;
  WriteFile(path, absl::StrCat(
                      "name: \"agents\"\n"
                      "model { preset: \"llama2-7b\" }\n"
                      "cluster { replicas: 2 xpu { preset: \"a100-80gb\" } ",
                      cluster_extra, " }\n"
                      "workload {\n  poisson { rate_rps: 20 }\n  num_requests: 200\n"
                      "  lengths { sampled_from: \"",
                      SERVESIM_SOURCE_DIR,
                      "/examples/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv\" }\n}\n"
                      "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL }\n"));
  return path;
}

constexpr char kAttAccExample[] =
    SERVESIM_SOURCE_DIR "/examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt";

TEST(AgentEndToEndTest, GpuOutputsAreByteIdenticalWithOneAndTwoAgents) {
  const std::string dir = FreshDir();
  const std::string sc = SmallGpuScenario(dir);
  Agents ag;
  for (int i = 0; i < 2; ++i) ag.procs.push_back(StartAgent(dir, "gpu"));
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/one", "--agent", "gpu=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/two", "--agent", "gpu=" + ag.List(0, 2)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  ExpectSameOutputs(dir + "/in", dir + "/two");
  const std::string info = ReadFile(dir + "/two/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "\"device\": \"xPU device (gpu)\"")) << info;
  EXPECT_TRUE(absl::StrContains(info, "\"memo_hits\": ")) << info;
  EXPECT_FALSE(absl::StrContains(info, "\"memo_hits\": 0,")) << info;
  EXPECT_FALSE(absl::StrContains(ReadFile(dir + "/in/run_info.json"), "agents"));
  // The scenario can name the endpoints itself.
  SmallGpuScenario(dir, absl::StrCat("xpu_endpoints: \"", ag.procs[1].address, "\""),
                   "named.pbtxt");
  const Result named = RunServesim({"run", dir + "/named.pbtxt", "--quiet", "--out", dir + "/named"});
  ASSERT_EQ(named.code, 0) << named.out;
  ExpectSameOutputs(dir + "/in", dir + "/named");
  // Flags name what is wrong.
  Result bad = RunServesim({"run", sc, "--agent", "tpu=127.0.0.1:1"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "unknown device kind 'tpu'")) << bad.out;
  bad = RunServesim({"run", sc, "--agent", "gpu=localhost"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "HOST:PORT")) << bad.out;
  bad = RunServesim({"run", sc, "--agent", "attacc=127.0.0.1:5"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(absl::StrContains(bad.out, "the scenario has no attacc device")) << bad.out;
}

// Mixture of experts: two lockstep data-parallel ranks whose MoE ops are
// costed by a GPU agent give the in-process outputs byte for byte.
TEST(AgentEndToEndTest, MoeDataParallelOutputsAreByteIdenticalOnAnAgent) {
  const std::string dir = FreshDir();
  const std::string sc = SERVESIM_SOURCE_DIR "/tests/testdata/golden_qwen3_moe_dp2_ep2.pbtxt";
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu"));
  const std::vector<std::string> window = {"--set", "workload.window_end_s=30"};
  std::vector<std::string> a = {"run", sc, "--quiet", "--out", dir + "/in"};
  a.insert(a.end(), window.begin(), window.end());
  const Result in = RunServesim(a);
  ASSERT_EQ(in.code, 0) << in.out;
  a = {"run", sc, "--quiet", "--out", dir + "/one", "--agent", "gpu=" + ag.List(0, 1)};
  a.insert(a.end(), window.begin(), window.end());
  const Result one = RunServesim(a);
  ASSERT_EQ(one.code, 0) << one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
}

TEST(AgentEndToEndTest, LatentSlidingAndNodeSpanningModelsAreByteIdenticalOnAnAgent) {
  // DeepSeek-V3 on 16 data-parallel ranks over two nodes (MLA ops, FP8
  // GEMMs, a cross-node exchange) and gpt-oss-20b (windowed attention,
  // MXFP4 experts) in two pipeline stages: the agent's costs are the same.
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu"));
  const std::string trace = SERVESIM_SOURCE_DIR "/examples/traces/AzureLLMInferenceTrace_conv.csv";
  struct Case {
    std::string name, model, cluster;
  };
  for (const Case& c : {Case{"deepseek", "deepseek-v3",
                             "data_parallel: 16 expert_parallel: true node { preset: \"dgx-h200\" }"},
                        Case{"gpt_oss", "gpt-oss-20b",
                             "pipeline_parallel: 2 xpu { preset: \"h100-sxm-80gb\" }"}}) {
    const std::string sc = dir + "/" + c.name + ".pbtxt";
    WriteFile(sc, absl::StrCat("model { preset: \"", c.model, "\" }\ncluster { ", c.cluster,
                               " }\nworkload { trace { path: \"", trace,
                               "\" } max_requests: 150 }\n"
                               "scheduler { batching: BATCHING_POLICY_VLLM_V1 }\n"));
    const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/" + c.name + "_in"});
    ASSERT_EQ(in.code, 0) << in.out;
    const Result on = RunServesim({"run", sc, "--quiet", "--out", dir + "/" + c.name + "_agent",
                                   "--agent", "gpu=" + ag.List(0, 1)});
    ASSERT_EQ(on.code, 0) << on.out;
    ExpectSameOutputs(dir + "/" + c.name + "_in", dir + "/" + c.name + "_agent");
  }
}

TEST(AgentEndToEndTest, AttAccOutputsAreByteIdenticalWithOneAndTwoAgentsPerKind) {
  const std::string dir = FreshDir();
  Agents ag;
  for (const char* kind : {"gpu", "gpu", "attacc", "attacc"}) ag.procs.push_back(StartAgent(dir, kind));
  const std::vector<std::string> base = {"run", kAttAccExample, "--quiet", "--set",
                                         "workload.window_end_s=300"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunServesim(a);
  };
  const Result in = with({"--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one = with({"--out", dir + "/one", "--agent", "attacc=" + ag.List(2, 3)});
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = with({"--out", dir + "/two", "--agent", "gpu=" + ag.List(0, 2), "--agent",
                           "attacc=" + ag.List(2, 4)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  ExpectSameOutputs(dir + "/in", dir + "/two");
  const std::string info = ReadFile(dir + "/two/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (attacc)")) << info;
}

// The figure `key` of run_info.json's "hints" object, or -1 if absent.
int64_t HintCount(const std::string& info, const std::string& key) {
  const size_t hints = info.find("\"hints\": {");
  if (hints == std::string::npos) return -1;
  const size_t at = info.find("\"" + key + "\": ", hints);
  if (at == std::string::npos) return -1;
  int64_t n = -1;
  const size_t from = at + key.size() + 4;
  const size_t end = info.find_first_of(",}", from);
  return absl::SimpleAtoi(info.substr(from, end - from), &n) ? n : -1;
}

// What the engines tell a remote AttAcc device (run_info.json's "hints"):
// a new projection exactly at each prefill step (a request joining is the
// one change the projections cannot see; leaving requests are projected),
// renewals as projections run out, and renewals made early to go in the
// same message as another replica's projection. An in-process run tells
// nothing and reports no hints.
TEST(AgentEndToEndTest, ProjectionsComeAtPrefillsAndRenewalsRideAlongOtherReplicas) {
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "attacc"));
  const std::vector<std::string> base = {"run", kAttAccExample, "--quiet", "--set",
                                         "workload.window_end_s=300"};
  std::vector<std::string> in = base, one = base;
  in.insert(in.end(), {"--out", dir + "/in"});
  one.insert(one.end(), {"--out", dir + "/one", "--agent", "attacc=" + ag.List(0, 1)});
  const Result r_in = RunServesim(in);
  ASSERT_EQ(r_in.code, 0) << r_in.out;
  const Result r_one = RunServesim(one);
  ASSERT_EQ(r_one.code, 0) << r_one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  EXPECT_EQ(HintCount(ReadFile(dir + "/in/run_info.json"), "projections"), -1);
  int64_t prefills = 0;
  std::istringstream rows(ReadFile(dir + "/one/iterations.csv"));
  std::string row;
  std::getline(rows, row);
  ASSERT_TRUE(absl::StartsWith(row, "replica,start_s,duration_s,batch_size,prefill_tokens,")) << row;
  while (std::getline(rows, row)) {
    const std::vector<std::string> f = absl::StrSplit(row, ',');
    ASSERT_GT(f.size(), 4u) << row;
    prefills += f[4] != "0" ? 1 : 0;
  }
  const std::string info = ReadFile(dir + "/one/run_info.json");
  ASSERT_GT(prefills, 100) << info;
  EXPECT_EQ(HintCount(info, "projections"), prefills) << info;
  EXPECT_GT(HintCount(info, "renewals"), 0) << info;
  EXPECT_GT(HintCount(info, "renewals_alongside"), 0) << info;
}

// The "measured_steps" list of run_info.json (one count per endpoint).
std::vector<int64_t> MeasuredSteps(const std::string& info) {
  std::vector<int64_t> out;
  const std::string key = "\"measured_steps\": [";
  const size_t at = info.find(key);
  if (at == std::string::npos) return out;
  const size_t end = info.find(']', at);
  for (absl::string_view v : absl::StrSplit(
           absl::string_view(info).substr(at + key.size(), end - at - key.size()), ", ")) {
    int64_t n = 0;
    if (absl::SimpleAtoi(v, &n)) out.push_back(n);
  }
  return out;
}

// A FULL-fidelity pool of `kind` in process, on one agent and spread over
// two: byte-identical outputs (the device's description included, in
// summary.json), with both agents measuring steps: each a share of the
// requests' steps, or with `layer_shares` each a share of every step.
void ExpectSpreadOverTwoAgentsIsByteIdentical(const std::string& kind, const std::string& spec,
                                              bool layer_shares = false) {
  const std::string dir = FreshDir();
  Agents ag;
  for (int i = 0; i < 3; ++i) ag.procs.push_back(StartAgent(dir, kind));
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 2 " +
                spec +
                " } }\n"
                "workload { saturated { num_requests: 4 input_tokens: 120 output_tokens: 6 } }\n");
  const Result in = RunServesim({"run", scenario, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/one", "--agent", kind + "=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/two", "--agent", kind + "=" + ag.List(1, 3)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  ExpectSameOutputs(dir + "/in", dir + "/two");
  EXPECT_TRUE(absl::StrContains(ReadFile(dir + "/in/summary.json"), "fraction\": "));
  const std::vector<int64_t> steps = MeasuredSteps(ReadFile(dir + "/two/run_info.json"));
  ASSERT_EQ(steps.size(), 2u) << ReadFile(dir + "/two/run_info.json");
  // 4 requests x 5 decode steps, each measured once or in two shares.
  if (layer_shares) {
    EXPECT_EQ(steps, (std::vector<int64_t>{20, 20}));
  } else {
    EXPECT_EQ(steps[0] + steps[1], 20);
    EXPECT_GT(steps[0], 0);
    EXPECT_GT(steps[1], 0);
  }
  EXPECT_EQ(MeasuredSteps(ReadFile(dir + "/one/run_info.json")), std::vector<int64_t>{0});
}

TEST(AgentEndToEndTest, FullTopickAndSpattenSpreadOverTwoAgentsAreByteIdentical) {
  ExpectSpreadOverTwoAgentsIsByteIdentical(
      "topick", "topick { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 } }",
      /*layer_shares=*/true);
  ExpectSpreadOverTwoAgentsIsByteIdentical(
      "spatten", "spatten { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 } }");
}

TEST(AgentEndToEndTest, WholeRequestsSpreadByTheWorkTheyHaveLeft) {
  // SpAtten measures each request whole on one agent, and a request's first
  // step there builds its state from its prompt: about 32 steady steps' time
  // per position per prompt token (the device's description). Four requests
  // arrive together: one of 900 + 3 tokens (2 decode steps, work 32 x 901 +
  // 901 + 902 = 30,635 positions) and three of 120 + 13 (12 steps each,
  // 32 x 121 + 121 + ... + 132 = 5,390). Weighed by the sum of L alone (1,803
  // against 1,518) the agents would measure 14 and 24 steps; with the first
  // step weighed too, the long prompt goes alone: 2 and 36.
  const std::string dir = FreshDir();
  Agents ag;
  for (int i = 0; i < 2; ++i) ag.procs.push_back(StartAgent(dir, "spatten"));
  WriteFile(dir + "/t.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.00,900,3\n"
            "2023-11-16 18:15:46.00,120,13\n"
            "2023-11-16 18:15:46.00,120,13\n"
            "2023-11-16 18:15:46.00,120,13\n");
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 2 spatten {\n"
            "  fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 } } } }\n"
            "workload { trace { path: \"t.csv\" } }\n");
  const Result in = RunServesim({"run", scenario, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result two = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/two", "--agent", "spatten=" + ag.List(0, 2)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/two");
  // The steps asked, each once, whatever the agents measured ahead meanwhile.
  const std::string info = ReadFile(dir + "/two/run_info.json");
  EXPECT_EQ(MeasuredSteps(info), (std::vector<int64_t>{2, 36}));
  EXPECT_TRUE(absl::StrContains(info, "\"ahead_rpcs\": ")) << info;
}

TEST(AgentEndToEndTest, FullCtaAndLadSpreadOverTwoAgentsAreByteIdentical) {
  ExpectSpreadOverTwoAgentsIsByteIdentical(
      "cta", "cta { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 256 } }",
      /*layer_shares=*/true);
  ExpectSpreadOverTwoAgentsIsByteIdentical(
      "lad", "lad { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 instances: 2 } }");
}

TEST(AgentEndToEndTest, CtaPoolOutputsAreByteIdenticalOnAnAgent) {
  // GPT-2 medium + one CTA unit in FULL fidelity: the agent binds the
  // scenario's spec and re-hashes each request's tokens itself.
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "cta"));
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool {\n"
            "  cta { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 256 } } units: 1 } }\n"
            "workload { saturated { num_requests: 3 input_tokens: 120 output_tokens: 8 } }\n");
  const Result in = RunServesim({"run", scenario, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/one", "--agent", "cta=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  const std::string info = ReadFile(dir + "/one/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (cta)")) << info;
}

TEST(AgentEndToEndTest, LadFullPoolKeepsItsStateInTheAgent) {
  // A FULL-fidelity LAD pool of 2 units on one agent: the per-request LAD
  // state (counters, modes, centres, caches A-F of every head) lives in the
  // agent's bound device between decode steps, and the outputs are the
  // in-process run's byte for byte.
  const std::string dir = FreshDir();
  const std::string sc = dir + "/lad.pbtxt";
  WriteFile(sc,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 2 lad {\n"
            "  fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 lengths: 256 instances: 2 }\n"
            "} } }\n"
            "workload { saturated { num_requests: 3 input_tokens: 150 output_tokens: 12 } }\n");
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "lad"));
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/one", "--agent", "lad=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  const std::string info = ReadFile(dir + "/one/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (lad)")) << info;
  EXPECT_TRUE(absl::StrContains(ReadFile(dir + "/one/summary.json"), "\"active_fraction\": "));
}

double SimulatedSeconds(const std::string& summary) {
  const std::string key = "\"simulated_time_s\": ";
  const size_t at = summary.find(key);
  double v = 0;
  if (at != std::string::npos) {
    (void)absl::SimpleAtod(summary.substr(at + key.size(), summary.find_first_of(",\n", at + key.size()) - at - key.size()), &v);
  }
  return v;
}

// Runs SmallGpuScenario in process into dir/in; sets *pace to the --pace
// that makes the same run take ~3 wall seconds (pacing never changes
// results), for tests that disturb an agent mid-run.
void InProcessBaseline(const std::string& dir, std::string* sc, std::string* pace) {
  *sc = SmallGpuScenario(dir);
  const Result in = RunServesim({"run", *sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const double simulated = SimulatedSeconds(ReadFile(dir + "/in/summary.json"));
  ASSERT_GT(simulated, 0);
  *pace = absl::StrCat(simulated / 3.0);
}

TEST(AgentEndToEndTest, KilledAgentFailsOverOrStopsWithPartialResults) {
  const std::string dir = FreshDir();
  std::string sc, pace;
  ASSERT_NO_FATAL_FAILURE(InProcessBaseline(dir, &sc, &pace));
  const double simulated = SimulatedSeconds(ReadFile(dir + "/in/summary.json"));
  // The agent is killed after 1 s.
  {
    Agents ag;
    ag.procs.push_back(StartAgent(dir, "gpu"));
    ag.procs.push_back(StartAgent(dir, "gpu"));
    auto run = std::async(std::launch::async, [&] {
      return RunServesim({"run", sc, "--quiet", "--out", dir + "/failover", "--pace", pace,
                          "--agent", "gpu=" + ag.List(0, 2)});
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    Stop(ag.procs[0], SIGKILL);
    const Result r = run.get();
    ASSERT_EQ(r.code, 0) << r.out;
    ExpectSameOutputs(dir + "/in", dir + "/failover");
    const std::string info = ReadFile(dir + "/failover/run_info.json");
    EXPECT_FALSE(absl::StrContains(info, "\"failovers\": 0,")) << info;
  }
  {
    Agents ag;
    ag.procs.push_back(StartAgent(dir, "gpu"));
    const std::string addr = ag.procs[0].address;
    auto run = std::async(std::launch::async, [&] {
      return RunServesim({"run", sc, "--quiet", "--out", dir + "/lost", "--pace", pace, "--agent",
                          "gpu=" + addr, "--agent-deadline", "2", "--agent-retry-s", "1"});
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    Stop(ag.procs[0], SIGKILL);
    const Result r = run.get();
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "xPU device (gpu)")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, addr)) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "no agent endpoint answered")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "Nothing accepts connections there")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "partial results")) << r.out;
    const std::string summary = ReadFile(dir + "/lost/summary.json");
    EXPECT_TRUE(absl::StartsWith(summary, "{\n  \"partial\": true,")) << summary;
    const double stopped_at = SimulatedSeconds(summary);
    EXPECT_GT(stopped_at, 0);
    EXPECT_LT(stopped_at, simulated);
    const std::string info = ReadFile(dir + "/lost/run_info.json");
    EXPECT_TRUE(absl::StrContains(info, "\"partial\": true")) << info;
    EXPECT_TRUE(absl::StrContains(info, addr)) << info;
    EXPECT_FALSE(absl::StrContains(ReadFile(dir + "/in/summary.json"), "partial"));
  }
}

TEST(AgentEndToEndTest, FullTopickSpreadOverTwoAgentsSurvivesLosingOne) {
  // The worker of two ToPick agents is killed mid-run: its layer share of
  // each step goes to the home instead, and the outputs stay the in-process
  // run's byte for byte.
  const std::string dir = FreshDir();
  const std::string sc = dir + "/s.pbtxt";
  WriteFile(sc,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 2 topick {\n"
            "  fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 } } } }\n"
            "workload { saturated { num_requests: 4 input_tokens: 120 output_tokens: 40 } }\n");
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const double simulated = SimulatedSeconds(ReadFile(dir + "/in/summary.json"));
  ASSERT_GT(simulated, 0);
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "topick"));
  ag.procs.push_back(StartAgent(dir, "topick"));
  auto run = std::async(std::launch::async, [&] {
    return RunServesim({"run", sc, "--quiet", "--out", dir + "/spread", "--pace",
                        absl::StrCat(simulated / 3.0), "--agent", "topick=" + ag.List(0, 2)});
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Stop(ag.procs[1], SIGKILL);
  const Result r = run.get();
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectSameOutputs(dir + "/in", dir + "/spread");
  const std::string info = ReadFile(dir + "/spread/run_info.json");
  EXPECT_FALSE(absl::StrContains(info, "\"failovers\": 0,")) << info;
  const std::vector<int64_t> steps = MeasuredSteps(info);
  ASSERT_EQ(steps.size(), 2u) << info;
  EXPECT_GT(steps[0], steps[1]);  // the home took the worker's shares once it was gone
}

TEST(AgentEndToEndTest, AgentTokenTlsAndGracefulShutdown) {
  const std::string dir = FreshDir();
  const std::string sc = SmallGpuScenario(dir);
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not found";
  ASSERT_TRUE(MakeCerts(dir));
  WriteFile(dir + "/token", "tok-123\n");
  WriteFile(dir + "/wrong", "tok-999\n");
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu", {"--tls-cert", dir + "/server.crt", "--tls-key",
                                              dir + "/server.key", "--tls-client-ca",
                                              dir + "/ca.crt", "--token-file", dir + "/token"}));
  const std::vector<std::string> tls = {"--agent-tls-ca", dir + "/ca.crt", "--agent-tls-cert",
                                        dir + "/client.crt", "--agent-tls-key",
                                        dir + "/client.key"};
  std::vector<std::string> args = {"run", sc, "--quiet", "--out", dir + "/tls", "--agent",
                                   "gpu=" + ag.procs[0].address, "--agent-token-file",
                                   dir + "/token"};
  args.insert(args.end(), tls.begin(), tls.end());
  const Result ok = RunServesim(args);
  ASSERT_EQ(ok.code, 0) << ok.out;
  ExpectSameOutputs(dir + "/in", dir + "/tls");
  args[8] = dir + "/wrong";
  args[4] = dir + "/wrong_out";
  const Result wrong = RunServesim(args);
  EXPECT_EQ(wrong.code, 1);
  EXPECT_TRUE(absl::StrContains(wrong.out, "wrong bearer token")) << wrong.out;
  // SIGTERM: a clean stop.
  const int status = Stop(ag.procs[0], SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(absl::StrContains(ReadFile(ag.procs[0].log), "stopped after")) << ReadFile(ag.procs[0].log);
}

TEST(AgentEndToEndTest, AgentCommandLineErrors) {
  auto run = [](const std::string& args) {
    Result r;
    FILE* pipe = popen((ShellQuote(SERVESIM_AGENT_BINARY) + " " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
    const int status = pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--tls-client-ca")) << r.out;
  r = run("--preset a100-80gb");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.out, "--device KIND is required")) << r.out;
  r = run("--device tpu");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(absl::StrContains(r.out, "unknown kind")) << r.out;
  r = run("--device gpu --preset nope");
  EXPECT_EQ(r.code, 1);
  r = run("--device gpu --listen 127.0.0.1:99999");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.out, "[0, 65535]")) << r.out;
  r = run("--device gpu --max-message-bytes 5");
  EXPECT_EQ(r.code, 2);
}

// ------------------------------------------------------ hostile clients ----

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

// A TCP connection to 127.0.0.1:port that sends nothing; -1 if refused.
int IdleConnection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the agent closed `fd` (EOF or reset) within `wait_ms`; what it
// sent before (gRPC's SETTINGS frame) is read and dropped.
bool ClosedByPeer(int fd, int wait_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, std::max<int>(0, static_cast<int>(left.count()))) <= 0) return false;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
}

TEST(AgentHardeningTest, ConnectionsPastTheCapAreClosedAndTheAgentServesAfterwards) {
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(
      StartAgent(dir, "gpu", {"--max-connections", "16", "--idle-connection-s", "1"}));
  const int port = PortOf(ag.procs[0].address);
  // 200 idle connections: the kernel completes every TCP handshake; the
  // agent keeps at most 16 and closes the rest at accept.
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    const int fd = IdleConnection(port);
    if (fd >= 0) fds.push_back(fd);
  }
  ASSERT_EQ(fds.size(), 200u);
  int closed_at_once = 0;
  for (int fd : fds) closed_at_once += ClosedByPeer(fd, 20) ? 1 : 0;
  EXPECT_GE(closed_at_once, 200 - 16 - 2) << "the agent kept more than --max-connections";
  // The ones it kept never send a byte: closed once idle for 1 s.
  int closed_later = 0;
  for (int fd : fds) closed_later += ClosedByPeer(fd, 3000) ? 1 : 0;
  EXPECT_EQ(closed_later, 200);
  for (int fd : fds) ::close(fd);
  // The agent accepts and serves as before.
  auto remote = RemoteDevice::Create(GpuSpec(), {ag.procs[0].address}, FastClient(), "gpu");
  ASSERT_TRUE(remote.ok());
  EXPECT_TRUE((*remote)->DescribeOrError().ok());
  SampleOps s;
  std::vector<Cost> c(s.ops.size());
  EXPECT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(c)).ok());
  EXPECT_EQ(Stop(ag.procs[0], SIGTERM), 0);
  EXPECT_TRUE(absl::StrContains(ReadFile(ag.procs[0].log),
                                "connections refused over "
                                "--max-connections"))
      << ReadFile(ag.procs[0].log);
}

TEST(AgentHardeningTest, ASecondAgentOnAPortInUseIsRefused) {
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu"));
  const test_util::CommandResult second = test_util::RunCommand(absl::StrCat(
      ShellQuote(SERVESIM_AGENT_BINARY), " --device gpu --listen ", ag.procs[0].address));
  EXPECT_EQ(second.code, 1) << second.out;
  EXPECT_TRUE(absl::StrContains(second.out, "cannot listen there")) << second.out;
  // The first agent still answers every call.
  auto remote = RemoteDevice::Create(GpuSpec(), {ag.procs[0].address}, FastClient(), "gpu");
  ASSERT_TRUE(remote.ok());
  for (int i = 0; i < 8; ++i) EXPECT_TRUE((*remote)->DescribeOrError().ok());
}

TEST(AgentHardeningTest, AgentRestartedWithinTheRetryBudgetIsPickedUp) {
  const std::string dir = FreshDir();
  std::string sc, pace;
  ASSERT_NO_FATAL_FAILURE(InProcessBaseline(dir, &sc, &pace));
  // The agent is down from 1 s to 3.5 s, within the default
  // --agent-retry-s (10).
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu"));
  const std::string addr = ag.procs[0].address;
  auto run = std::async(std::launch::async, [&] {
    return RunServesim({"run", sc, "--quiet", "--out", dir + "/restarted", "--pace", pace,
                        "--agent", "gpu=" + addr});
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Stop(ag.procs[0], SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ag.procs.push_back(StartAgent(dir, "gpu", {"--listen", addr}));
  const Result r = run.get();
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectSameOutputs(dir + "/in", dir + "/restarted");
  const std::string info = ReadFile(dir + "/restarted/run_info.json");
  EXPECT_FALSE(absl::StrContains(info, "\"retries\": 0,")) << info;
}

TEST(AgentHardeningTest, BlankTokensAreRefusedWhereverTheyComeFrom) {
  const std::string dir = FreshDir();
  auto agent = [](const std::string& env, const std::string& args) {
    return test_util::RunCommand(env + " " + ShellQuote(SERVESIM_AGENT_BINARY) +
                                 " --device gpu --listen 127.0.0.1:0 " + args);
  };
  test_util::CommandResult r = agent("SERVESIM_AGENT_TOKEN=", "");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "SERVESIM_AGENT_TOKEN: the token is empty")) << r.out;
  r = agent("SERVESIM_AGENT_TOKEN='  '", "");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "a space at position 1")) << r.out;
  WriteFile(dir + "/blank", "   \nsecond-line\n");
  r = agent("", "--token-file " + dir + "/blank");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, dir + "/blank (first line)")) << r.out;
  WriteFile(dir + "/empty", "\n");
  r = agent("", "--token-file " + dir + "/empty");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "the token is empty")) << r.out;
  // The client's token file too.
  const std::string sc = SmallGpuScenario(dir);
  const Result c = RunServesim({"run", sc, "--quiet", "--out", dir + "/out", "--agent",
                                "gpu=127.0.0.1:1", "--agent-token-file", dir + "/blank"});
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_TRUE(absl::StrContains(c.out, "--agent-token-file " + dir + "/blank (first line)"))
      << c.out;
  // A CRLF file's token is its line without the CR.
  WriteFile(dir + "/crlf", "tok-1\r\n");
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu", {"--token-file", dir + "/crlf"}));
  ClientOptions o = FastClient();
  o.token = "tok-1";
  auto remote = RemoteDevice::Create(GpuSpec(), {ag.procs[0].address}, o, "gpu");
  ASSERT_TRUE(remote.ok());
  EXPECT_TRUE((*remote)->DescribeOrError().ok());
}

TEST(AgentHardeningTest, ServingOtherHostsWithoutTlsOrTokenWarns) {
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu", {"--listen", "0.0.0.0:0"}));
  const std::string log = ReadFile(ag.procs[0].log);
  EXPECT_TRUE(absl::StrContains(log, "warning: serving 0.0.0.0 without TLS or a token")) << log;
  Agents quiet;
  quiet.procs.push_back(StartAgent(dir, "gpu"));
  EXPECT_FALSE(absl::StrContains(ReadFile(quiet.procs[0].log), "warning"));
}

}  // namespace
}  // namespace servesim::agents
