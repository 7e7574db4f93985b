// Resolve's devices (scenario/resolve_devices.cc): the xPU's profile bundle
// (found, or a listed fallback) and the attention pools that hold the KV.
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

// ---------------------------------------------------- attention pools --

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
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta { cta { kv2_width: -1 } } } "
      "}\n");
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
  auto bad = ParseAndResolve(text("", ""), {"cluster.attention_pool.topick.topick.preset=nope"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cluster.attention_pool.topick.topick.preset"));
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
  absl::StatusOr<ResolvedScenario> required =
      ParseAndResolve(kLlama31OnRtxPro,
                      {root.c_str(), "cluster.tensor_parallel=4", "cluster.profile.required=true"});
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(required.status().message()),
            "s.pbtxt (--set cluster.profile.root): cluster.profile: no tp4 folder in " +
                ProfilesRoot() +
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
