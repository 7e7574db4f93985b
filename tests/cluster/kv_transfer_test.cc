// KV hand-offs between the pools end to end (cluster/kv_transfer.h):
// transfers over the platform equal the link math by hand, flows sharing a
// link share its bandwidth, layer-wise streaming exposes only the last
// layer, parts land in the order their flows end, and a decode replica
// receives only the KV its prefix cache lacks.
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

}  // namespace
}  // namespace servesim::disaggregation_test
