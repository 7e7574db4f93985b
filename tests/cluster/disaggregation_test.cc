// Prefill/decode disaggregation end to end (the servesim binary: SimGrid
// allows one engine per process): KV transfers over the platform equal the
// link math by hand, flows sharing a link share its bandwidth, TTFT splits
// into its parts, and bad pools are refused at load.
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
#include "tests/test_util.h"

namespace servesim {
namespace {

using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;

// Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2
// bytes = 131,072 bytes of KV per token; a 1000-token prompt's KV is
// 131,072,000 bytes. Every xPU has a 10 GB/s NIC with 10 us of latency.
constexpr double kPromptKvBytes = 131072000.0;
constexpr double kNicBw = 1e10;
constexpr double kNicLatency = 1e-5;

std::string Scenario(int prefill_replicas, int requests, const std::string& policy,
                     const std::string& extra_cluster = "", const std::string& fabric = "") {
  return absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  internode { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 }
  )",
                      extra_cluster, R"(
  disaggregation {
    prefill { cluster { replicas: )",
                      prefill_replicas, R"( } }
    decode { cluster { replicas: 1 } }
    kv_transfer: )",
                      policy, R"(
    )",
                      fabric, R"(
  }
}
workload { saturated { num_requests: )",
                      requests, R"( input_tokens: 1000 output_tokens: 8 } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 }
)");
}

// requests.csv's rows as column name -> value.
std::vector<std::map<std::string, std::string>> Requests(const std::string& dir) {
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/requests.csv"));
  std::vector<std::map<std::string, std::string>> rows;
  if (lines.empty()) return rows;
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    EXPECT_EQ(cells.size(), header.size()) << lines[i];
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < header.size() && c < cells.size(); ++c) row[header[c]] = cells[c];
    rows.push_back(std::move(row));
  }
  return rows;
}

double Num(const std::map<std::string, std::string>& row, const std::string& key) {
  double v = std::nan("");
  auto it = row.find(key);
  EXPECT_TRUE(it != row.end() && absl::SimpleAtod(it->second, &v)) << key;
  return v;
}

// Runs `text`; its requests.csv rows.
std::vector<std::map<std::string, std::string>> RunScenario(const std::string& text,
                                                            std::string* out_dir = nullptr) {
  const std::string dir = FreshDir("disagg");
  WriteFile(dir + "/s.pbtxt", text);
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  if (out_dir != nullptr) *out_dir = dir + "/out";
  return Requests(dir + "/out");
}

// requests.csv stamps times to the microsecond.
constexpr double kCsvResolution = 2e-6;

TEST(DisaggregationTest, KvTransferOverOnePathIsTheLinkMath) {
  const auto rows = RunScenario(Scenario(1, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL"));
  ASSERT_EQ(rows.size(), 1u);
  // Prefill NIC then decode NIC: two latencies, then the bytes at the
  // bottleneck's rate (both 10 GB/s).
  const double expected = 2 * kNicLatency + kPromptKvBytes / kNicBw;  // 13.1272 ms
  EXPECT_NEAR(Num(rows[0], "kv_ready_s") - Num(rows[0], "prefill_end_s"), expected, kCsvResolution);
  EXPECT_EQ(rows[0].at("prefill_replica"), "0");
  EXPECT_EQ(rows[0].at("replica"), "1");  // the decode pool's replica
  EXPECT_EQ(rows[0].at("status"), "done");
}

TEST(DisaggregationTest, TwoTransfersSharingTheDecodeNicEachTakeTwiceAsLong) {
  // Two prefill replicas finish identical prompts at the same time and
  // send to the one decode replica: its NIC is shared fairly.
  const auto rows = RunScenario(Scenario(2, 2, "KV_TRANSFER_POLICY_AFTER_PREFILL"));
  ASSERT_EQ(rows.size(), 2u);
  const double expected = 2 * kNicLatency + 2 * kPromptKvBytes / kNicBw;  // 26.2344 ms
  for (const auto& row : rows) {
    EXPECT_NEAR(Num(row, "kv_ready_s") - Num(row, "prefill_end_s"), expected, kCsvResolution);
  }
  EXPECT_NE(rows[0].at("prefill_replica"), rows[1].at("prefill_replica"));
  EXPECT_EQ(Num(rows[0], "prefill_end_s"), Num(rows[1], "prefill_end_s"));
}

TEST(DisaggregationTest, LayerwiseTransferExposesOnlyTheLastLayer) {
  // The first 31 layers' KV (127 MB, 12.7 ms at 10 GB/s) streams while the
  // 62 ms prefill runs; the last layer's 4.096 MB follows its end.
  std::string dir;
  const auto rows = RunScenario(Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE"), &dir);
  ASSERT_EQ(rows.size(), 1u);
  const double prefill_s = Num(rows[0], "prefill_end_s") - Num(rows[0], "arrival_s");
  ASSERT_GT(prefill_s, 2 * kNicLatency + kPromptKvBytes * 31 / 32 / kNicBw);
  const double expected = 2 * kNicLatency + kPromptKvBytes / 32 / kNicBw;  // 0.4296 ms
  EXPECT_NEAR(Num(rows[0], "kv_ready_s") - Num(rows[0], "prefill_end_s"), expected, kCsvResolution);
  // TTFT = prefill + exposed transfer + the decode replica's first step.
  const double ttft = Num(rows[0], "ttft_s");
  EXPECT_GT(Num(rows[0], "first_token_s"), Num(rows[0], "kv_ready_s"));
  const std::string summary = ReadFile(dir + "/summary.json");
  EXPECT_TRUE(absl::StrContains(summary, "\"handoffs\": 1,")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "\"kv_transfer_bytes\": 131072000,")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "\"kv_transfer_policy\": \"layerwise\"")) << summary;
  // Both NICs carried the whole KV once.
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"r0.nic\", \"bytes\": 131072000,"))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"r1.nic\", \"bytes\": 131072000,"))
      << summary;
  EXPECT_GT(ttft, prefill_s + expected);
}

TEST(DisaggregationTest, CrossRackTransferIsBoundByTheOversubscribedUplink) {
  // One xPU per node, one node per rack: the prefill replica in rack 0,
  // the decode replica in rack 1. Each rack's uplink carries its NICs'
  // 10 GB/s / 4 = 2.5 GB/s, and the spine adds 1 us.
  const auto rows = RunScenario(
      Scenario(1, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL", "xpus_per_node: 1",
               "fabric { nodes_per_rack: 1 oversubscription: 4 spine_latency_s: 1e-6 }"));
  ASSERT_EQ(rows.size(), 1u);
  const double expected = 2 * kNicLatency + 1e-6 + kPromptKvBytes / 2.5e9;  // 52.4498 ms
  EXPECT_NEAR(Num(rows[0], "kv_ready_s") - Num(rows[0], "prefill_end_s"), expected, kCsvResolution);
}

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
  EXPECT_GE(kept, 1);
  EXPECT_LT(kept, 16);
  const std::string summary = ReadFile(dir + "/ADMISSION_POLICY_REJECT_LATE/summary.json");
  EXPECT_TRUE(
      absl::StrContains(summary, absl::StrCat("\"requests_rejected_late\": ", 16 - kept, ",")))
      << summary;
}

// Loads `text` with `servesim validate`; its output.
test_util::CommandResult Validate(const std::string& text) {
  const std::string dir = FreshDir("disagg_bad");
  WriteFile(dir + "/s.pbtxt", text);
  return RunServesim({"validate", dir + "/s.pbtxt"});
}

TEST(DisaggregationTest, ANicWithoutBandwidthIsRefusedAtLoad) {
  const std::string text = absl::StrReplaceAll(
      Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE"),
      {{"decode { cluster { replicas: 1 } }",
        "decode { cluster { replicas: 1 internode { bandwidth_bytes_per_s: 0 } } }"}});
  const auto r = Validate(text);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out,
                                "s.pbtxt:9: cluster.disaggregation.decode.cluster."
                                "internode.bandwidth_bytes_per_s = 0"))
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

TEST(DisaggregationTest, FabricOutOfRangeNamesTheField) {
  const auto r = Validate(
      Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE", "", "fabric { oversubscription: 0.5 }"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(
      r.out, "cluster.disaggregation.fabric.oversubscription = 0.5: allowed range [1, 64]"))
      << r.out;
}

}  // namespace
}  // namespace servesim
