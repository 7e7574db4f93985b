// KV tiers end to end (docs/kv_tiers.md): a prompt whose prefix HBM
// evicted loads it from host DRAM, taking exactly the link's time; a
// cluster store lets another replica find a prefix, its loads sharing the
// links out of the node that holds it; runs are repeatable.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

// Llama-3.1-8B: 131,072 KV bytes per token, a 16-token block 2,097,152.
constexpr double kBlockBytes = 2097152.0;

// Runs 2100-token prompts with 4 output tokens, arriving at the given
// times in the given prefix groups (2048 shared tokens, 128 blocks), on
// Llama-3.1-8B on A100s; `cluster` and `scheduler` are the rest of those
// messages. Returns the output folder.
std::string RunArrivals(const std::string& dir, const std::string& name,
                        const std::vector<std::pair<double, int>>& requests,
                        const std::string& cluster, const std::string& scheduler = "") {
  std::string trace = "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n";
  for (const auto& [arrival, group] : requests) {
    absl::StrAppend(&trace, arrival, ",2100,4,", group, ",2048\n");
  }
  WriteFile(dir + "/" + name + ".csv", trace);
  WriteFile(dir + "/" + name + ".pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster { xpu { preset: "a100-80gb" } )",
                                                      cluster, R"( }
workload { trace { path: ")",
                                                      name, R"(.csv" } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 )",
                                                      scheduler, R"( }
seed: 5
)"));
  const auto r = RunServesim({"run", dir + "/" + name + ".pbtxt", "--out", dir + "/" + name});
  EXPECT_EQ(r.code, 0) << r.out;
  return dir + "/" + name;
}

// As RunArrivals, one request a second.
std::string RunGroups(const std::string& dir, const std::string& name,
                      const std::vector<int>& groups, const std::string& cluster,
                      const std::string& scheduler = "") {
  std::vector<std::pair<double, int>> requests;
  for (size_t i = 0; i < groups.size(); ++i) {
    requests.emplace_back(static_cast<double>(i), groups[i]);
  }
  return RunArrivals(dir, name, requests, cluster, scheduler);
}

// Per request id: TTFT, from requests.csv.
std::vector<double> Ttft(const std::string& out) {
  const std::vector<std::string> lines = Lines(ReadFile(out + "/requests.csv"));
  std::vector<std::string> header = absl::StrSplit(lines.at(0), ',');
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  std::vector<double> ttft;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    double arrival = 0, first = 0;
    EXPECT_TRUE(absl::SimpleAtod(cells.at(col.at("arrival_s")), &arrival));
    EXPECT_TRUE(absl::SimpleAtod(cells.at(col.at("first_token_s")), &first));
    ttft.push_back(first - arrival);
  }
  return ttft;
}

// The number after `"key": ` in summary.json (the first one), as text;
// empty if there is none.
std::string SummaryValue(const std::string& out, const std::string& key) {
  const std::string s = ReadFile(out + "/summary.json");
  const std::string k = "\"" + key + "\": ";
  const size_t at = s.find(k);
  if (at == std::string::npos) return "";
  const size_t start = at + k.size();
  return s.substr(start, s.find_first_of(",}", start) - start);
}

double SummaryDouble(const std::string& out, const std::string& key) {
  double v = -1;
  EXPECT_TRUE(absl::SimpleAtod(SummaryValue(out, key), &v)) << key;
  return v;
}

int64_t SummaryInt(const std::string& out, const std::string& key) {
  int64_t v = -1;
  EXPECT_TRUE(absl::SimpleAtoi(SummaryValue(out, key), &v)) << key;
  return v;
}

// HBM holds 200 blocks: the second prompt (132 blocks) evicts the first's
// prefix from its last block back, and HBM keeps only its leading 68
// blocks; the third prompt finds those in HBM and the other 60 only in
// host DRAM. Their load is the only difference between two links:
// 60 x block bytes x (1/B1 - 1/B2).
TEST(KvTiersEndToEndTest, APrefixEvictedFromHbmIsLoadedAtTheLinksRate) {
  const std::string dir = FreshDir("kv_tiers");
  const std::vector<int> groups = {0, 1, 0};
  const std::string hbm_only = RunGroups(dir, "hbm", groups, "", "num_kv_blocks: 200");
  auto tier = [](const char* bw) {
    return absl::StrCat("kv_tiers { tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 1e10 ",
                        "link { bandwidth_bytes_per_s: ", bw, " latency_s: 1e-5 } } }");
  };
  const std::string slow = RunGroups(dir, "slow", groups, tier("1e10"), "num_kv_blocks: 200");
  const std::string fast = RunGroups(dir, "fast", groups, tier("2e10"), "num_kv_blocks: 200");
  EXPECT_EQ(SummaryInt(hbm_only, "prefix_cache_hit_tokens"), 68 * 16);
  EXPECT_EQ(SummaryInt(slow, "prefix_cache_hit_tokens"), 2048);
  EXPECT_EQ(SummaryInt(slow, "hit_tokens"), 60 * 16);  // the host_dram tier's
  EXPECT_EQ(SummaryInt(slow, "loaded_blocks"), 60);
  const std::vector<double> a = Ttft(hbm_only), s = Ttft(slow), f = Ttft(fast);
  ASSERT_EQ(s.size(), 3u);
  ASSERT_EQ(f.size(), 3u);
  // The first two prompts are the same everywhere; the third is faster
  // with the tier (960 more tokens loaded, not computed).
  EXPECT_EQ(s[0], a[0]);
  EXPECT_EQ(s[1], a[1]);
  EXPECT_LT(s[2], a[2]);
  EXPECT_NEAR(s[2] - f[2], 60 * kBlockBytes * (1 / 1e10 - 1 / 2e10), 2e-6);
}

// Asynchronous loads (KV_TIER_LOAD_ASYNC): alone on the replica, a prompt
// that loads its prefix waits out the loads and then runs its step, so its
// TTFT is the blocking one's (which runs the loads inside the step).
TEST(KvTiersEndToEndTest, AsynchronousLoadsAloneCostWhatBlockingOnesDo) {
  const std::string dir = FreshDir("kv_async_alone");
  auto tier = [](const char* load) {
    return absl::StrCat(
        "kv_tiers { tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 1e10 link { "
        "bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 } } load: ",
        load, " }");
  };
  const std::vector<int> groups = {0, 1, 0};
  const std::string blocking =
      RunGroups(dir, "blocking", groups, tier("KV_TIER_LOAD_BLOCKING"), "num_kv_blocks: 200");
  const std::string async =
      RunGroups(dir, "async", groups, tier("KV_TIER_LOAD_ASYNC"), "num_kv_blocks: 200");
  EXPECT_EQ(SummaryInt(async, "loaded_blocks"), 60);
  const std::vector<double> b = Ttft(blocking), a = Ttft(async);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 2e-6) << i;
}

// While another request decodes: request 2's prompt (a prefix group of its
// own) evicts the tail of request 0's prefix from HBM; request 3, request
// 0's prompt again, arrives while request 1 (600 output tokens) decodes and
// loads 74 blocks from host DRAM: 10 us + 74 x 2,097,152 bytes / 10 GB/s =
// 15.528 ms. Blocking, the step that admits it waits for them and request
// 1 with it; asynchronously, request 1 decodes on, and ends that much
// sooner, while request 3 waits for the first step after its loads.
TEST(KvTiersEndToEndTest, AsynchronousLoadsLetTheOthersDecodeOn) {
  const std::string dir = FreshDir("kv_async");
  WriteFile(dir + "/t.csv",
            "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n"
            "0,2100,4,0,2048\n0.5,100,600,2,0\n1,2100,4,1,2048\n2,2100,4,0,2048\n");
  std::map<std::string, std::vector<std::string>> finish, ttft;
  for (const char* load : {"KV_TIER_LOAD_BLOCKING", "KV_TIER_LOAD_ASYNC"}) {
    WriteFile(dir + "/s.pbtxt", absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster { xpu { preset: "a100-80gb" } kv_tiers { tier { kind: KV_TIER_HOST_DRAM
  capacity_bytes_per_xpu: 1e10 link { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 } } load: )",
                                             load, R"( } }
workload { trace { path: "t.csv" } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 num_kv_blocks: 200 }
)"));
    const std::string out = dir + "/" + load;
    const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", out});
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(SummaryInt(out, "loaded_blocks"), 74);
    const std::vector<std::string> lines = Lines(ReadFile(out + "/requests.csv"));
    ASSERT_EQ(lines.size(), 5u);
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
      finish[load].push_back(cells.at(3));
      ttft[load].push_back(cells.at(6));
    }
  }
  auto num = [](const std::string& s) {
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(s, &v)) << s;
    return v;
  };
  const double load_s = 1e-5 + 74 * kBlockBytes / 1e10;  // 15.528 ms
  const auto& b = finish["KV_TIER_LOAD_BLOCKING"];
  const auto& a = finish["KV_TIER_LOAD_ASYNC"];
  EXPECT_NEAR(num(b[1]) - num(a[1]), load_s, 3e-6);
  // Requests 0 and 2 end before request 3 arrives: the same either way.
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[2], b[2]);
  // Request 3 waits for a step boundary after its loads end.
  EXPECT_GT(num(ttft["KV_TIER_LOAD_ASYNC"][3]), num(ttft["KV_TIER_LOAD_BLOCKING"][3]));
}

// Two replicas, round robin: two prompts of one prefix group land on
// replicas 0 and 1. Alone, replica 1 computes the prefix again; with a
// store they share, it loads the 128 blocks replica 0 stored there.
TEST(KvTiersEndToEndTest, AClusterStoreLetsAnotherReplicaFindAPrefix) {
  const std::string dir = FreshDir("kv_store");
  const std::string cluster =
      "replicas: 2 kv_tiers { tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 1e10 "
      "link { preset: \"roce-400g\" } } }";
  const std::string rr = "routing: ROUTING_POLICY_ROUND_ROBIN";
  const std::string alone = RunGroups(dir, "alone", {0, 0}, "replicas: 2", rr);
  const std::string shared = RunGroups(dir, "shared", {0, 0}, cluster, rr);
  const std::string again = RunGroups(dir, "again", {0, 0}, cluster, rr);
  EXPECT_EQ(SummaryInt(alone, "prefix_cache_hit_tokens"), 0);
  EXPECT_EQ(SummaryInt(shared, "prefix_cache_hit_tokens"), 2048);
  EXPECT_EQ(SummaryInt(shared, "loaded_blocks"), 128);
  // The blocks live on replica 0's node: they cross the network, alone.
  EXPECT_EQ(SummaryDouble(shared, "network_bytes"), 128 * kBlockBytes);
  EXPECT_EQ(SummaryInt(shared, "network_steps"), 1);
  EXPECT_EQ(SummaryDouble(shared, "contention_s"), 0);
  EXPECT_LT(Ttft(shared)[1], Ttft(alone)[1]);
  EXPECT_EQ(ReadFile(shared + "/requests.csv"), ReadFile(again + "/requests.csv"));
  EXPECT_EQ(ReadFile(shared + "/iterations.csv"), ReadFile(again + "/iterations.csv"));
}

// Three replicas, round robin: replica 0 stores a prefix at t = 0;
// replicas 1 and 2 load its 128 blocks from replica 0's node. One at a
// time (t = 1 and t = 2), each load takes the tier link's time alone,
// 128 x 2,097,152 bytes / 10 GB/s = 26.8435 ms, as its step's wait. At
// once (both at t = 1), the two flows share replica 0's outgoing link:
// each takes twice as long, and each step is 26.8435 ms longer.
TEST(KvTiersEndToEndTest, LoadsFromOneNodeShareItsLink) {
  const std::string dir = FreshDir("kv_store_share");
  const std::string cluster =
      "replicas: 3 kv_tiers { tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 1e10 "
      "link { bandwidth_bytes_per_s: 1e10 latency_s: 0 } } }";
  const std::string rr = "routing: ROUTING_POLICY_ROUND_ROBIN";
  const std::string apart = RunArrivals(dir, "apart", {{0, 0}, {1, 0}, {2, 0}}, cluster, rr);
  const std::string together = RunArrivals(dir, "together", {{0, 0}, {1, 0}, {1, 0}}, cluster, rr);
  const double alone_s = 128 * kBlockBytes / 1e10;
  for (const std::string& out : {apart, together}) {
    EXPECT_EQ(SummaryInt(out, "loaded_blocks"), 256);
    EXPECT_EQ(SummaryDouble(out, "network_bytes"), 256 * kBlockBytes);
    EXPECT_EQ(SummaryInt(out, "network_steps"), 2);
  }
  EXPECT_EQ(SummaryDouble(apart, "contention_s"), 0);
  EXPECT_NEAR(SummaryDouble(together, "contention_s"), 2 * alone_s, 1e-6);
  const std::vector<double> a = Ttft(apart), t = Ttft(together);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(a[0], t[0]);
  EXPECT_NEAR(t[1] - a[1], alone_s, 1e-6);
  EXPECT_NEAR(t[2] - a[2], alone_s, 1e-6);
  // Both loads out of replica 0's link, each into its own.
  const std::string links = ReadFile(together + "/summary.json");
  EXPECT_NE(links.find("{\"name\": \"r0.nic\", \"bytes\": 536870912,"), std::string::npos) << links;
}

}  // namespace
}  // namespace servesim
