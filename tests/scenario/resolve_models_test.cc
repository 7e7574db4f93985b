// Resolve for model families and their layouts (scenario/resolve_checks.cc,
// resolve_memory.cc): mixture of experts on data- and expert-parallel ranks,
// multi-head latent attention, pipeline stages, node presets, sliding
// windows; what each derives and the layouts each refuses.
#include <string>

#include "absl/strings/str_cat.h"
#include "devices/presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/scenario/scenario_test_util.h"

namespace servesim::scenario {
namespace {

using test::ParseAndResolve;
using ::testing::HasSubstr;

// ------------------------------------------------- mixture of experts ----

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
