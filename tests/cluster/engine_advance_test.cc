// How replica engines advance: lazily, brought forward in plain calls by
// whoever reads them (cluster/engine.h, Engine::AdvanceTo), against a
// SimGrid event per step, which --pace forces (here so fast that it never
// waits), as does a client limit that never binds (workload.max_in_flight).
// All give the same run, byte for byte, on colocated clusters of
// every batching policy, routing policy and parallel layout that runs
// lazily; the lazy run waits in SimGrid only for requests landing.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;

// The number after "key": in a JSON text of one object per line.
int64_t JsonInt(const std::string& json, const std::string& key) {
  const std::string tag = "\"" + key + "\": ";
  const size_t at = json.find(tag);
  EXPECT_NE(at, std::string::npos) << key << " in " << json;
  if (at == std::string::npos) return -1;
  const size_t from = at + tag.size();
  int64_t v = -1;
  EXPECT_TRUE(absl::SimpleAtoi(json.substr(from, json.find_first_of(",\n}", from) - from), &v))
      << key;
  return v;
}

struct Case {
  const char* name;
  std::string scenario;  // a path, or the scenario's text (written to s.pbtxt)
  std::vector<std::string> sets;
  int64_t requests;  // in requests.csv
  int64_t replicas;  // engines
  // The most SimGrid waits the lazy run may take; -1: one per request
  // landing, one per end-of-stream message and one per replica's last step.
  int64_t max_lazy_waits = -1;
};

// A trace of bursts: 8 groups of 12 requests sharing an arrival time and a
// prompt length, so that they cross each link together and land on a
// replica 4 at a time, in one instant.
std::string BurstTrace() {
  std::string t = "arrival_s,input_tokens,output_tokens\n";
  for (int g = 0; g < 8; ++g) {
    for (int i = 0; i < 12; ++i) {
      absl::StrAppend(&t, 0.7 * g, ",", 200 + 37 * g, ",", 20 + 13 * ((i + g) % 7), "\n");
    }
  }
  return t;
}

std::vector<Case> Cases() {
  const std::string ex = SERVESIM_SOURCE_DIR "/examples/";
  return {
      // PREFILL_FIRST, least-outstanding routing, a sampled timeline.
      {"GpuOnlyPrefillFirst",
       ex + "gpt3_175b_dgx_azure_conv.pbtxt",
       {"workload.window_end_s=240", "workload.rate_scale=3", "output.timeline=true",
        "output.timeline_every=7"},
       -1,
       4},
      // vLLM V1 chunked prefill, prefix caching with host DRAM and SSD tiers
      // (blocking loads), prefix-affinity routing: the router reads every
      // replica's cache as of the arrival.
      {"PrefixAffinityOverKvTiers",
       ex + "llama3.1_70b_kv_tiers_dgx_h100_mooncake.pbtxt",
       {"workload.max_requests=160", "workload.rate_scale=1"},
       160,
       2},
      // MoE data-parallel ranks stepping in lockstep, SLO-aware early
      // rejection at arrival.
      {"DataParallelMoeRejectLate",
       ex + "qwen3_30b_a3b_dp2_ep2.pbtxt",
       {"workload.num_requests=300", "workload.poisson.rate_rps=25",
        "scheduler.admission=ADMISSION_POLICY_REJECT_LATE", "slo.ttft_s=0.5"},
       300,
       1},
      // Bursts of simultaneous arrivals, round robin, SLO-capped batches.
      {"BurstsRoundRobinSloCap",
       R"(
model { preset: "llama3.1-8b" }
cluster { replicas: 3 xpu { preset: "a100-80gb" } }
workload { trace { path: "burst.csv" } }
scheduler { routing: ROUTING_POLICY_ROUND_ROBIN max_batch_size: 16 }
slo { ttft_s: 2 tpot_s: 0.05 tbt_s: 0.02 }
seed: 3
)",
       {},
       96,
       3,
       // Requests landing together wake their replica once: a burst,
       // each replica's end of stream and last step.
       8 * 3 + 3 + 3},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class EngineAdvanceTest : public testing::TestWithParam<Case> {};

TEST_P(EngineAdvanceTest, LazyEnginesGiveTheRunOfAnEventPerStep) {
  const Case& c = GetParam();
  const std::string dir = FreshDir(c.name);
  std::string scenario = c.scenario;
  if (scenario.find('{') != std::string::npos) {
    WriteFile(dir + "/burst.csv", BurstTrace());
    WriteFile(dir + "/s.pbtxt", scenario);
    scenario = dir + "/s.pbtxt";
  }
  auto run = [&](const std::string& out, bool paced, bool limited = false) {
    std::vector<std::string> args = {"run", scenario, "--quiet", "--out", dir + "/" + out};
    if (limited) {
      // A client limit no run reaches: the engines step in SimGrid time
      // (cluster/run_state.h, max_in_flight), with the same result.
      args.insert(args.end(), {"--set", "workload.max_in_flight=10000000"});
    }
    for (const std::string& s : c.sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    if (paced) {
      args.push_back("--pace");
      args.push_back("1e12");
    }
    const auto r = RunServesim(args);
    EXPECT_EQ(r.code, 0) << r.out;
  };
  run("lazy", false);
  run("paced", true);
  run("limited", false, true);
  const int64_t requests =
      static_cast<int64_t>(Lines(ReadFile(dir + "/lazy/requests.csv")).size()) - 1;
  if (c.requests >= 0) {
    EXPECT_EQ(requests, c.requests);
  }
  for (const char* f : {"/summary.json", "/requests.csv", "/iterations.csv", "/timeline.json"}) {
    const std::string lazy = ReadFile(dir + "/lazy" + f);
    EXPECT_FALSE(lazy.empty()) << f;
    EXPECT_EQ(lazy, ReadFile(dir + "/paced" + f)) << f;
    EXPECT_EQ(lazy, ReadFile(dir + "/limited" + f)) << f;
  }
  // The lazy engines wait for requests landing (several at once count
  // once), their end-of-stream message and, last, the end of their last
  // step; the paced ones once per step at least.
  const int64_t iterations = JsonInt(ReadFile(dir + "/lazy/summary.json"), "iterations");
  const int64_t lazy_waits = JsonInt(ReadFile(dir + "/lazy/run_info.json"), "engine_waits");
  const int64_t paced_waits = JsonInt(ReadFile(dir + "/paced/run_info.json"), "engine_waits");
  EXPECT_GT(iterations, 3 * requests);
  EXPECT_GT(lazy_waits, 0);
  EXPECT_LE(lazy_waits, c.max_lazy_waits >= 0 ? c.max_lazy_waits : requests + 2 * c.replicas);
  EXPECT_GE(paced_waits, iterations);
}

INSTANTIATE_TEST_SUITE_P(Colocated, EngineAdvanceTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace servesim
