// Resolve (scenario/scenario.h): every value against its allowed range,
// presets, and the configuration as a whole (weights must fit memory, KV
// capacity, attention pools), with messages that name the file and line.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "devices/presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/scenario/scenario_test_util.h"

namespace servesim::scenario {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL;
using servesim::v1::BATCHING_POLICY_PREFILL_FIRST;
using test::kExplicitModel;
using test::kPath;
using test::kValid;
using test::Normalized;
using test::Parse;
using test::ParseAndResolve;

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
  text.replace(text.find("  replicas: 2\n"), 14,
               "  replicas: 2\n  memory_utilization: 0\n");
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

TEST(ScenarioResolveTest, AttentionPoolHoldsTheKvAndTakesTheModelShape) {
  // GPT-2 medium on one A100 with 2 ToPick units (defaults: 8 GiB each, one
  // HBM2 stack of 8 channels; pcie4 link). KV per token: 2 x 24 layers x 16
  // heads x 64 x 2 bytes = 98,304; 2 x 8 GiB / (98,304 x 16) = 10,922.7 ->
  // 10,922 blocks.
  const std::string text =
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } units: 2 } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_attention_device);
  EXPECT_EQ(r->attention_kind, "topick");
  EXPECT_EQ(r->attention_label, "topick x 2");
  EXPECT_EQ(r->attention_units, 2);
  EXPECT_DOUBLE_EQ(r->device_memory_bytes, 2 * 8.0 * (1 << 30));
  EXPECT_EQ(r->kv.blocks, 10922);
  const auto& dev = r->proto.cluster().attention_pool().topick();
  EXPECT_EQ(dev.topick().preset(), "topick");
  EXPECT_EQ(dev.model().layers(), 24);
  EXPECT_EQ(dev.model().heads(), 16);
  EXPECT_EQ(dev.model().d_head(), 64);
  EXPECT_EQ(r->attention_link.preset(), "pcie4");
  ASSERT_NE(r->attention_shared, nullptr);
  EXPECT_DOUBLE_EQ(r->attention_shared->Describe().memory_bytes, 2 * 8.0 * (1 << 30));
  // SpAtten: 16 channels, so 16 GiB a unit by default.
  absl::StatusOr<ResolvedScenario> sp = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { spatten { } units: 1 } }\n");
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->attention_kind, "spatten");
  EXPECT_DOUBLE_EQ(sp->device_memory_bytes, 16.0 * (1 << 30));
  // CTA: preset cta_0 by default, the model's shape, 8 channels: 8 GiB; a
  // bad width names the field (at the scenario's line).
  absl::StatusOr<ResolvedScenario> ct = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta { } units: 2 } }\n");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->attention_kind, "cta");
  EXPECT_EQ(ct->attention_label, "cta_0 x 2");
  const auto& cd = ct->proto.cluster().attention_pool().cta();
  EXPECT_EQ(cd.cta().preset(), "cta_0");
  EXPECT_DOUBLE_EQ(cd.cta().kv1_width(), 0.6);
  EXPECT_EQ(cd.model().layers(), 24);
  EXPECT_EQ(cd.model().heads(), 16);
  EXPECT_EQ(cd.model().d_head(), 64);
  EXPECT_DOUBLE_EQ(ct->device_memory_bytes, 2 * 8.0 * (1 << 30));
  absl::StatusOr<ResolvedScenario> bad = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta { cta { kv2_width: -1 } } } }\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cta device: kv2_width = -1"));
  // LAD: its 5 HBM2 cubes, 40 GiB a unit; the model shape from LLaMA-2-7B.
  absl::StatusOr<ResolvedScenario> ld = ParseAndResolve(
      "model { preset: \"llama2-7b\" }\n"
      "cluster { xpu { preset: \"a100-40gb\" } attention_pool { lad { } units: 1 } }\n");
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->attention_kind, "lad");
  EXPECT_EQ(ld->attention_label, "lad_1.5 x 1");
  EXPECT_DOUBLE_EQ(ld->device_memory_bytes, 40.0 * (1 << 30));
  const auto& lm = ld->proto.cluster().attention_pool().lad();
  EXPECT_EQ(lm.lad().tiles(), 6);
  EXPECT_EQ(lm.model().layers(), 32);
  EXPECT_EQ(lm.model().heads(), 32);
  EXPECT_EQ(lm.model().d_head(), 128);
}

TEST(ScenarioResolveTest, AttentionPoolBadInputNamesTheField) {
  auto text = [](const char* pool, const char* cluster) {
    return absl::StrCat("model { preset: \"gpt2-medium\" }\n",
                        "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } ",
                        pool, " } ", cluster, " }\n");
  };
  auto run = [&](const char* pool, const char* cluster) {
    return ParseAndResolve(text(pool, cluster));
  };
  auto units = run("units: 0", "");
  ASSERT_FALSE(units.ok());
  EXPECT_THAT(units.status().message(), HasSubstr("cluster.attention_pool.units"));
  EXPECT_THAT(units.status().message(), HasSubstr("[1, 1024]"));
  auto ff = run("", "overlap: OVERLAP_POLICY_HEAD_LEVEL_FF");
  ASSERT_FALSE(ff.ok());
  EXPECT_THAT(ff.status().message(), HasSubstr("cluster.attacc's GEMV units"));
  auto both = run("", "attacc { }");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(), HasSubstr("at most one of cluster.attacc"));
  auto preset = run("", "");
  ASSERT_TRUE(preset.ok()) << preset.status();
  auto bad = ParseAndResolve(text("", ""),
                             {"cluster.attention_pool.topick.topick.preset=nope"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cluster.attention_pool.topick.topick.preset"));
}

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
  auto batch = run("attacc { } overlap: OVERLAP_POLICY_BATCH_LEVEL "
                   "overlap_rule: OVERLAP_RULE_ATTACC_SIMULATOR");
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(batch.status().message(), HasSubstr("serial and head-level overlap only"));
  auto head = run("attacc { } overlap: OVERLAP_POLICY_HEAD_LEVEL "
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

// ------------------------------------------------------------ vLLM v1 --

constexpr char kLlama31OnRtxPro[] =
    "model { preset: \"llama3.1-8b\" }\n"
    "cluster { xpu { preset: \"rtx-pro-6000\" } }\n"
    "scheduler { batching: BATCHING_POLICY_VLLM_V1 max_batch_size: 128 "
    "max_tokens_per_iteration: 2048 }\n"
    "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n";

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

// ----------------------------------------------------------- profiles --

std::string ProfilesRoot() { return std::string(SERVESIM_SOURCE_DIR) + "/examples/vllm/profiles"; }

TEST(ProfileResolveTest, TheBundleIsFoundByGpuModelDtypeAndTp) {
  const std::string root = "cluster.profile.root=" + ProfilesRoot();
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(kLlama31OnRtxPro, {root.c_str()});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->profile, nullptr);
  EXPECT_TRUE(r->fallbacks.empty());
  const auto& ref = r->xpu_device.gpu().profile();
  EXPECT_EQ(ref.dir(), ProfilesRoot() + "/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1");
  EXPECT_EQ(ref.fingerprint(), r->profile->fingerprint());
  EXPECT_EQ(ref.qkv_n(), (32 + 2 * 8) * 128);
  EXPECT_EQ(ref.attn_out_k(), 4096);
  EXPECT_EQ(ref.ff1_n(), 2 * 14336);
  EXPECT_EQ(ref.ff2_k(), 14336);
  EXPECT_EQ(ref.lm_head_n(), 128256);
}

TEST(ProfileResolveTest, AMissingTpFolderIsAnErrorWhenRequiredElseAListedFallback) {
  const std::string root = "cluster.profile.root=" + ProfilesRoot();
  absl::StatusOr<ResolvedScenario> fallback =
      ParseAndResolve(kLlama31OnRtxPro, {root.c_str(), "cluster.tensor_parallel=4"});
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(fallback->profile, nullptr);
  ASSERT_EQ(fallback->fallbacks.size(), 1u);
  EXPECT_EQ(fallback->fallbacks[0],
            "profile: no tp4 folder in " + ProfilesRoot() +
                "/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16 for cluster.tensor_parallel = 4 (it "
                "has: tp1, tp2); GPU costs from the roofline");
  absl::StatusOr<ResolvedScenario> required = ParseAndResolve(
      kLlama31OnRtxPro, {root.c_str(), "cluster.tensor_parallel=4", "cluster.profile.required=true"});
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(required.status().message()),
            "s.pbtxt (--set cluster.profile.root): cluster.profile: no tp4 folder in " + ProfilesRoot() +
                "/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16 for cluster.tensor_parallel = 4 (it "
                "has: tp1, tp2)");
  // A model the root has no bundle of.
  std::string qwen = kLlama31OnRtxPro;
  qwen.replace(qwen.find("llama3.1-8b"), 11, "qwen3-8b");
  absl::StatusOr<ResolvedScenario> none = ParseAndResolve(qwen, {root.c_str()});
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_EQ(none->fallbacks.size(), 1u);
  EXPECT_EQ(none->fallbacks[0], "profile: no bundle folder " + ProfilesRoot() +
                                    "/RTXPRO6000/Qwen/Qwen3-8B/bf16; GPU costs from the roofline");
}

}  // namespace
}  // namespace servesim::scenario

// ------------------------------------------------- mixture of experts ----

namespace servesim::scenario {
namespace {

std::string MoeScenario(const std::string& cluster_extra, const std::string& model_extra = "") {
  return absl::StrCat("model { preset: \"qwen3-30b-a3b\" ", model_extra,
                      " }\n"
                      "cluster {\n"
                      "  xpu { preset: \"h100-sxm-80gb\" }\n  ",
                      cluster_extra, "\n}\n");
}

TEST(ScenarioMoeTest, DataParallelExpertParallelSplitsTheExpertsOnly) {
  auto r = ParseAndResolve(MoeScenario("data_parallel: 2 expert_parallel: true"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->data_parallel, 2);
  // Each GPU: everything but the routed experts, and half of those.
  const double routed = 48.0 * 128 * 3 * 2048 * 768 * 2;
  EXPECT_DOUBLE_EQ(r->weight_bytes_per_xpu, r->model.WeightBytes() - routed / 2);
  EXPECT_NE(r->planner.routing, nullptr);
  EXPECT_EQ(r->planner.routing->ranks(), 2);
  // Without expert parallelism the routing model has one rank (every GPU
  // holds a slice of every expert), and the weights split the same.
  auto w = ParseAndResolve(MoeScenario("data_parallel: 2"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->planner.routing->ranks(), 1);
  EXPECT_DOUBLE_EQ(w->weight_bytes_per_xpu, r->weight_bytes_per_xpu);
}

TEST(ScenarioMoeTest, LayoutsThatDoNotDivideAreRefusedWithTheNumbers) {
  auto r = ParseAndResolve(MoeScenario("data_parallel: 3 expert_parallel: true"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("cluster.data_parallel = 3: expert parallelism splits model.num_experts "
                        "(128) over data_parallel x tensor_parallel = 3 xPUs"));
  r = ParseAndResolve(MoeScenario("data_parallel: 5"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.expert_d_ff (768) is split over data_parallel x tensor_parallel = "
                        "5 xPUs"));
  r = ParseAndResolve(MoeScenario("", "experts_per_token: 200"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.experts_per_token = 200: allowed range [1, 128]"));
}

TEST(ScenarioMoeTest, MoeOnlySettingsOnADenseModelAreRefused) {
  auto r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" }\ncluster {\n  xpu { preset: \"h100-sxm-80gb\" }\n"
      "  data_parallel: 2\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("cluster.data_parallel = 2: data-parallel ranks in lockstep are for MoE "
                        "models"));
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" expert_d_ff: 10 }\ncluster {\n  xpu { preset: "
      "\"h100-sxm-80gb\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.expert_d_ff = set: only for MoE"));
}

TEST(ScenarioMoeTest, AttentionDevicesSitBesideOneRankOfRoutedExpertsOnly) {
  auto r = ParseAndResolve(MoeScenario(
      "attacc { preset: \"attacc_bank\" stacks: 40 } overlap: OVERLAP_POLICY_HEAD_LEVEL"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_attention_device);
  r = ParseAndResolve(
      MoeScenario("data_parallel: 2 expert_parallel: true attacc { preset: \"attacc_bank\" }"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("attention devices are modelled beside one data-parallel rank"));
  r = ParseAndResolve(MoeScenario("attacc { preset: \"attacc_bank\" }", "shared_experts: 1"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("routed experts only"));
  r = ParseAndResolve(
      MoeScenario("attacc { preset: \"attacc_bank\" } overlap: OVERLAP_POLICY_HEAD_LEVEL_FF"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("an MoE model's experts stay on the xPUs"));
}

std::string DeepSeekScenario(const std::string& cluster_extra,
                             const std::string& model_extra = "") {
  return absl::StrCat("model { preset: \"deepseek-v3\" ", model_extra,
                      " }\n"
                      "cluster {\n"
                      "  xpu { preset: \"h200-sxm-141gb\" }\n  ",
                      cluster_extra, "\n}\n");
}

TEST(ScenarioMlaTest, DeepSeekV3OnDataParallelRanksHoldsItsLatentCache) {
  auto r = ParseAndResolve(DeepSeekScenario("data_parallel: 32 expert_parallel: true"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->model.mla());
  // Per GPU: everything but the routed experts (FP8, embedding and LM head
  // in bf16), and 8 of every MoE layer's 256 experts.
  const double routed = 58.0 * 256 * 3 * 7168 * 2048;
  EXPECT_DOUBLE_EQ(r->weight_bytes_per_xpu, r->model.WeightBytes() - routed + routed / 32);
  EXPECT_EQ(r->xpu_device.gpu().kv_dtype(), servesim::v1::DTYPE_BF16);
  // KV: 61 x 576 x 2 bytes per token per rank, in blocks of 16 tokens.
  EXPECT_EQ(r->model.KvBytesPerToken(), 61 * 576 * 2);
  EXPECT_EQ(r->kv.blocks, static_cast<int64_t>(r->kv.usable_bytes_per_xpu / (16 * 70272.0)));
}

TEST(ScenarioMlaTest, InconsistentLatentShapesAndAttentionDevicesAreRefused) {
  auto r = ParseAndResolve(DeepSeekScenario("tensor_parallel: 8", "num_kv_heads: 8"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.num_kv_heads = 8: multi-head latent attention"));
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" rope_head_dim: 64 }\ncluster {\n  xpu { preset: "
      "\"h100-sxm-80gb\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.rope_head_dim = set: only for multi-head latent attention"));
  r = ParseAndResolve(DeepSeekScenario("tensor_parallel: 8 attacc { preset: \"attacc_bank\" }"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("multi-head latent attention has no mapping on the attention devices"));
  // Too large for one GPU: refused with the numbers.
  r = ParseAndResolve(DeepSeekScenario(""));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does not fit a replica of 1 x"));
}

TEST(ScenarioMlaTest, Fp8OnAnXpuWithoutFp8CoresIsWeightOnlyAndSaysSo) {
  auto r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" dtype: DTYPE_FP8 kv_dtype: DTYPE_FP8 }\n"
      "cluster {\n  xpu { preset: \"a100-80gb\" }\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->fallbacks.size(), 1u);
  EXPECT_THAT(r->fallbacks[0], HasSubstr("weight-only FP8"));
  EXPECT_EQ(r->model.KvBytesPerToken(), 32 * 2 * 8 * 128);
}

TEST(ScenarioPipelineTest, StagesHoldTheirLayersAndAnEndMatrixEach) {
  auto r = ParseAndResolve(
      "model { preset: \"llama3.1-405b\" }\n"
      "cluster {\n  xpu { preset: \"h100-sxm-80gb\" }\n  tensor_parallel: 8\n"
      "  pipeline_parallel: 2\n  xpus_per_node: 8\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pipeline_parallel, 2);
  EXPECT_EQ(r->ranks(), 2);
  EXPECT_EQ(r->pipeline.layers, (std::vector<int64_t>{63, 63}));
  // Half the layers and one of the two vocabulary matrices per stage:
  // exactly half of a TP8 xPU's share.
  EXPECT_NEAR(r->weight_bytes_per_xpu, r->model.WeightBytes() / 16, 1);
  // The stages sit on two nodes: the hand-off crosses the NICs (the
  // internode default, InfiniBand NDR).
  EXPECT_DOUBLE_EQ(r->pipeline.link_bytes_per_s, 50e9);
  // KV: 63 layers x 8 / 8 heads x 128 x 2 x 2 bytes per token on each xPU,
  // shared by the two in-flight batches.
  const double per_token = 63.0 * 1 * 128 * 2 * 2;
  EXPECT_EQ(r->kv.blocks, static_cast<int64_t>(r->kv.usable_bytes_per_xpu / (16 * per_token)) / 2);
}

TEST(ScenarioPipelineTest, LayoutsItCannotServeAreRefused) {
  auto r = ParseAndResolve(
      "model { preset: \"llama3.2-1b\" }\ncluster {\n  xpu { preset: \"h100-sxm-80gb\" }\n"
      "  pipeline_parallel: 17\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("cluster.pipeline_parallel = 17: a stage holds at least one layer: at "
                        "most model.num_layers (16)"));
  r = ParseAndResolve(MoeScenario("data_parallel: 2 pipeline_parallel: 2"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("pipeline stages and data-parallel ranks together are not modelled"));
  r = ParseAndResolve(MoeScenario("pipeline_parallel: 2 attacc { preset: \"attacc_bank\" }"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("attention devices are modelled beside one pipeline stage"));
}

TEST(ScenarioNodeTest, ANodePresetFillsTheXpuTheNodeSizeAndTheNic) {
  auto r = ParseAndResolve(
      "model { preset: \"llama3.1-405b\" }\ncluster {\n  node { preset: \"dgx-h100\" }\n"
      "  tensor_parallel: 8\n  pipeline_parallel: 2\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& c = r->proto.cluster();
  EXPECT_EQ(c.xpu().preset(), "h100-sxm-80gb");
  EXPECT_EQ(c.xpus_per_node(), 8);
  EXPECT_EQ(c.internode().preset(), "infiniband-ndr");
  EXPECT_DOUBLE_EQ(c.interconnect().bandwidth_bytes_per_s(), 450e9);  // the H100's NVLink 4
  EXPECT_DOUBLE_EQ(r->pipeline.link_bytes_per_s, 50e9);               // the stages sit on two nodes
  // The cluster's own fields win.
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" }\ncluster {\n  node { preset: \"dgx-h100\" }\n"
      "  internode { preset: \"roce-400g\" }\n  xpus_per_node: 4\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->proto.cluster().internode().preset(), "roce-400g");
  EXPECT_EQ(r->proto.cluster().xpus_per_node(), 4);
  // A NIC bandwidth given alone keeps the node's NIC's latency and energy.
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" }\ncluster {\n  node { preset: \"dgx-h100\" }\n"
      "  internode { bandwidth_bytes_per_s: 25e9 }\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  const auto ndr = devices::LinkPreset("infiniband-ndr");
  ASSERT_TRUE(ndr.ok());
  EXPECT_DOUBLE_EQ(r->proto.cluster().internode().bandwidth_bytes_per_s(), 25e9);
  EXPECT_DOUBLE_EQ(r->proto.cluster().internode().latency_s(), ndr->latency_s());
  EXPECT_DOUBLE_EQ(r->proto.cluster().internode().energy_pj_per_byte(), ndr->energy_pj_per_byte());
  EXPECT_GT(ndr->latency_s(), 0);
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" }\ncluster {\n  node { preset: \"dgx-z\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("cluster.node.preset: unknown node preset \"dgx-z\"; known: dgx-a100, "
                        "dgx-h100, dgx-h200, hgx-b200"));
}

TEST(ScenarioSlidingWindowTest, GptOssServesFromOneGpuAndMisusedFieldsAreRefused) {
  auto r = ParseAndResolve(
      "model { preset: \"gpt-oss-120b\" }\ncluster {\n  xpu { preset: \"h100-sxm-80gb\" }\n}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->weight_bytes_per_xpu / 1e9, 65.2, 0.1);
  EXPECT_EQ(r->xpu_device.gpu().expert_dtype(), servesim::v1::DTYPE_MXFP4);
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" dtype: DTYPE_MXFP4 }\ncluster {\n  xpu { preset: "
      "\"h100-sxm-80gb\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("model.dtype = DTYPE_MXFP4: MXFP4 is for an MoE model's routed experts"));
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" full_attention_interval: 2 }\ncluster {\n  xpu { "
      "preset: \"h100-sxm-80gb\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("only with sliding-window layers (set model.sliding_window)"));
  r = ParseAndResolve(
      "model { preset: \"llama3.1-8b\" sliding_window: 4096 }\ncluster {\n  xpu { preset: "
      "\"a100-hbm3\" }\n  attacc { preset: \"attacc_bank\" }\n}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("sliding-window layers are not modelled on the attention devices"));
}

}  // namespace
}  // namespace servesim::scenario

namespace servesim::scenario {
namespace {

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
