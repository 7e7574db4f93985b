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

// share_nodes: the decode replica joins the prefill replicas on their
// 8-xPU node, so the KV crosses NVLink (nvlink3: 300 GB/s per A100 each
// way, 3 us a link) instead of the 10 GB/s NICs, which carry nothing. One
// transfer: two latencies and 131,072,000 bytes at 300 GB/s. Two at once
// share the decode replica's NVLink link: each takes twice the bytes' time.
TEST(DisaggregationTest, PoolsSharingANodeMoveTheKvOverNvlink) {
  constexpr double kNvlinkBw = 300e9, kNvlinkLatency = 3e-6;
  for (int prefill : {1, 2}) {
    std::string out;
    const auto rows = RunScenario(Scenario(prefill, prefill, "KV_TRANSFER_POLICY_AFTER_PREFILL",
                                           "xpus_per_node: 8", "share_nodes: true"),
                                  &out);
    ASSERT_EQ(rows.size(), static_cast<size_t>(prefill));
    const double expected = 2 * kNvlinkLatency + prefill * kPromptKvBytes / kNvlinkBw;
    for (const auto& row : rows) {
      EXPECT_NEAR(Num(row, "kv_ready_s") - Num(row, "prefill_end_s"), expected, kCsvResolution)
          << prefill;
      EXPECT_EQ(row.at("status"), "done");
    }
    const std::string summary = ReadFile(out + "/summary.json");
    EXPECT_TRUE(absl::StrContains(summary, "{\"name\": \"r0.nic\", \"bytes\": 0,")) << summary;
    EXPECT_TRUE(
        absl::StrContains(summary, absl::StrCat("{\"name\": \"r", prefill, ".nvlink\", \"bytes\": ",
                                                prefill == 1 ? "131072000," : "262144000,")))
        << summary;
  }
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

// iterations.csv's duration_s of replica `replica`'s steps, in order.
std::vector<double> StepDurations(const std::string& dir, const std::string& replica) {
  std::vector<double> out;
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/iterations.csv"));
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    double d = 0;
    if (cells.size() > 2 && cells[0] == replica && absl::SimpleAtod(cells[2], &d)) {
      out.push_back(d);
    }
  }
  return out;
}

// The text value of `key` in the JSON file `path`.
std::string JsonFileValue(const std::string& path, const std::string& key) {
  const std::string json = ReadFile(path);
  const std::string tag = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(tag);
  if (at == std::string::npos) return "";
  const size_t from = at + tag.size();
  return json.substr(from, json.find_first_of(",}\n", from) - from);
}

// The text value of summary.json's `key`.
std::string SummaryValue(const std::string& dir, const std::string& key) {
  return JsonFileValue(dir + "/summary.json", key);
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

// A SimGrid platform file with the built-in fabric's NICs: each prefill
// replica's host reaches the decode replica's over its own 10 GB/s link
// and the decode host's, 10 us each.
constexpr char kPlatform[] = R"(<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="fabric" routing="Full">
    <host id="prefill0" speed="1Gf"/>
    <host id="prefill1" speed="1Gf"/>
    <host id="decode0" speed="1Gf"/>
    <link id="p0" bandwidth="10GBps" latency="10us"/>
    <link id="p1" bandwidth="10GBps" latency="10us"/>
    <link id="d0" bandwidth="DECODE_BW" latency="10us"/>
    <route src="prefill0" dst="decode0"><link_ctn id="p0"/><link_ctn id="d0"/></route>
    <route src="prefill1" dst="decode0"><link_ctn id="p1"/><link_ctn id="d0"/></route>
  </zone>
</platform>
)";

// Runs `text` beside platform.xml (kPlatform with the decode link's
// bandwidth `decode_bw`); the output folder.
std::string RunWithPlatform(const std::string& text, const std::string& decode_bw = "10GBps") {
  const std::string dir = FreshDir("platform");
  WriteFile(dir + "/platform.xml", absl::StrReplaceAll(kPlatform, {{"DECODE_BW", decode_bw}}));
  WriteFile(dir + "/s.pbtxt", text);
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  return dir + "/out";
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

// A short transfer that starts while a long one is under way lands when
// its own bytes are through, sharing the decode link fairly, not after
// the long one: prompt A (4000 tokens, 524 MB of KV, 52 ms alone) leaves
// prefill replica 0; prompt B (100 tokens, 13.1 MB) leaves replica 1 as A
// streams, and takes 2 x 10 us + 13,107,200 bytes at half of 10 GB/s.
TEST(DisaggregationTest, AShortTransferLandsBeforeALongOneSentEarlier) {
  const std::string dir = FreshDir("short_long");
  auto run = [&](const std::string& trace) {
    WriteFile(dir + "/trace.csv", trace);
    const std::string text =
        absl::StrReplaceAll(Scenario(2, 1, "KV_TRANSFER_POLICY_AFTER_PREFILL"),
                            {{"saturated { num_requests: 1 input_tokens: 1000 output_tokens: 8 }",
                              "trace { path: \"trace.csv\" }"}});
    WriteFile(dir + "/s.pbtxt", text);
    const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
    EXPECT_EQ(r.code, 0) << r.out;
    return Requests(dir + "/out");
  };
  const auto alone = run("arrival_s,input_tokens,output_tokens\n0,4000,4\n");
  ASSERT_EQ(alone.size(), 1u);
  const double a_end = Num(alone[0], "prefill_end_s");
  const auto both =
      run(absl::StrCat("arrival_s,input_tokens,output_tokens\n0,4000,4\n", a_end, ",100,4\n"));
  ASSERT_EQ(both.size(), 2u);
  ASSERT_EQ(both[1].at("prefill_replica"), "1");
  const double b_start = Num(both[1], "prefill_end_s");
  ASSERT_LT(b_start, Num(both[0], "kv_ready_s") - 0.01) << "B leaves while A streams";
  EXPECT_NEAR(Num(both[1], "kv_ready_s") - b_start, 2 * kNicLatency + 13107200.0 / 5e9,
              kCsvResolution);  // 2.6414 ms
  EXPECT_LT(Num(both[1], "kv_ready_s"), Num(both[0], "kv_ready_s"));
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

// Two 2100-token prompts sharing a 2048-token prefix, at t = 0 and 1, on
// one prefill and one decode replica with `decode` as the decode pool and
// `policy` as the transfer policy; the output folder.
std::string RunSharedPrefixPair(const std::string& tag, const std::string& decode,
                                const std::string& policy) {
  const std::string dir = FreshDir(tag);
  WriteFile(dir + "/t.csv",
            "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n"
            "0,2100,4,0,2048\n1,2100,4,0,2048\n");
  WriteFile(dir + "/s.pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  internode { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 }
  disaggregation {
    prefill { cluster { replicas: 1 } }
    decode { )",
                                           decode, R"( }
    kv_transfer: )",
                                           policy, R"(
  }
}
workload { trace { path: "t.csv" } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 }
)"));
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  return dir + "/out";
}

// The second prompt, its prefix still cached on the prefill replica,
// computes 52 tokens in a short step, but streams its whole KV layer by
// layer from the step's start: 275,038,208 bytes at 10 GB/s, 27.5 ms, far
// longer than the step (the decode replica caches nothing, so all of it
// moves). The last layer's part, sent as the step ends, lands first; the
// request still waits for the rest, and the run ends with every request
// done.
TEST(DisaggregationTest, StreamedLayersThatLandAfterTheLastOneStillComplete) {
  const std::string out = RunSharedPrefixPair(
      "disagg_stream", "cluster { replicas: 1 } scheduler { prefix_caching: false }",
      "KV_TRANSFER_POLICY_LAYERWISE");
  const auto rows = Requests(out);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) EXPECT_EQ(row.at("status"), "done") << row.at("id");
  const double streamed_s = 2 * kNicLatency + (2100 * 131072.0 - 52 * 131072.0 / 32) / kNicBw;
  EXPECT_GT(Num(rows[1], "kv_ready_s") - Num(rows[1], "arrival_s"), streamed_s);
  EXPECT_LT(Num(rows[1], "prefill_end_s"), Num(rows[1], "arrival_s") + streamed_s);
}

// The decode replica's own prefix cache: the second prompt finds the
// prefix cached where the first decoded, so only the other 52 tokens' KV
// moves (as vLLM's P/D connectors pull only what the decode instance has
// not computed): 52 x 131,072 bytes in 2 x 10 us + 0.6816 ms, after the
// first prompt's whole 2100 tokens.
TEST(DisaggregationTest, ADecodeReplicaReceivesOnlyTheKvItDoesNotCache) {
  const std::string out = RunSharedPrefixPair("disagg_decode_cache", "cluster { replicas: 1 }",
                                              "KV_TRANSFER_POLICY_AFTER_PREFILL");
  const auto rows = Requests(out);
  ASSERT_EQ(rows.size(), 2u);
  constexpr double kTokenKv = 131072.0;
  EXPECT_NEAR(Num(rows[0], "kv_ready_s") - Num(rows[0], "prefill_end_s"),
              2 * kNicLatency + 2100 * kTokenKv / kNicBw, kCsvResolution);
  EXPECT_NEAR(Num(rows[1], "kv_ready_s") - Num(rows[1], "prefill_end_s"),
              2 * kNicLatency + 52 * kTokenKv / kNicBw, kCsvResolution);
  EXPECT_EQ(SummaryValue(out, "kv_transfer_bytes"), "282066944");  // (2100 + 52) tokens
  for (const auto& row : rows) EXPECT_EQ(row.at("status"), "done");
  // Each pool found the 2048 tokens once in 2 x 2100 admitted; the decode
  // pool's hits are the tokens whose KV stayed put.
  const std::string summary = ReadFile(out + "/summary.json");
  for (const char* name : {"\"prefill_pool\": {", "\"decode_pool\": {"}) {
    const size_t at = summary.find(name);
    ASSERT_NE(at, std::string::npos) << name;
    const std::string pool = summary.substr(at, summary.find('}', at) - at);
    EXPECT_TRUE(absl::StrContains(
        pool, "\"prefix_cache_hit_tokens\": 2048, \"prefix_cache_query_tokens\": 4200,"))
        << pool;
  }
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
}  // namespace servesim
