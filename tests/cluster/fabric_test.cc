// The fabric between replicas end to end (cluster/platform.h,
// cluster/fabric_flows.h): racks and pods behind oversubscribed uplinks,
// links.csv, collectives and a cluster store's loads as flows sharing links
// with KV, platform files, and a fabric's bad figures refused at load.
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

// Three-tier fat tree: one xPU per node, one node per rack. Racks 0 and 1
// share a pod (two racks per pod): the route stays below the core, at the
// NICs' 10 GB/s. In pods of one rack each, it crosses the core over pod
// uplinks of 10 GB/s / 8 = 1.25 GB/s, and the core adds 2 us.
TEST(DisaggregationTest, FatTreeRoutesClimbToTheCoreOnlyBetweenPods) {
  const std::string fabric =
      "fabric { nodes_per_rack: 1 spine_latency_s: 1e-6 pod_oversubscription: 8 "
      "core_latency_s: 2e-6 racks_per_pod: ";
  const auto same_pod = RunScenario(
      Scenario(1, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL", "xpus_per_node: 1", fabric + "2 }"));
  ASSERT_EQ(same_pod.size(), 1u);
  EXPECT_NEAR(Num(same_pod[0], "kv_ready_s") - Num(same_pod[0], "prefill_end_s"),
              2 * kNicLatency + 1e-6 + kPromptKvBytes / kNicBw,  // 13.1282 ms
              kCsvResolution);
  std::string dir;
  const auto across = RunScenario(
      Scenario(1, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL", "xpus_per_node: 1", fabric + "1 }"), &dir);
  ASSERT_EQ(across.size(), 1u);
  EXPECT_NEAR(Num(across[0], "kv_ready_s") - Num(across[0], "prefill_end_s"),
              2 * kNicLatency + 1e-6 + 2e-6 + kPromptKvBytes / 1.25e9,  // 104.8806 ms
              kCsvResolution);
  // Pod 0's uplink carried the KV up, pod 1's down.
  const std::string summary = ReadFile(dir + "/summary.json");
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"pod0.uplink\", \"bytes\": 131072000,"))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"pod1.uplink\", \"bytes\": 131072000,"))
      << summary;
}

// links.csv as column name -> the column's values, one per bin.
std::map<std::string, std::vector<double>> LinkColumns(const std::string& dir) {
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/links.csv"));
  std::map<std::string, std::vector<double>> cols;
  if (lines.empty()) return cols;
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    EXPECT_EQ(cells.size(), header.size()) << lines[i];
    for (size_t c = 0; c < header.size() && c < cells.size(); ++c) {
      double v = std::nan("");
      EXPECT_TRUE(absl::SimpleAtod(cells[c], &v)) << lines[i];
      cols[header[c]].push_back(v);
    }
  }
  return cols;
}

// Link utilisation over time: bins of 1 ms. Two prefill replicas send a
// 131,072,000-byte KV each at the same moment into the one decode NIC;
// each flow takes 26.2344 ms, so every bin wholly inside them reads
// 2 x 131,072,000 / 26.2344 ms / 10 GB/s = 0.999238 into the decode NIC
// and half that out of each prefill NIC, none the other way (the NICs are
// full duplex), and each column's bins add up to its bytes.
TEST(DisaggregationTest, LinksCsvHoldsEachLinksUtilisationOverTime) {
  std::string dir;
  const auto rows = RunScenario(absl::StrCat(Scenario(2, 2, "KV_TRANSFER_POLICY_AFTER_PREFILL"),
                                             "output { link_bin_s: 1e-3 }\n"),
                                &dir);
  ASSERT_EQ(rows.size(), 2u);
  const double start = Num(rows[0], "prefill_end_s"), end = Num(rows[0], "kv_ready_s");
  const auto cols = LinkColumns(dir);
  ASSERT_EQ(cols.size(), 7u) << ReadFile(dir + "/links.csv");  // time_s, r0..r2.nic up, down
  const std::vector<double>& t = cols.at("time_s");
  const double rate =
      2 * kPromptKvBytes / (2 * kNicLatency + 2 * kPromptKvBytes / kNicBw) / kNicBw;  // 0.999238
  ASSERT_NEAR(end - start, 2 * kNicLatency + 2 * kPromptKvBytes / kNicBw, kCsvResolution);
  int inside = 0;
  for (size_t k = 0; k < t.size(); ++k) {
    EXPECT_NEAR(t[k], 1e-3 * static_cast<double>(k), 1e-12);
    if (t[k] >= start + kCsvResolution && t[k] + 1e-3 <= end - kCsvResolution) {
      ++inside;
      EXPECT_NEAR(cols.at("r2.nic.down")[k], rate, 1e-5) << k;
      EXPECT_NEAR(cols.at("r0.nic.up")[k], rate / 2, 1e-5) << k;
      EXPECT_NEAR(cols.at("r1.nic.up")[k], rate / 2, 1e-5) << k;
    } else if (t[k] + 1e-3 <= start - kCsvResolution || t[k] >= end + kCsvResolution) {
      EXPECT_EQ(cols.at("r2.nic.down")[k], 0) << k;
    }
    for (const char* other : {"r2.nic.up", "r0.nic.down", "r1.nic.down"}) {
      EXPECT_EQ(cols.at(other)[k], 0) << other << " " << k;
    }
  }
  EXPECT_EQ(inside, 25);
  double sum = 0;
  for (const double u : cols.at("r2.nic.down")) sum += u * kNicBw * 1e-3;
  // The last bin may be shorter than 1 ms; the transfer's bins are not.
  EXPECT_NEAR(sum, 2 * kPromptKvBytes, 2 * kPromptKvBytes * 1e-5);
  const std::string summary = ReadFile(dir + "/summary.json");
  EXPECT_TRUE(absl::StrContains(summary, "\"link_bin_s\": 0.001,")) << summary;
  // The transfers are in the timeline, on the decode replica.
  const std::string timeline = ReadFile(dir + "/timeline.json");
  for (const char* from : {"0", "1"}) {
    EXPECT_TRUE(absl::StrContains(
        timeline,
        absl::StrCat(R"({"ph":"b","cat":"kv","name":"KV from replica )", from, R"(","id":)")))
        << timeline;
  }
}

// Collectives on the fabric: a prefill replica of two xPUs on two nodes
// (one xPU per node) all-reduces across them over its NICs, 20 GB/s
// together. Llama-3.1-8B's 1000-token step all-reduces 1000 x 4096 x 2 =
// 8,192,000 bytes twice per layer: each xPU's NIC sends its whole 8,192,000
// (2 x (2 - 1) / 2 of it, one channel) 64 times, 1,048,576,000 bytes from
// both. Alone on the link they take 52.4288 ms, which the step's cost
// holds. Streamed layer by layer, 31/32 of the prompt's KV (126,976,000
// bytes) leaves as the step starts over the same link, at most 10 GB/s (the
// decode NIC's): the collectives get the other 10 GB/s while it flows, and
// the link stays full until they end, so the step is longer by the KV's
// bytes over the link's 20 GB/s, 6.3488 ms. Sent after the prefill, the KV
// shares nothing with the step.
TEST(DisaggregationTest, CollectivesAcrossNodesShareTheNicWithKvLeavingIt) {
  const std::string prefill = "prefill { cluster { replicas: 1 tensor_parallel: 2 } }";
  // Per policy: the steps shared and the time lost; the step's duration.
  std::map<std::string, std::vector<std::string>> runs;
  std::map<std::string, double> step_s;
  for (const char* policy : {"KV_TRANSFER_POLICY_LAYERWISE", "KV_TRANSFER_POLICY_AFTER_PREFILL"}) {
    std::string dir;
    RunScenario(absl::StrReplaceAll(Scenario(1, 1, policy, "xpus_per_node: 1"),
                                    {{"prefill { cluster { replicas: 1 } }", prefill}}),
                &dir);
    EXPECT_EQ(SummaryValue(dir, "collective_nic_bytes"), "1.048576e+09");
    // The link counts the collectives' bytes beside the KV's either way,
    // out of the NICs and into them (the ring's next node is the replica's
    // too): 131,072,000 + 2 x 1,048,576,000.
    EXPECT_TRUE(absl::StrContains(ReadFile(dir + "/summary.json"),
                                  "{\"name\": \"r0.nic\", \"bytes\": 2.228224e+09,"));
    const std::vector<double> steps = StepDurations(dir, "0");
    ASSERT_EQ(steps.size(), 1u);
    runs[policy] = {SummaryValue(dir, "collective_shared_steps"),
                    SummaryValue(dir, "collective_contention_s")};
    step_s[policy] = steps[0];
  }
  const auto& layerwise = runs["KV_TRANSFER_POLICY_LAYERWISE"];
  const auto& after = runs["KV_TRANSFER_POLICY_AFTER_PREFILL"];
  EXPECT_EQ(after[0], "0");
  EXPECT_EQ(after[1], "0");
  EXPECT_EQ(layerwise[0], "1");
  const double lost = kPromptKvBytes * 31 / 32 / (2 * kNicBw);  // 6.3488 ms
  double v = 0;
  ASSERT_TRUE(absl::SimpleAtod(layerwise[1], &v));
  EXPECT_NEAR(v, lost, 1e-9);
  // iterations.csv: to the nanosecond.
  EXPECT_NEAR(step_s["KV_TRANSFER_POLICY_LAYERWISE"] - step_s["KV_TRANSFER_POLICY_AFTER_PREFILL"],
              lost, 2e-9);
}

// Pipeline stages on two nodes hand the 1000-token step's hidden states
// and residual on, 1000 x 4096 x 2 x 2 = 16,384,000 bytes, through the
// NICs: alone 0.8192 ms over the replica's 20 GB/s; beside the layer-wise
// KV (bound to 10 GB/s elsewhere, and longer) at 10 GB/s, 0.8192 ms more.
TEST(DisaggregationTest, PipelineHandOffsAcrossNodesShareTheNicWithKv) {
  std::map<std::string, double> step_s;
  for (const char* policy : {"KV_TRANSFER_POLICY_LAYERWISE", "KV_TRANSFER_POLICY_AFTER_PREFILL"}) {
    std::string dir;
    RunScenario(absl::StrReplaceAll(Scenario(1, 1, policy, "xpus_per_node: 1"),
                                    {{"prefill { cluster { replicas: 1 } }",
                                      "prefill { cluster { replicas: 1 pipeline_parallel: 2 } }"}}),
                &dir);
    EXPECT_EQ(SummaryValue(dir, "collective_nic_bytes"), "16384000");
    const std::vector<double> steps = StepDurations(dir, "0");
    ASSERT_EQ(steps.size(), 1u);
    step_s[policy] = steps[0];
  }
  EXPECT_NEAR(step_s["KV_TRANSFER_POLICY_LAYERWISE"] - step_s["KV_TRANSFER_POLICY_AFTER_PREFILL"],
              16384000 / (2 * kNicBw), 2e-9);
}

// Across racks: the same prefill replica with each node in a rack of its
// own, behind uplinks of 10 GB/s / 4 = 2.5 GB/s, the spine 1 us away. Both
// hops of its ring (node 0 to 1, 1 to 0) climb to the spine, each with half
// the bytes, 524,288,000, bound by its uplinks: 209.7152 ms against the
// 52.4288 ms its cost holds, plus the spine's latency. Nothing else flows.
TEST(DisaggregationTest, CollectivesAcrossRacksAreBoundByTheUplinks) {
  std::string dir;
  RunScenario(
      absl::StrReplaceAll(
          Scenario(1, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL", "xpus_per_node: 1",
                   "fabric { nodes_per_rack: 1 oversubscription: 4 spine_latency_s: 1e-6 }"),
          {{"prefill { cluster { replicas: 1 } }",
            "prefill { cluster { replicas: 1 tensor_parallel: 2 } }"}}),
      &dir);
  const double bytes = 1048576000;
  EXPECT_EQ(SummaryValue(dir, "collective_shared_steps"), "1");
  double v = 0;
  ASSERT_TRUE(absl::SimpleAtod(SummaryValue(dir, "collective_contention_s"), &v));
  EXPECT_NEAR(v, bytes / 2 / 2.5e9 - bytes / (2 * kNicBw) + 1e-6, 1e-9);  // 157.2874 ms
  // Each rack's uplink carried one hop each way; rack 0's the KV too, on
  // its way to the decode replica in rack 2.
  const std::string summary = ReadFile(dir + "/summary.json");
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"rack0.uplink\", \"bytes\": 1.179648e+09,"))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"rack1.uplink\", \"bytes\": 1.048576e+09,"))
      << summary;
}

// The decode side: a decode replica of two xPUs on two nodes decodes the
// first request while the second one's KV (131,072,000 bytes, 13.1272 ms
// at the prefill NIC's 10 GB/s) flows into its NIC link (20 GB/s). Each of
// its steps sends 2 x 64 x 4096 x 2 = 1,048,576 bytes out of the nodes'
// NICs; sharing the link with the KV they get 10 GB/s, not 20: a step
// wholly inside the transfer (7.05 ms each) is longer by 1,048,576 / 20
// GB/s = 52.4288 us, and two are. The KV itself is bound by the prefill
// NIC and arrives as it would alone.
TEST(DisaggregationTest, DecodeStepsAcrossNodesShareTheNicWithArrivingKv) {
  std::string dir;
  const auto rows =
      RunScenario(absl::StrReplaceAll(
                      absl::StrReplaceAll(
                          Scenario(1, 2, "KV_TRANSFER_POLICY_AFTER_PREFILL", "xpus_per_node: 1"),
                          {{"prefill { cluster { replicas: 1 } }",
                            "prefill { cluster { replicas: 1 } scheduler { "
                            "max_tokens_per_iteration: 1000 } }"},
                           {"decode { cluster { replicas: 1 } }",
                            "decode { cluster { replicas: 1 tensor_parallel: 2 } }"}}),
                      {{"output_tokens: 8", "output_tokens: 64"}}),
                  &dir);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_NEAR(Num(row, "kv_ready_s") - Num(row, "prefill_end_s"),
                2 * kNicLatency + kPromptKvBytes / kNicBw, kCsvResolution);
  }
  EXPECT_EQ(SummaryValue(dir, "collective_nic_bytes"), "134217728");  // 128 steps
  double v = 0;
  ASSERT_TRUE(absl::SimpleAtod(SummaryValue(dir, "collective_contention_s"), &v));
  EXPECT_NEAR(v, 2 * 1048576 / (2 * kNicBw), 1e-12);
}

TEST(DisaggregationTest, APlatformFileLikeTheBuiltInFabricGivesIdenticalRuns) {
  // Poisson arrivals, KV streamed layer by layer: flows of both prefill
  // replicas share the decode NIC at various times.
  const std::string text = absl::StrReplaceAll(
      absl::StrCat(Scenario(2, 1, "KV_TRANSFER_POLICY_LAYERWISE"), "seed: 3\n"),
      {{"saturated { num_requests: 1 input_tokens: 1000 output_tokens: 8 }",
        "poisson { rate_rps: 20 } num_requests: 400 lengths { fixed { input_tokens: 700 "
        "output_tokens: 40 } }"}});
  std::string built_in;
  RunScenario(text, &built_in);
  const std::string file = RunWithPlatform(absl::StrReplaceAll(
      text, {{"kv_transfer:", "fabric { platform_file: \"platform.xml\" } kv_transfer:"}}));
  EXPECT_EQ(ReadFile(built_in + "/requests.csv"), ReadFile(file + "/requests.csv"));
  EXPECT_EQ(ReadFile(built_in + "/iterations.csv"), ReadFile(file + "/iterations.csv"));
  // The file's links, in the order the routes cross them.
  EXPECT_EQ(Lines(ReadFile(file + "/links.csv"))[0], "time_s,p0,d0,p1");
  EXPECT_EQ(Lines(ReadFile(built_in + "/links.csv"))[0],
            "time_s,r0.nic.up,r0.nic.down,r1.nic.up,r1.nic.down,r2.nic.up,r2.nic.down");
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

// Three 2100-token prompts sharing a 2048-token prefix, at t = 0, 1 and
// `third`, on three prefill replicas with a cluster KV store, each alone
// in a rack behind a non-blocking 10 GB/s uplink, and one decode replica
// (`decode_caches`: with its own prefix cache); the output folder.
std::string RunStoreTrio(const std::string& tag, int third, bool decode_caches) {
  const std::string dir = FreshDir(tag);
  WriteFile(dir + "/t.csv", absl::StrCat("arrival_s,input_tokens,output_tokens,prefix_group,",
                                         "prefix_tokens\n0,2100,4,0,2048\n1,2100,4,0,2048\n", third,
                                         ",2100,4,0,2048\n"));
  WriteFile(dir + "/s.pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  internode { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 }
  disaggregation {
    prefill { cluster { replicas: 3 kv_tiers { tier { kind: KV_TIER_CLUSTER_STORE
      capacity_bytes_per_xpu: 1e10 link { bandwidth_bytes_per_s: 1e10 latency_s: 0 } } } } }
    decode { cluster { replicas: 1 } scheduler { prefix_caching: )",
                                           decode_caches ? "true" : "false", R"( } }
    kv_transfer: KV_TRANSFER_POLICY_AFTER_PREFILL
    fabric { nodes_per_rack: 1 }
  }
}
workload { trace { path: "t.csv" } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 routing: ROUTING_POLICY_ROUND_ROBIN }
)"));
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  return dir + "/out";
}

// A prefill pool's cluster KV store over the fabric: replica 0 stores the
// 2048-token prefix (128 blocks of 2,097,152 bytes) at t = 0, replicas 1
// and 2 load it from replica 0's node. Alone, a load takes the tier link's
// time (26.8435 ms at 10 GB/s, no latency). Both at t = 1, the two flows
// share replica 0's NIC and rack uplink on the way out: each takes twice
// its bytes' time, and each prefill 26.8435 ms more.
TEST(DisaggregationTest, AStoresLoadsShareTheFabricOutOfTheNodeThatHoldsThem) {
  std::map<std::string, std::vector<std::map<std::string, std::string>>> runs;
  std::map<std::string, std::string> dirs;
  for (const auto& [name, third] : {std::pair<std::string, int>{"apart", 2}, {"together", 1}}) {
    dirs[name] = RunStoreTrio("disagg_store_" + name, third, /*decode_caches=*/false);
    runs[name] = Requests(dirs[name]);
    ASSERT_EQ(runs[name].size(), 3u);
    EXPECT_EQ(SummaryValue(dirs[name], "loaded_blocks"), "256");
    EXPECT_EQ(SummaryValue(dirs[name], "network_bytes"), "536870912");
    EXPECT_EQ(SummaryValue(dirs[name], "network_steps"), "2");
  }
  const double alone_s = 128 * 2097152.0 / kNicBw;  // 26.8435 ms
  EXPECT_EQ(SummaryValue(dirs["apart"], "contention_s"), "0");
  double contention = 0;
  ASSERT_TRUE(absl::SimpleAtod(SummaryValue(dirs["together"], "contention_s"), &contention));
  EXPECT_NEAR(contention, 2 * alone_s, 1e-6);
  for (size_t i : {1, 2}) {
    auto prefill_s = [&](const std::string& run) {
      return Num(runs[run][i], "prefill_end_s") - Num(runs[run][i], "arrival_s");
    };
    EXPECT_NEAR(prefill_s("together") - prefill_s("apart"), alone_s, kCsvResolution) << i;
  }
  // Both loads leave replica 0's NIC and rack, each enters its own, beside
  // each request's 275,251,200 bytes of KV on its way to the decode pool.
  const std::string summary = ReadFile(dirs["together"] + "/summary.json");
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"rack0.uplink\", \"bytes\": 812122112,"))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"rack1.uplink\", \"bytes\": 543686656,"))
      << summary;
}

// A tier's hit rate is over the prompts of the replicas that have it: the
// store supplied 2 x 2048 of the prefill pool's 3 x 2100 prompt tokens
// (0.65015873), whether or not the untiered decode pool also caches (its
// 2 x 2048 hits of 3 x 2100 count in the run's prefix-cache totals only).
TEST(DisaggregationTest, ATiersHitRateCountsOnlyTheTieredPoolsPrompts) {
  for (const bool decode_caches : {false, true}) {
    const std::string out =
        RunStoreTrio(absl::StrCat("disagg_tier_rate_", decode_caches), 2, decode_caches);
    const std::string summary = ReadFile(out + "/summary.json");
    EXPECT_TRUE(absl::StrContains(summary, "\"hit_tokens\": 4096, \"hit_rate\": 0.65015873,"))
        << summary;
    EXPECT_EQ(SummaryValue(out, "prefix_cache_query_tokens"), decode_caches ? "12600" : "6300");
    EXPECT_EQ(SummaryValue(out, "prefix_cache_hit_tokens"), decode_caches ? "8192" : "4096");
  }
}

TEST(DisaggregationTest, FabricOutOfRangeNamesTheField) {
  const auto r = Validate(
      Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE", "", "fabric { oversubscription: 0.5 }"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(
      r.out, "cluster.disaggregation.fabric.oversubscription = 0.5: allowed range [1, 64]"))
      << r.out;
}

// A platform file that cannot carry the KV is refused at load, by
// `validate` and by `run` alike, naming the scenario's line and the file's.
TEST(DisaggregationTest, ABadPlatformFileIsRefusedAtLoad) {
  const std::string dir = FreshDir("bad_platform");
  const std::string good = absl::StrReplaceAll(kPlatform, {{"DECODE_BW", "10GBps"}});
  auto refuse = [&](const std::string& platform, const std::string& fabric,
                    const std::string& expected) {
    WriteFile(dir + "/platform.xml", platform);
    WriteFile(dir + "/s.pbtxt",
              Scenario(2, 1, "KV_TRANSFER_POLICY_LAYERWISE", "",
                       absl::StrCat("fabric { platform_file: \"platform.xml\" ", fabric, " }")));
    for (const auto& command : std::vector<std::vector<std::string>>{
             {"validate", dir + "/s.pbtxt"}, {"run", dir + "/s.pbtxt", "--out", dir + "/out"}}) {
      const auto r = RunServesim(command);
      EXPECT_NE(r.code, 0) << command[0];
      EXPECT_TRUE(absl::StrContains(r.out, expected)) << command[0] << ": " << r.out;
    }
  };
  refuse(absl::StrReplaceAll(good, {{"</zone>", ""}}), "",
         "s.pbtxt:11: cluster.disaggregation.fabric.platform_file: Parse error at ");
  refuse(
      absl::StrReplaceAll(good, {{"bandwidth=\"10GBps\" latency=\"10us\"/>\n    <link id=\"d0\"",
                                  "bandwidth=\"0GBps\" latency=\"10us\"/>\n    <link id=\"d0\""}}),
      "",
      "link \"p1\" on the route from host \"prefill1\" (prefill replica 1) to host "
      "\"decode0\" (decode replica 2) in ");
  refuse(good, "replica_hosts: [\"prefill0\", \"prefill1\", \"decode7\"]",
         "cluster.disaggregation.fabric.replica_hosts[2] = \"decode7\": no such host in ");
  refuse(absl::StrReplaceAll(good, {{"<route src=\"prefill1\"", "<!-- "},
                                    {"d0\"/></route>\n  </zone>", "-->\n  </zone>"}}),
         "",
         "the route from host \"prefill1\" (prefill replica 1) to host \"decode0\" (decode "
         "replica 2) in ");
}

TEST(DisaggregationTest, PodsWithoutRacksNameTheField) {
  const auto r =
      Validate(Scenario(1, 1, "KV_TRANSFER_POLICY_LAYERWISE", "", "fabric { racks_per_pod: 2 }"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out,
                                "cluster.disaggregation.fabric.racks_per_pod = 2: pods group "
                                "racks: set cluster.disaggregation.fabric.nodes_per_rack too"))
      << r.out;
}

}  // namespace
}  // namespace servesim::disaggregation_test
