// Resolve's memory plan (scenario/resolve_memory.cc): weights, activations
// and the KV blocks that fit beside them (by hand, for GPT-3 and for vLLM
// v1's profiling run), and the KV tiers below HBM.
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"
#include "tests/scenario/scenario_test_util.h"

namespace servesim::scenario {
namespace {

using test::kLlama31OnRtxPro;
using test::ParseAndResolve;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ------------------------------------------------------ fits, KV blocks --

TEST(ScenarioResolveTest, Gpt3DoesNotFitOneA100_40GB) {
  const std::string text =
      "name: \"too big\"\n"
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  replicas: 1\n"
      "  tensor_parallel: 1\n"
      "  xpu { preset: \"a100-40gb\" }\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  // Weights: 174,568,476,672 parameters x 2 bytes = 349.14 GB. Activations
  // for 8,192 tokens: 2 x (12288 + 3 x 96 x 128 + 49152) x 8192 x 2 bytes
  // = 3.22 GB. One KV block: 16 x 2 x 96 x 96 x 128 x 2 = 0.08 GB.
  // Available: 40 GiB = 42,949,672,960 bytes x 0.9 = 38.65 GB.
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: GPT-3 175B does not fit a replica of 1 x a100-40gb: "
            "required 352.36 GB per xPU (weights 349.14 GB + activations "
            "3.22 GB) plus at least one KV block (0.08 GB) vs available "
            "38.65 GB (memory 42.95 GB x cluster.memory_utilization 0.9); "
            "raise cluster.tensor_parallel or use a larger xPU");
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("required"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("available"));
}

TEST(ScenarioResolveTest, DoesNotFitNamesClusterLineWhenTensorParallelUnset) {
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-40gb\" }\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:2: GPT-3 175B does not fit a replica of 1 x "
                         "a100-40gb: required 352.36 GB"));
}

TEST(ScenarioResolveTest, Gpt3KvCapacityOnEightA100Hbm3) {
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster { tensor_parallel: 8 xpu { preset: \"a100-hbm3\" } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  // Per xPU: 85,899,345,920 x 0.9 = 77,309,411,328 usable; weights
  // 349,136,953,344 / 8 = 43,642,119,168; activations for 8,192 tokens
  // 2 x (12288 + 36 x 128 + 6144) x 8192 x 2 = 754,974,720; KV per token
  // per xPU 2 x 96 layers x 12 heads x 128 x 2 = 589,824 bytes, a block of
  // 16 tokens 9,437,184 bytes. 32,912,317,440 / 9,437,184 = 3487.5 -> 3487.
  EXPECT_DOUBLE_EQ(r->weight_bytes_per_xpu, 43642119168.0);
  EXPECT_DOUBLE_EQ(r->activation_bytes_per_xpu, 754974720.0);
  EXPECT_DOUBLE_EQ(r->kv.usable_bytes_per_xpu, 32912317440.0);
  EXPECT_EQ(r->kv.blocks, 3487);
  EXPECT_EQ(r->kv.tokens, 55792);
  EXPECT_EQ(r->batching.kv_capacity_blocks, 3487);
  EXPECT_EQ(r->tensor_parallel, 8);
  EXPECT_EQ(r->replicas, 1);
  EXPECT_EQ(r->model.num_layers, 96);
}

// ------------------------------------------------------------ vLLM v1 --

// vLLM's KV cache: device memory x gpu_memory_utilization, less the
// weights, the profiling run's peak (one full token budget's activations and
// the sampler's fp32 logits for max_num_seqs) and the runtime reserve:
//   103,079,215,104 x 0.9          = 92,771,293,593.6
//   weights 8,030,261,248 x 2      = 16,060,522,496
//   activations 2 x (4096 + 48 x 128 + 2 x 14336) x 2048 x 2 = 318,767,104
//   logits 2 x 4 x 128 x 128,256   = 131,334,144
//   reserve                          1,073,741,824
//   usable 75,186,928,025.6 / (16 x 131,072) = 35,851.9 -> 35,851 blocks
TEST(VllmV1ResolveTest, KvBlocksFromMemoryByHand) {
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(kLlama31OnRtxPro);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->batching.policy, scheduler::BatchingPolicy::kVllmV1);
  EXPECT_TRUE(r->batching.prefix_caching);
  EXPECT_DOUBLE_EQ(r->weight_bytes_per_xpu, 16'060'522'496.0);
  EXPECT_DOUBLE_EQ(r->activation_bytes_per_xpu, 318'767'104.0 + 131'334'144.0);
  EXPECT_DOUBLE_EQ(r->runtime_reserve_bytes_per_xpu, 1'073'741'824.0);
  EXPECT_EQ(r->kv.blocks, 35'851);
  EXPECT_EQ(r->batching.kv_capacity_blocks, 35'851);
  // A recorded block count (vLLM's num_gpu_blocks) replaces the estimate.
  absl::StatusOr<ResolvedScenario> recorded =
      ParseAndResolve(kLlama31OnRtxPro, {"scheduler.num_kv_blocks=7438"});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->kv.blocks, 7438);
  EXPECT_EQ(recorded->kv.tokens, 7438 * 16);
}

// ----------------------------------------------------------- KV tiers --

// cluster.kv_tiers (docs/kv_tiers.md): sized in blocks; bad tiers named by
// their line.
std::string TierScenario(const std::string& tiers, const std::string& extra = "") {
  return absl::StrCat(
      "model { preset: \"llama3.1-8b\" }\n"
      "cluster {\n"
      "  node { preset: \"dgx-h100\" }\n",
      extra, "  kv_tiers {\n", tiers,
      "  }\n"
      "}\n"
      "scheduler { batching: BATCHING_POLICY_VLLM_V1 }\n"
      "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n");
}

TEST(KvTierResolveTest, TiersAreSizedInBlocksOfEachXpusShard) {
  // Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes =
  // 131,072 bytes per token; a 16-token block is 2,097,152 bytes, so
  // 100 GB holds 47,683 blocks, over PCIe 5 (63 GB/s) 33.3 us each.
  absl::StatusOr<ResolvedScenario> r =
      ParseAndResolve(TierScenario("    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: "
                                   "100e9 link { preset: \"pcie5\" } }\n"
                                   "    tier { kind: KV_TIER_SSD capacity_bytes_per_xpu: 1e12 link "
                                   "{ bandwidth_bytes_per_s: 7e9 } }\n"
                                   "    load: KV_TIER_LOAD_LAYERWISE\n"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->batching.kv_tiers.size(), 2u);
  const scheduler::KvTierConfig& dram = r->batching.kv_tiers[0];
  EXPECT_EQ(dram.name, "host_dram");
  EXPECT_EQ(dram.capacity_blocks, 47683);
  EXPECT_DOUBLE_EQ(dram.seconds_per_block, 2097152.0 / 63e9);
  EXPECT_DOUBLE_EQ(dram.latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(dram.bytes_per_block, 2097152.0);
  EXPECT_DOUBLE_EQ(dram.energy_pj_per_block, 2097152.0 * 40);
  EXPECT_EQ(r->batching.kv_tiers[1].name, "ssd");
  EXPECT_EQ(r->batching.kv_tiers[1].latency_s, 0);
  EXPECT_TRUE(r->batching.kv_tier_write_through);
  EXPECT_TRUE(r->kv_tier_layerwise);
  // Two pipeline stages: each stage's xPUs hold half the layers' KV, so a
  // block is half the bytes, and the two in-flight batches share the tier:
  // 2 x 47,683 blocks per xPU over 2 schedulers.
  absl::StatusOr<ResolvedScenario> pp = ParseAndResolve(
      TierScenario("    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 100e9 link { "
                   "preset: \"pcie5\" } }\n",
                   "  pipeline_parallel: 2\n"));
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_EQ(pp->batching.kv_tiers[0].capacity_blocks, 95367 / 2);
  EXPECT_DOUBLE_EQ(pp->batching.kv_tiers[0].bytes_per_block, 2097152.0 / 2);
}

TEST(KvTierResolveTest, BadTiersAreRefusedNamingTheirLine) {
  auto error = [](const std::string& text) {
    absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  const std::string dram =
      "    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 100e9 link { preset: \"pcie5\" } "
      "}\n";
  // A DGX H100 has 2 TiB of host memory for its 8 GPUs.
  EXPECT_EQ(error(TierScenario("    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 300e9 "
                               "link { preset: \"pcie5\" } }\n")),
            "s.pbtxt:5: cluster.kv_tiers.tier[0].capacity_bytes_per_xpu: 3e+11 of host DRAM per "
            "xPU (the tiers in host memory) x 8 xPUs per node = 2.4e+12 bytes exceeds the node's "
            "host memory (cluster.node.host_memory_bytes = 2.19902e+12); allowed at most "
            "2.74878e+11 per xPU");
  // A host-DRAM tier and a cluster store share it.
  const std::string store =
      "    tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 200e9 link { preset: "
      "\"roce-400g\" } }\n";
  EXPECT_EQ(error(TierScenario(dram + store)),
            "s.pbtxt:6: cluster.kv_tiers.tier[1].capacity_bytes_per_xpu: 3e+11 of host DRAM per "
            "xPU (the tiers in host memory) x 8 xPUs per node = 2.4e+12 bytes exceeds the node's "
            "host memory (cluster.node.host_memory_bytes = 2.19902e+12); allowed at most "
            "2.74878e+11 per xPU");
  EXPECT_EQ(error(TierScenario(store + dram)),
            "s.pbtxt:5: cluster.kv_tiers.tier[0].kind: KV_TIER_CLUSTER_STORE must be the last "
            "tier");
  EXPECT_EQ(error(TierScenario(dram + dram)),
            "s.pbtxt:6: cluster.kv_tiers.tier[1].kind: KV_TIER_HOST_DRAM appears twice");
  EXPECT_EQ(
      error(TierScenario(dram + "    tier { kind: KV_TIER_SSD capacity_bytes_per_xpu: 1e12 }\n")),
      "s.pbtxt:6: cluster.kv_tiers.tier[1].link: not set: give a preset (\"pcie5\", ...) or "
      "bandwidth_bytes_per_s");
  EXPECT_EQ(
      error(TierScenario("    tier { kind: KV_TIER_CXL link { preset: \"pcie5\" } }\n")),
      "s.pbtxt:5: cluster.kv_tiers.tier[0].capacity_bytes_per_xpu = 0: allowed range (0, 1e+15]");
  EXPECT_EQ(
      error(TierScenario("    tier { kind: KV_TIER_CXL capacity_bytes_per_xpu: 1e6 link { preset: "
                         "\"pcie5\" } }\n")),
      "s.pbtxt:5: cluster.kv_tiers.tier[0].capacity_bytes_per_xpu: 1e+06 holds no KV block of "
      "2.09715e+06 bytes per xPU");
  EXPECT_EQ(
      error(TierScenario("    tier { capacity_bytes_per_xpu: 1e9 link { preset: \"pcie5\" } }\n")),
      "s.pbtxt:5: cluster.kv_tiers.tier[0].kind: not set; one of KV_TIER_HOST_DRAM, "
      "KV_TIER_CXL, KV_TIER_SSD, KV_TIER_CLUSTER_STORE");
  std::string no_cache = TierScenario(dram);
  no_cache.replace(no_cache.find("BATCHING_POLICY_VLLM_V1"), 23,
                   "BATCHING_POLICY_VLLM_V1 prefix_caching: false");
  EXPECT_EQ(error(no_cache),
            "s.pbtxt:4: cluster.kv_tiers: lower KV tiers keep prefix-cached blocks; set "
            "scheduler.prefix_caching: true");
  EXPECT_THAT(error(TierScenario(dram, "  attacc { stacks: 8 }\n")),
              HasSubstr("cluster.kv_tiers: not modelled with an attention device"));
  // Asynchronous loads are vLLM v1's.
  std::string async = TierScenario(dram + "    load: KV_TIER_LOAD_ASYNC\n");
  EXPECT_EQ(error(async), "ok");
  async.replace(async.find("BATCHING_POLICY_VLLM_V1"), 23,
                "BATCHING_POLICY_CHUNKED_PREFILL prefix_caching: true");
  EXPECT_EQ(error(async),
            "s.pbtxt:6: cluster.kv_tiers.load: KV_TIER_LOAD_ASYNC is vLLM v1's "
            "WAITING_FOR_REMOTE_KVS; set scheduler.batching: BATCHING_POLICY_VLLM_V1, or load "
            "BLOCKING or LAYERWISE");
}

}  // namespace
}  // namespace servesim::scenario
