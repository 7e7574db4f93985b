// Resolve (scenario/scenario.h): every value against its allowed range,
// presets, and the configuration as a whole, with messages that name the
// file and line. The memory plan, the devices and the model families have
// their own tests (resolve_memory_test.cc, resolve_devices_test.cc,
// resolve_models_test.cc).
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/scenario/scenario_test_util.h"

namespace servesim::scenario {
namespace {

using test::kExplicitModel;
using test::kValid;
using test::ParseAndResolve;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ----------------------------------------------------- value ranges ----

TEST(ScenarioRangeTest, ReplicasZero) {
  std::string text = kValid;
  text.replace(text.find("replicas: 2"), 11, "replicas: 0");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:6: cluster.replicas = 0: allowed range [1, 4096]");
}

TEST(ScenarioRangeTest, TensorParallelMustDivideHeads) {
  // 96 heads: 3 divides them (and d_ff 49,152), so TP 5 is the bad value.
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-80gb\" }\n"
      "  tensor_parallel: 5\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:4: cluster.tensor_parallel = 5: must divide "
            "model.num_heads (96)");
}

TEST(ScenarioRangeTest, TensorParallelThreeDividesGpt3ButDoesNotFit) {
  // 96 heads, 96 KV heads and d_ff 49,152 all split three ways; what fails
  // is memory: 349.14 GB / 3 = 116.38 GB of weights per 80 GiB xPU.
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-80gb\" }\n"
      "  tensor_parallel: 3\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:4: GPT-3 175B does not fit a replica of 3 x "
                         "a100-80gb: required "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("(weights 116.38 GB"));
}

TEST(ScenarioRangeTest, TensorParallelMustDivideFeedForward) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  text.replace(text.find("d_ff: 3072"), 10, "d_ff: 3070");
  text.replace(text.find("cluster {"), 9, "cluster { tensor_parallel: 4");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:11: cluster.tensor_parallel = 4: must divide model.d_ff (3070)");
}

TEST(ScenarioRangeTest, TensorParallelAboveLimit) {
  std::string text = kValid;
  text.replace(text.find("tensor_parallel: 1"), 18, "tensor_parallel: 128");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:7: cluster.tensor_parallel = 128: allowed range [1, 64]");
}

TEST(ScenarioRangeTest, KvWatermark) {
  const std::string text = std::string(kValid) + "scheduler {\n  kv_watermark: 0.7\n}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:12: scheduler.kv_watermark = 0.7: allowed range [0, 0.5)");
}

TEST(ScenarioRangeTest, XpuComputeUtilization) {
  std::string text = kValid;
  text.replace(text.find("xpu { preset: \"a100-80gb\" }"), 27,
               "xpu { preset: \"a100-80gb\"\n    compute_utilization: 1.5 }");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:9: cluster.xpu.compute_utilization = 1.5: allowed range (0, 1]");
}

TEST(ScenarioRangeTest, MemoryBytesHaveAnUpperLimit) {
  // Found by scenario_fuzz: 1e96 bytes of xPU memory made a KV block count
  // past int64 (undefined behaviour in the conversion). 1 PB is the limit,
  // for an xPU and for an attention unit alike; 1 PB itself resolves.
  auto xpu = ParseAndResolve(kValid, {"cluster.xpu.memory_bytes=1e96"});
  ASSERT_FALSE(xpu.ok());
  EXPECT_EQ(xpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(xpu.status().message()),
            "s.pbtxt (--set cluster.xpu.memory_bytes): cluster.xpu.memory_bytes = 1e+96: "
            "allowed range (0, 1e+15]");
  auto at_limit = ParseAndResolve(kValid, {"cluster.xpu.memory_bytes=1e15"});
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_GT(at_limit->kv.blocks, 0);
  EXPECT_LT(at_limit->kv.blocks, scheduler::kMaxKvBlocks);
  // --set refuses inf itself; a file can still write it.
  std::string text = kValid;
  text.replace(text.find("xpu { preset: \"a100-80gb\" }"), 27,
               "xpu { preset: \"a100-80gb\"\n    memory_bytes: inf }");
  auto inf = ParseAndResolve(text);
  ASSERT_FALSE(inf.ok());
  EXPECT_EQ(std::string(inf.status().message()),
            "s.pbtxt:9: cluster.xpu.memory_bytes = inf: allowed range (0, 1e+15]");

  auto unit = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } } }\n",
      {"cluster.attention_pool.memory_bytes_per_unit=2e15"});
  ASSERT_FALSE(unit.ok());
  EXPECT_EQ(std::string(unit.status().message()),
            "s.pbtxt (--set cluster.attention_pool.memory_bytes_per_unit): "
            "cluster.attention_pool.memory_bytes_per_unit = 2e+15: allowed range (0, 1e+15]");
}

TEST(ScenarioRangeTest, SloTpotZero) {
  const std::string text = std::string(kValid) + "slo { ttft_s: 1\n  tpot_s: 0 }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()), "s.pbtxt:12: slo.tpot_s = 0: expected > 0");
}

TEST(ScenarioRangeTest, ClusterMemoryUtilization) {
  std::string text = kValid;
  text.replace(text.find("  replicas: 2\n"), 14, "  replicas: 2\n  memory_utilization: 0\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:7: cluster.memory_utilization = 0: allowed range (0, 1]");
}

TEST(ScenarioRangeTest, KvHeadsMustDivideHeads) {
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(kExplicitModel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: model.num_kv_heads = 5: must divide num_heads (12)");
}

TEST(ScenarioRangeTest, KvHeadsAboveHeads) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 24");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: model.num_kv_heads = 24: allowed range [1, 12]");
}

TEST(ScenarioRangeTest, ExplicitModelWithDividingKvHeadsResolves) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model.num_kv_heads, 4);
  EXPECT_EQ(r->proto.model().name(), "custom");
}

TEST(ScenarioRangeTest, MissingModelDimensionNamesTheFirstOne) {
  std::string text = kExplicitModel;
  text.erase(text.find("  d_model: 768\n"), 15);
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  // d_model was not written: the location is the model block's line.
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:1: model.d_model is not set: set model.preset or every "
            "model dimension");
}

TEST(ScenarioRangeTest, MissingXpuFigureWithoutPreset) {
  const std::string text =
      "model { preset: \"llama2-7b\" }\n"
      "cluster {\n"
      "  replicas: 1\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:2: cluster.xpu.peak_flops_fp16 is not set: set "
            "cluster.xpu.preset or every xPU figure");
}

// ------------------------------------------------------------ presets ----

TEST(ScenarioPresetTest, UnknownModelPreset) {
  std::string text = kValid;
  text.replace(text.find("llama2-7b"), 9, "gpt5");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:3: model.preset: unknown model preset \"gpt5\"; known: "
            "codellama-34b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, gpt2-large, gpt2-medium, "
            "gpt2-xl, gpt3-175b, llama-65b, llama2-13b, llama2-70b, llama2-7b, llama3.1-405b, "
            "llama3.1-70b, "
            "llama3.1-8b, "
            "llama3.2-1b, llama3.2-3b, mistral-7b, mixtral-8x22b, mixtral-8x7b, mt-nlg-530b, "
            "opt-13b, opt-6.7b, opt-66b, qwen3-14b, qwen3-235b-a22b, qwen3-30b-a3b, "
            "qwen3-30b-a3b-instruct-2507, qwen3-32b, qwen3-8b");
}

TEST(ScenarioPresetTest, UnknownXpuPreset) {
  std::string text = kValid;
  text.replace(text.find("a100-80gb"), 9, "tpu-v9");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:8: cluster.xpu.preset: unknown xpu preset \"tpu-v9\"; "
            "known: a100-40gb, a100-80gb, a100-hbm3, b200-180gb, h100-pcie-80gb, h100-sxm-80gb, "
            "h200-sxm-141gb, l40s, mi300x, rtx-4090, rtx-pro-6000");
}

TEST(ScenarioPresetTest, UnknownLinkPreset) {
  std::string text = kValid;
  text.replace(text.find("  tensor_parallel: 1\n"), 21,
               "  tensor_parallel: 1\n  interconnect {\n    preset: \"nvlink9\"\n  }\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:9: cluster.interconnect.preset: unknown link preset "
            "\"nvlink9\"; known: ethernet-100g, ethernet-400g, infiniband-hdr, infiniband-ndr, "
            "infiniband-xdr, nvlink3, nvlink4, nvlink5, pcie4, pcie5, roce-400g, xgmi-mi300x");
}

TEST(ScenarioPresetTest, InterconnectDefaultsToTheXpusOwnLink) {
  auto link_of = [](const std::string& cluster) {
    absl::StatusOr<ResolvedScenario> r = ParseAndResolve(
        "model { preset: \"llama3.1-8b\" }\ncluster {\n" + cluster + "\n  tensor_parallel: 2\n}\n");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->proto.cluster().interconnect() : servesim::v1::LinkSpec();
  };
  // PCIe cards all-reduce over PCIe: the RTX PRO 6000 Server has no NVLink.
  const auto pcie = link_of("  xpu { preset: \"rtx-pro-6000\" }");
  EXPECT_EQ(pcie.preset(), "pcie5");
  EXPECT_EQ(pcie.bandwidth_bytes_per_s(), 63e9);
  EXPECT_EQ(link_of("  xpu { preset: \"l40s\" }").preset(), "pcie4");
  EXPECT_EQ(link_of("  xpu { preset: \"h100-sxm-80gb\" }").preset(), "nvlink4");
  EXPECT_EQ(link_of("  xpu { preset: \"h100-pcie-80gb\" }").preset(), "pcie5");
  EXPECT_EQ(link_of("  xpu { preset: \"b200-180gb\" }").bandwidth_bytes_per_s(), 900e9);
  // The scenario's own link wins; an xPU without a preset gets NVLink 3.
  EXPECT_EQ(link_of("  xpu { preset: \"rtx-pro-6000\" }\n  interconnect { preset: \"nvlink4\" }")
                .preset(),
            "nvlink4");
  EXPECT_EQ(
      link_of("  xpu { peak_flops_fp16: 1e14 memory_bytes: 8e10 memory_bw_bytes_per_s: 1e12 }")
          .preset(),
      "nvlink3");
}

TEST(ScenarioPresetTest, UnknownFrontendPreset) {
  std::string text = kValid;
  text.replace(text.find("  replicas: 2\n"), 14,
               "  replicas: 2\n  frontend { preset: \"carrier-pigeon\" }\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:7: cluster.frontend.preset: unknown link "
                         "preset \"carrier-pigeon\"; known: ethernet-100g"));
}

// ------------------------------------------------- whole configuration ----

TEST(ScenarioResolveTest, OverlapRuleNeedsADeviceAndAPolicyTheAuthorsTime) {
  auto run = [](const char* cluster) {
    return ParseAndResolve(absl::StrCat("model { preset: \"gpt3-175b\" }\n",
                                        "cluster { xpu { preset: \"a100-hbm3\" } "
                                        "tensor_parallel: 8 ",
                                        cluster, " }\n"));
  };
  auto none = run("overlap_rule: OVERLAP_RULE_ATTACC_SIMULATOR");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("cluster.overlap_rule"));
  EXPECT_THAT(none.status().message(), HasSubstr("needs cluster.attacc or"));
  auto batch =
      run("attacc { } overlap: OVERLAP_POLICY_BATCH_LEVEL "
          "overlap_rule: OVERLAP_RULE_ATTACC_SIMULATOR");
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(batch.status().message(), HasSubstr("serial and head-level overlap only"));
  auto head =
      run("attacc { } overlap: OVERLAP_POLICY_HEAD_LEVEL "
          "overlap_rule: OVERLAP_RULE_ATTACC_SIMULATOR");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->planner.overlap_rule, scheduler::OverlapRule::kAttAccSimulator);
  auto plain = run("attacc { } overlap: OVERLAP_POLICY_HEAD_LEVEL");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->planner.overlap_rule, scheduler::OverlapRule::kListSchedule);
}

TEST(ScenarioResolveTest, OnDieModelBadInputNamesTheFieldAndRange) {
  auto run = [](const char* on_die) {
    return ParseAndResolve(absl::StrCat("model { preset: \"gpt2-medium\" }\n",
                                        "cluster { xpu { preset: \"a100-80gb\" on_die { ", on_die,
                                        " } } }\n"));
  };
  auto good = run("l2_pj_per_byte: 2.4 cores: 108 l1_bytes_per_core: 196608");
  ASSERT_TRUE(good.ok()) << good.status();
  auto cores = run("l2_pj_per_byte: 2.4 l1_bytes_per_core: 196608");
  ASSERT_FALSE(cores.ok());
  EXPECT_THAT(cores.status().message(), HasSubstr("cluster.xpu.on_die.cores"));
  EXPECT_THAT(cores.status().message(), HasSubstr("[1, 100000]"));
  auto l1 = run("cores: 108 l1_bytes_per_core: 100");
  ASSERT_FALSE(l1.ok());
  EXPECT_THAT(l1.status().message(), HasSubstr("cluster.xpu.on_die.l1_bytes_per_core"));
  auto energy = run("cores: 108 l1_bytes_per_core: 196608 l1_pj_per_byte: -1");
  ASSERT_FALSE(energy.ok());
  EXPECT_THAT(energy.status().message(), HasSubstr("cluster.xpu.on_die.l1_pj_per_byte"));
}

TEST(ScenarioResolveTest, Llama2_70bTensorParallelAboveKvHeadsResolves) {
  const std::string text =
      "model { preset: \"llama2-70b\" }\n"
      "cluster { tensor_parallel: 16 xpu { preset: \"a100-80gb\" } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensor_parallel, 16);
  EXPECT_EQ(r->model.num_kv_heads, 8);
  EXPECT_GT(r->kv.blocks, 0);
}

TEST(ScenarioResolveTest, TensorParallelNeitherDividingNorMultipleOfKvHeads) {
  // 12 heads, 4 KV heads, d_ff 3072: TP 6 divides the heads and d_ff but is
  // neither a divisor nor a multiple of the 4 KV heads.
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  text.replace(text.find("cluster {"), 9, "cluster { tensor_parallel: 6");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:11: cluster.tensor_parallel = 6: must divide "
            "model.num_kv_heads (4) or be a multiple of it");
}

TEST(ScenarioResolveTest, ResolvedFieldsFollowTheScenario) {
  const std::string text = std::string(kValid) +
                           "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL "
                           "routing: ROUTING_POLICY_LEAST_KV_LOAD }\n"
                           "slo { ttft_s: 2 tpot_s: 0.05 }\nseed: 9\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replicas, 2);
  EXPECT_EQ(r->seed, 9u);
  EXPECT_EQ(r->batching.policy, scheduler::BatchingPolicy::kChunkedPrefill);
  EXPECT_EQ(r->batching.max_tokens_per_iteration, 512);
  EXPECT_EQ(r->batching.max_context_tokens, 4096);
  EXPECT_EQ(r->routing, scheduler::RoutingPolicy::kLeastKvLoad);
  EXPECT_DOUBLE_EQ(r->ttft_slo_s, 2.0);
  EXPECT_DOUBLE_EQ(r->tpot_slo_s, 0.05);
  ASSERT_TRUE(r->xpu_device.has_gpu());
  EXPECT_EQ(r->xpu_device.gpu().xpu().preset(), "a100-80gb");
  EXPECT_EQ(r->xpu_device.gpu().interconnect().preset(), "nvlink3");
}

}  // namespace
}  // namespace servesim::scenario
