// Prefill/decode disaggregation end to end (the servesim binary: SimGrid
// allows one engine per process): the same scenario and seed give the same
// outputs, engines running ahead give the run of an event per step, routing
// by prefix and early rejection, and bad pools are refused at load. KV
// transfers are kv_transfer_test.cc, the fabric they cross fabric_test.cc.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/cluster/disaggregation_util.h"
#include "tests/test_util.h"

namespace servesim::disaggregation_test {
namespace {

TEST(DisaggregationTest, SameScenarioAndSeedGiveIdenticalOutputs) {
  const std::string text =
      absl::StrCat(Scenario(2, 1, "KV_TRANSFER_POLICY_LAYERWISE"), "seed: 3\n");
  std::string a, b;
  // Poisson arrivals over a few pools' worth of work.
  const std::string poisson = absl::StrReplaceAll(
      text, {{"saturated { num_requests: 1 input_tokens: 1000 output_tokens: 8 }",
              "poisson { rate_rps: 20 } num_requests: 300 lengths { fixed { input_tokens: 700 "
              "output_tokens: 40 } }"}});
  const auto rows_a = RunScenario(poisson, &a);
  const auto rows_b = RunScenario(poisson, &b);
  ASSERT_EQ(rows_a.size(), 300u);
  EXPECT_EQ(ReadFile(a + "/requests.csv"), ReadFile(b + "/requests.csv"));
  EXPECT_EQ(ReadFile(a + "/iterations.csv"), ReadFile(b + "/iterations.csv"));
  for (const auto& row : rows_a) {
    ASSERT_EQ(row.at("status"), "done");
    // The parts of TTFT add up, each non-negative.
    const double arrival = Num(row, "arrival_s"), prefill = Num(row, "prefill_end_s"),
                 ready = Num(row, "kv_ready_s"), first = Num(row, "first_token_s");
    EXPECT_LE(arrival, prefill);
    EXPECT_LT(prefill, ready);
    EXPECT_LT(ready, first);
    EXPECT_EQ(row.at("replica"), "2");  // the decode pool's only replica
  }
}

// Engines that run ahead between SimGrid events (decode engines up to the
// next KV part on its way to them or the next prefill step that may route
// a request) give the same run as a SimGrid event per step, which --pace
// forces (here so fast that it never waits). 800 Azure conversations at 8x
// their rate over 3 + 3 replicas: parts to one decode replica are in
// flight while the others run ahead.
TEST(DisaggregationTest, RunningAheadGivesTheRunOfAnEventPerStep) {
  const std::string text = absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  internode { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 }
  disaggregation {
    prefill { cluster { replicas: 3 } }
    decode { cluster { replicas: 3 } }
    kv_transfer: KV_TRANSFER_POLICY_LAYERWISE
  }
}
workload {
  trace { path: ")",
                                        SERVESIM_SOURCE_DIR,
                                        R"(/examples/traces/AzureLLMInferenceTrace_conv.csv" }
  max_requests: 800
  rate_scale: 8
}
scheduler { batching: BATCHING_POLICY_VLLM_V1 }
output { timeline: true }
seed: 5
)");
  const std::string dir = FreshDir("disagg_ahead");
  WriteFile(dir + "/s.pbtxt", text);
  const auto ahead = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/ahead"});
  ASSERT_EQ(ahead.code, 0) << ahead.out;
  const auto stepped =
      RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/stepped", "--pace", "1e12"});
  ASSERT_EQ(stepped.code, 0) << stepped.out;
  ASSERT_EQ(Requests(dir + "/ahead").size(), 800u);
  for (const char* f : {"/requests.csv", "/iterations.csv", "/summary.json", "/timeline.json"}) {
    EXPECT_EQ(ReadFile(dir + "/ahead" + f), ReadFile(dir + "/stepped" + f)) << f;
  }
  // The decode engines advanced lazily: they waited in SimGrid only for
  // the end (the receivers' waits for KV parts and the prefill engines'
  // steps are the rest), far fewer times than a step each.
  const double ahead_waits = std::stod(JsonFileValue(dir + "/ahead/run_info.json", "engine_waits"));
  const double stepped_waits =
      std::stod(JsonFileValue(dir + "/stepped/run_info.json", "engine_waits"));
  const double steps = std::stod(SummaryValue(dir + "/ahead", "iterations"));
  EXPECT_GE(stepped_waits, steps);
  EXPECT_LT(ahead_waits, stepped_waits - steps / 2);
}

// Cache-aware routing: 30 prompts in 3 prefix groups (2048 shared tokens
// each) over 2 colocated replicas, one a second. Round robin sends every
// group to both replicas (6 first misses); prefix affinity keeps each group
// where its prefix is cached (3). A repeat hits 2048 tokens (128 blocks).
TEST(PrefixAffinityRoutingTest, KeepsEachPrefixGroupWhereItIsCached) {
  const std::string dir = FreshDir("affinity");
  std::string trace = "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n";
  for (int i = 0; i < 30; ++i) absl::StrAppend(&trace, i, ",2100,4,", i % 3, ",2048\n");
  WriteFile(dir + "/trace.csv", trace);
  auto hit_tokens = [&](const std::string& routing) {
    WriteFile(dir + "/s.pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster { replicas: 2 xpu { preset: "a100-80gb" } }
workload { trace { path: "trace.csv" } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 routing: )",
                                             routing, R"( }
)"));
    const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/" + routing});
    EXPECT_EQ(r.code, 0) << r.out;
    const std::string summary = ReadFile(dir + "/" + routing + "/summary.json");
    const size_t at = summary.find("\"prefix_cache_hit_tokens\": ");
    int64_t hits = -1;
    if (at != std::string::npos) {
      const size_t start = at + std::string("\"prefix_cache_hit_tokens\": ").size();
      EXPECT_TRUE(absl::SimpleAtoi(summary.substr(start, summary.find(',', start) - start), &hits));
    }
    return hits;
  };
  EXPECT_EQ(hit_tokens("ROUTING_POLICY_ROUND_ROBIN"), 24 * 2048);
  EXPECT_EQ(hit_tokens("ROUTING_POLICY_PREFIX_AFFINITY"), 27 * 2048);
}

// SLO-aware early rejection: 16 prompts of 2000 tokens at once on one
// replica, TTFT SLO 0.4 s. The prediction (the prefill of every prompt
// queued ahead, in lone token-budget steps) grows with the queue, so the
// first few are kept and the rest refused; each refused one misses the SLO
// when everything is queued (the prediction is a lower bound).
TEST(EarlyRejectionTest, RefusesOnlyRequestsSureToMissTheTtftSlo) {
  const std::string dir = FreshDir("late");
  auto run = [&](const std::string& admission) {
    WriteFile(dir + "/s.pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster { xpu { preset: "a100-80gb" } }
workload { saturated { num_requests: 16 input_tokens: 2000 output_tokens: 4 } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 admission: )",
                                             admission, R"( }
slo { ttft_s: 0.4 tpot_s: 1 }
)"));
    const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/" + admission});
    EXPECT_EQ(r.code, 0) << r.out;
    return Requests(dir + "/" + admission);
  };
  const auto all = run("ADMISSION_POLICY_ACCEPT_ALL");
  const auto late = run("ADMISSION_POLICY_REJECT_LATE");
  ASSERT_EQ(all.size(), 16u);
  ASSERT_EQ(late.size(), 16u);
  int kept = 0;
  for (const auto& row : late) {
    if (row.at("status") == "done") {
      EXPECT_EQ(std::stoi(row.at("id")), kept) << "kept requests come first";
      ++kept;
    } else {
      EXPECT_EQ(row.at("status"), "rejected_late");
      const auto& queued = all[static_cast<size_t>(std::stoi(row.at("id")))];
      EXPECT_GT(Num(queued, "ttft_s"), 0.4) << "refused but would have met the SLO";
    }
  }
  // By hand: all 16 arrive at once, so request k's prediction is the
  // prefill of the 2000 (k + 1) tokens queued up to it, in steps of the
  // 2048-token budget. Such a step takes 0.127 s (iterations.csv: 2045-2048
  // prompt tokens in 0.1270-0.1271 s; a lone 2048-token prompt, as the
  // prediction costs it, up to ~3% more). Request 2: 6000 tokens, 2.93
  // steps, 0.37-0.39 s, kept; request 3: 8000 tokens, 3.9 steps, ~0.50 s,
  // refused. Accepting all, the first three meet the SLO and no other does.
  EXPECT_EQ(kept, 3);
  EXPECT_LT(Num(all[2], "ttft_s"), 0.4);
  EXPECT_GT(Num(all[3], "ttft_s"), 0.4);
  const std::string summary = ReadFile(dir + "/ADMISSION_POLICY_REJECT_LATE/summary.json");
  EXPECT_TRUE(
      absl::StrContains(summary, absl::StrCat("\"requests_rejected_late\": ", 16 - kept, ",")))
      << summary;
}

// Pools of different machines cannot share a node.
TEST(DisaggregationTest, PoolsOfDifferentXpusCannotShareANode) {
  const std::string text = absl::StrReplaceAll(
      Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE", "", "share_nodes: true"),
      {{"decode { cluster { replicas: 1 } }",
        "decode { cluster { replicas: 1 xpu { preset: \"h100-sxm-80gb\" } } }"}});
  const auto r = Validate(text);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out,
                                "s.pbtxt:11: cluster.disaggregation.share_nodes = true: the "
                                "pools' xPUs differ (a100-80gb and h100-sxm-80gb)"))
      << r.out;
}

TEST(DisaggregationTest, APoolThatCannotHoldTheModelNamesItsField) {
  const std::string text =
      absl::StrReplaceAll(Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE"),
                          {{"llama3.1-8b", "llama3.1-70b"},
                           {"decode { cluster { replicas: 1 } }",
                            "decode { cluster { replicas: 1 tensor_parallel: 8 } }"}});
  const auto r = Validate(text);
  EXPECT_NE(r.code, 0);
  // The prefill pool keeps the scenario's one A100: 141 GB of weights.
  EXPECT_TRUE(absl::StrContains(r.out,
                                "s.pbtxt:8: the prefill pool "
                                "(cluster.disaggregation.prefill): Llama-3.1-70B does "
                                "not fit a replica of 1 x a100-80gb"))
      << r.out;
}

TEST(DisaggregationTest, PoolsDoNotNest) {
  const std::string text =
      absl::StrReplaceAll(Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE"),
                          {{"decode { cluster { replicas: 1 } }",
                            "decode { cluster { replicas: 1 disaggregation { } } }"}});
  const auto r = Validate(text);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(
      r.out, "cluster.disaggregation.decode.cluster.disaggregation is set: pools do not nest"))
      << r.out;
}

// Prompts are hashed once for both pools' prefix caches: their blocks
// must be one size.
TEST(DisaggregationTest, PoolsThatBothCachePrefixesShareABlockSize) {
  const std::string text = absl::StrReplaceAll(
      Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE"),
      {{"decode { cluster { replicas: 1 } }",
        "decode { cluster { replicas: 1 } scheduler { kv_block_tokens: 32 } }"}});
  const auto r = Validate(text);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(
      absl::StrContains(r.out,
                        "s.pbtxt:9: cluster.disaggregation.decode.scheduler.kv_block_tokens = 32: "
                        "both pools cache prefixes, so their blocks must be the prefill "
                        "pool's size, 16"))
      << r.out;
}

}  // namespace
}  // namespace servesim::disaggregation_test
