// Device layer: fp16 conversion, model arithmetic, presets, the registry,
// the GPU roofline against hand-computed values, and the exact-attention
// reference against analytic results.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/rng.h"
#include "devices/cta/cta_device.h"
#include "devices/gpu/gpu_device.h"
#include "devices/gpu/on_die.h"
#include "devices/lad/lad_device.h"
#include "devices/model.h"
#include "devices/pool.h"
#include "devices/presets.h"
#include "devices/prune_common.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

// ------------------------------------------------------------------ fp16 --

TEST(HalfTest, ExactValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);             // largest finite
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.0.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3 * 2^-11 is halfway between 0x3C01 and 0x3C02: ties to 0x3C02.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // rounds past 65504: infinity
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
}

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0) continue;  // NaN
    ASSERT_EQ(FloatToHalf(HalfToFloat(bits)), bits) << std::hex << h;
  }
}

// ---------------------------------------------------------------- models --

ModelDims Model(const char* preset) {
  auto spec = ModelPreset(preset);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto m = ModelDimsFromSpec(*spec);
  m.bytes_per_element = 2;
  return m;
}

TEST(ModelTest, Gpt3Sizes) {
  const ModelDims m = Model("gpt3-175b");
  // 96 x (4d^2 + 8d^2 + 4d) + 50257 d (tied) + 2d, d = 12288.
  EXPECT_EQ(m.TotalParams(), 174'568'476'672);
  // AttAcc §3.2: 2 x N_dec x d_emb elements per token; fp16.
  EXPECT_EQ(m.KvBytesPerToken(), 2 * 96 * 12288 * 2);
  // AttAcc §3.2: 18 GB (GiB) per request at L_in + L_out = 4096.
  EXPECT_NEAR(4096.0 * m.KvBytesPerToken() / (1 << 30), 18.0, 1e-9);
}

TEST(ModelTest, Llama2_70bUsesGqaAndSwiGlu) {
  const ModelDims m = Model("llama2-70b");
  EXPECT_EQ(m.num_kv_heads, 8);
  EXPECT_EQ(m.KvBytesPerToken(), 2 * 80 * 8 * 128 * 2);  // 327,680
  EXPECT_EQ(m.FfParamsPerLayer(), 3LL * 8192 * 28672);
  EXPECT_EQ(m.TotalParams(), 68'976'648'192);  // the checkpoint's count
}

// Parameter counts of the safetensors checkpoints on the Hugging Face hub
// (model cards' "Model size"): embeddings, untied LM head, norms included.
TEST(ModelTest, Llama3AndQwen3ParameterCounts) {
  EXPECT_EQ(Model("llama3.1-8b").TotalParams(), 8'030'261'248);
  EXPECT_EQ(Model("llama3.1-70b").TotalParams(), 70'553'706'496);
  EXPECT_EQ(Model("qwen3-8b").TotalParams(), 8'190'735'360);
  EXPECT_EQ(Model("qwen3-32b").TotalParams(), 32'762'123'264);
  // Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes.
  EXPECT_EQ(Model("llama3.1-8b").KvBytesPerToken(), 131'072);
}

TEST(PresetTest, EveryPresetIsComplete) {
  EXPECT_EQ(ModelPresetNames().size(), 30u);
  for (const auto& name : ModelPresetNames()) {
    auto m = ModelPreset(name);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->preset(), name);
    EXPECT_GT(m->num_layers(), 0) << name;
    EXPECT_GT(m->max_context_tokens(), 0) << name;
    EXPECT_EQ(m->num_heads() % m->num_kv_heads(), 0) << name;
    if (m->num_experts() > 0) {
      EXPECT_GE(m->num_experts(), m->experts_per_token()) << name;
      EXPECT_GT(m->expert_d_ff(), 0) << name;
    }
  }
  for (const auto& name : XpuPresetNames()) {
    auto x = XpuPreset(name);
    ASSERT_TRUE(x.ok());
    EXPECT_DOUBLE_EQ(x->compute_utilization(), 0.8) << name;
    EXPECT_DOUBLE_EQ(x->memory_utilization(), 0.85) << name;
  }
  // AttAcc §7: 8 x A100-HBM3 = 26.8 TB/s and 2.5 PFLOPS.
  EXPECT_NEAR(8 * XpuPreset("a100-hbm3")->memory_bw_bytes_per_s(), 26.8e12, 1e9);
  EXPECT_NEAR(8 * XpuPreset("a100-hbm3")->peak_flops_fp16(), 2.5e15, 0.01e15);
  EXPECT_EQ(XpuPreset("h100-sxm-80gb")->peak_flops_fp16(), 989.4e12);
  EXPECT_EQ(ModelPreset("mt-nlg-530b")->d_head(), 160);
  EXPECT_EQ(ModelPreset("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ModelPreset("nope").status().message().find("gpt3-175b"), std::string::npos);
  // Every node names an xPU and a NIC that exist.
  EXPECT_EQ(NodePresetNames().size(), 4u);
  for (const auto& name : NodePresetNames()) {
    auto n = NodePreset(name);
    ASSERT_TRUE(n.ok());
    EXPECT_TRUE(XpuPreset(n->xpu()).ok()) << name;
    EXPECT_TRUE(LinkPreset(n->nic()).ok()) << name;
    EXPECT_EQ(n->xpus(), 8) << name;
  }
}

TEST(PresetTest, FillUnsetKeepsExplicitFields) {
  servesim::v1::ModelSpec spec;
  spec.set_max_context_tokens(4096);
  FillUnset(*ModelPreset("gpt3-175b"), &spec);
  EXPECT_EQ(spec.max_context_tokens(), 4096);
  EXPECT_EQ(spec.num_layers(), 96);
  EXPECT_EQ(spec.ff_kind(), servesim::v1::FF_KIND_GELU);
}

// -------------------------------------------------------------- registry --

servesim::v1::DeviceSpec GpuSpec(const char* xpu, const char* link = "nvlink3") {
  servesim::v1::DeviceSpec spec;
  *spec.mutable_gpu()->mutable_xpu() = *XpuPreset(xpu);
  *spec.mutable_gpu()->mutable_interconnect() = *LinkPreset(link);
  spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_FP16);
  return spec;
}

TEST(RegistryTest, GpuIsRegistered) {
  EXPECT_EQ(RegisteredDeviceKinds(),
            (std::vector<std::string>{"attacc", "cta", "gpu", "lad", "spatten", "topick"}));
  auto device = CreateDevice(GpuSpec("a100-80gb"));
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->Describe().kind, "gpu");
  EXPECT_EQ((*device)->Describe().preset, "a100-80gb");
  EXPECT_EQ(CreateDevice(servesim::v1::DeviceSpec()).status().code(),
            absl::StatusCode::kNotFound);
}

// Static power (docs/energy.md): a GPU's is its idle power (A100 80GB:
// 80 W, measured), charged beside its ops; CTA's ops already charge its
// 0.5 W while busy; a pool of N units draws N times a unit's.
TEST(RegistryTest, DevicesDescribeTheirStaticPower) {
  auto gpu = CreateDevice(GpuSpec("a100-80gb"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->Describe().static_power_w, 80);
  EXPECT_FALSE((*gpu)->Describe().static_in_op_energy);
  servesim::v1::DeviceSpec cta;
  auto preset = CtaPreset("cta_0.5");
  ASSERT_TRUE(preset.ok()) << preset.status();
  *cta.mutable_cta()->mutable_cta() = *preset;
  auto* m = cta.mutable_cta()->mutable_model();
  m->set_layers(24);
  m->set_heads(16);
  m->set_d_head(64);
  auto unit = CreateDevice(cta);
  ASSERT_TRUE(unit.ok()) << unit.status();
  EXPECT_EQ((*unit)->Describe().static_power_w, 0.5);
  EXPECT_TRUE((*unit)->Describe().static_in_op_energy);
  PooledDevice pool(std::move(*unit), 12, 1e9);
  EXPECT_DOUBLE_EQ(pool.Describe().static_power_w, 6.0);
  EXPECT_TRUE(pool.Describe().static_in_op_energy);
}

TEST(RegistryTest, GpuRejectsBadSpec) {
  auto spec = GpuSpec("a100-80gb");
  spec.mutable_gpu()->mutable_xpu()->set_memory_utilization(1.5);
  auto device = CreateDevice(spec);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("xpu.memory_utilization = 1.5"),
            std::string::npos);
  // An agent's Describe reaches the device without the scenario's checks:
  // infinite figures are refused here too (they made costs NaN).
  spec = GpuSpec("a100-80gb");
  spec.mutable_gpu()->mutable_xpu()->set_memory_bw_bytes_per_s(
      std::numeric_limits<double>::infinity());
  EXPECT_EQ(CreateDevice(spec).status().message(),
            "gpu device: xpu.memory_bw_bytes_per_s = inf; expected > 0");
  spec = GpuSpec("a100-80gb");
  spec.mutable_gpu()->mutable_interconnect()->set_latency_s(
      std::numeric_limits<double>::infinity());
  EXPECT_EQ(CreateDevice(spec).status().message(),
            "gpu device: interconnect.latency_s = inf; expected >= 0");
}

// ------------------------------------------------------------ GPU model --

class GpuRooflineTest : public ::testing::Test {
 protected:
  Cost Estimate1(const Op& op) {
    Cost c;
    EXPECT_TRUE(device_->Estimate({&op, 1}, {&c, 1}).ok());
    return c;
  }
  // A100-80GB: 312e12 x 0.8 FLOP/s, 2039e9 x 0.85 B/s, 4 us per kernel.
  static constexpr double kFlops = 312e12 * 0.8;
  static constexpr double kBw = 2039e9 * 0.85;
  static constexpr double kOverhead = 4e-6;
  std::unique_ptr<Device> device_ = *CreateDevice(GpuSpec("a100-80gb"));
};

TEST_F(GpuRooflineTest, GemvIsMemoryBound) {
  Op op;
  op.kind = OpKind::kGemm;
  op.m = 1, op.n = 4096, op.k = 4096;
  const Cost c = Estimate1(op);
  const double bytes = (4096.0 + 4096.0 * 4096 + 4096) * 2;
  EXPECT_DOUBLE_EQ(c.dram_bytes, bytes);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(c.time_s, bytes / kBw + kOverhead);
  EXPECT_DOUBLE_EQ(c.dram_energy_pj, bytes * 28.72);
  // The A100 preset's board-level 2.2 pJ per FLOP (devices/presets.cc, [BUSY]).
  EXPECT_DOUBLE_EQ(c.compute_energy_pj, 2.0 * 4096 * 4096 * 2.2);
}

TEST_F(GpuRooflineTest, LargeGemmIsComputeBound) {
  Op op;
  op.kind = OpKind::kGemm;
  op.m = 4096, op.n = 4096, op.k = 4096;
  const Cost c = Estimate1(op);
  EXPECT_DOUBLE_EQ(c.time_s, 2.0 * 4096 * 4096 * 4096 / kFlops + kOverhead);
}

TEST_F(GpuRooflineTest, RidgePointSwitchesBound) {
  // A square fp16 GEMM of size n has intensity 2n^3 / 6n^2 = n/3 FLOP/B;
  // the ridge is kFlops / kBw = 144.0 FLOP/B, so n = 432 is the boundary.
  for (int64_t n : {431, 433}) {
    Op op;
    op.kind = OpKind::kGemm;
    op.m = op.n = op.k = n;
    const Cost c = Estimate1(op);
    const double compute = 2.0 * n * n * n / kFlops;
    const double memory = 6.0 * n * n / kBw;
    EXPECT_DOUBLE_EQ(c.time_s, std::max(compute, memory) + kOverhead);
    EXPECT_EQ(compute > memory, n > 432) << n;
  }
}

TEST_F(GpuRooflineTest, DecodeAttentionUsesEachSequencesOwnLength) {
  // Two decode steps with 99 and 3899 cached tokens; 32 heads, d_head 128.
  std::vector<AttentionSeq> seqs = {{1, 99}, {1, 3899}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 32, op.kv_heads = 32, op.d_head = 128;
  op.seqs = seqs;
  const Cost c = Estimate1(op);
  const double pairs = 100 + 3900;  // each query attends past + itself
  EXPECT_DOUBLE_EQ(c.flops, pairs * 32 * (4 * 128 + 5));
  // Q in + O out (2 x 32 x 2 rows) + new K,V (2 x 32 x 2) + cached K,V read
  // once each (2 x 32 x 4000 rows), 128 x 2 bytes per row.
  const double bytes = 256.0 * (2 * 32 * 2 + 2 * 32 * 2 + 2 * 32 * 4000);
  EXPECT_DOUBLE_EQ(c.dram_bytes, bytes);
  EXPECT_DOUBLE_EQ(c.time_s, bytes / kBw + kOverhead);
}

TEST_F(GpuRooflineTest, PrefillAttentionIsCausalPerQueryBlock) {
  // 512 new tokens after 100 cached ones: 4 query blocks of 128 read the
  // past plus their prefix: (100+128) + (100+256) + (100+384) + (100+512).
  std::vector<AttentionSeq> seqs = {{512, 100}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 8, op.kv_heads = 2, op.d_head = 64;
  op.seqs = seqs;
  const Cost c = Estimate1(op);
  EXPECT_DOUBLE_EQ(c.flops, (512.0 * 100 + 512.0 * 513 / 2) * 8 * (4 * 64 + 5));
  const double kv_rows = 4 * 100 + 128 + 256 + 384 + 512;
  EXPECT_DOUBLE_EQ(c.dram_bytes,
                   2.0 * 64 * (2 * 8 * 512 + 2 * 2 * 512 + 2 * 2 * kv_rows));
}

// ---------------------------------------------------------------- on die --

TEST(OnDieTest, OnlyTheSmallestTileFitsATinyL1) {
  // 1,152 B of L1 hold an 8 x 8 fp16 tile ((8 + 8) x 32 + 64 elements) and
  // nothing larger (8 x 16 needs 1,792 B). [16 x 64] x [64 x 32]:
  //   L2: ceil(32/8) 16 64 + ceil(16/8) 32 64 + 16 32 = 8,704 elements
  //   L1 (16 x 16 register tiles): 2 16 64 + 1 32 64 + 512 = 4,608
  const OnDieTraffic t = GemmOnDie({.m = 16, .n = 32, .k = 64}, 108, 1152);
  EXPECT_EQ(t.tile_m, 8);
  EXPECT_EQ(t.tile_n, 8);
  EXPECT_DOUBLE_EQ(t.l2_bytes, 8704.0 * 2);
  EXPECT_DOUBLE_EQ(t.l1_bytes, 4608.0 * 2);
  EXPECT_DOUBLE_EQ(t.register_accesses, 3.0 * 16 * 32 * 64);
}

TEST(OnDieTest, OneCoreTakesTheLargestTile) {
  // With one SM every tiling fills it, so the fewest L2 bytes win: the
  // whole 512 x 512 output in one tile (589,824 B of L1).
  const OnDieTraffic t = GemmOnDie({.m = 512, .n = 512, .k = 32}, 1, 1 << 20);
  EXPECT_EQ(t.tile_m, 512);
  EXPECT_EQ(t.tile_n, 512);
  EXPECT_DOUBLE_EQ(t.l2_bytes, (512.0 * 32 + 512.0 * 32 + 512.0 * 512) * 2);
}

TEST(OnDieTest, DecodeGemmSpreadsOverTheSms) {
  // GPT-3's QKV on one of 8 GPUs at batch 1: [1 x 12288] x [12288 x 4608],
  // 108 SMs. Blocks are ceil(4608 / tn); 8 and 16 wide fill 576/648 and
  // 288/324 = 0.889 of the last waves, the best any tile does, and 16 reads
  // the activations half as often: L2 = 288 x 12288 + 4608 x 12288 + 4608
  // elements, the same as the 16 x 16 register tiles'.
  const OnDieTraffic t = GemmOnDie({.m = 1, .n = 4608, .k = 12288}, 108, 192 * 1024);
  EXPECT_EQ(t.tile_m, 1);
  EXPECT_EQ(t.tile_n, 16);
  const double elements = 288.0 * 12288 + 4608.0 * 12288 + 4608;
  EXPECT_DOUBLE_EQ(t.l2_bytes, elements * 2);
  EXPECT_DOUBLE_EQ(t.l1_bytes, elements * 2);
  EXPECT_DOUBLE_EQ(t.register_accesses, 3.0 * 4608 * 12288);
}

TEST(OnDieTest, GpuAddsTheOnDieEnergyToComputeOnlyWhenSet) {
  auto spec = GpuSpec("a100-hbm3");
  Op norm;
  norm.kind = OpKind::kElementwise;
  norm.stage = Stage::kNorm;
  norm.elements = 1000, norm.flops_per_element = 5, norm.bytes_per_element = 4;
  Op gemm;
  gemm.kind = OpKind::kGemm;
  gemm.m = 1, gemm.n = 4608, gemm.k = 12288;
  std::vector<Op> ops = {norm, gemm};
  std::vector<Cost> plain(2), with(2);
  ASSERT_TRUE((*CreateDevice(spec))->Estimate(ops, absl::MakeSpan(plain)).ok());
  auto* e = spec.mutable_gpu()->mutable_xpu()->mutable_on_die();
  e->set_l2_pj_per_byte(2.4);
  e->set_l1_pj_per_byte(1.28);
  e->set_register_pj_per_access(0.0675);
  e->set_cores(108);
  e->set_l1_bytes_per_core(192 * 1024);
  ASSERT_TRUE((*CreateDevice(spec))->Estimate(ops, absl::MakeSpan(with)).ok());
  // The norm streams 4,000 B through L2 and L1: 2,000 fp16 register
  // accesses.
  EXPECT_DOUBLE_EQ(with[0].compute_energy_pj - plain[0].compute_energy_pj,
                   4000 * (2.4 + 1.28) + 2000 * 0.0675);
  const double elements = 288.0 * 12288 + 4608.0 * 12288 + 4608;
  EXPECT_NEAR(with[1].compute_energy_pj - plain[1].compute_energy_pj,
              elements * 2 * (2.4 + 1.28) + 3.0 * 4608 * 12288 * 0.0675, 1e-3);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(with[i].time_s, plain[i].time_s);
    EXPECT_EQ(with[i].dram_energy_pj, plain[i].dram_energy_pj);
  }
  e->set_cores(0);
  auto bad = CreateDevice(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("xpu.on_die.cores = 0; expected 1..100000"),
            absl::string_view::npos)
      << bad.status();
}

TEST(GpuCollectiveTest, RingAllReduceOverNvlink3) {
  auto device = *CreateDevice(GpuSpec("a100-hbm3", "nvlink3"));
  // GPT-3 at batch 64: 64 x 12288 fp16 activations over 8 GPUs.
  Op op;
  op.kind = OpKind::kAllReduce;
  op.bytes = 64.0 * 12288 * 2;
  op.participants = 8;
  Cost c;
  ASSERT_TRUE(device->Estimate({&op, 1}, {&c, 1}).ok());
  // 2(p-1) steps of (3 us + bytes/p / 300 GB/s) = 51.18 us.
  EXPECT_DOUBLE_EQ(c.time_s, 14 * (3e-6 + op.bytes / 8 / 300e9));
  EXPECT_NEAR(c.time_s, 51.18e-6, 0.01e-6);
  EXPECT_DOUBLE_EQ(c.link_bytes, 2.0 * 7 / 8 * op.bytes);
  op.participants = 1;
  ASSERT_TRUE(device->Estimate({&op, 1}, {&c, 1}).ok());
  EXPECT_EQ(c.time_s, 0);
}

TEST(GpuCollectiveTest, PcieCardsAllReduceOverPcie) {
  // docs/fidelity.md: a 2,048-token step of Llama-3.1-8B at TP=2 all-reduces
  // 2,048 x 4,096 bf16 activations twice per layer, 64 times a step.
  Op op;
  op.kind = OpKind::kAllReduce;
  op.bytes = 2048.0 * 4096 * 2;
  op.participants = 2;
  Cost pcie, nvlink;
  ASSERT_TRUE(
      (*CreateDevice(GpuSpec("rtx-pro-6000", "pcie5")))->Estimate({&op, 1}, {&pcie, 1}).ok());
  ASSERT_TRUE(
      (*CreateDevice(GpuSpec("rtx-pro-6000", "nvlink3")))->Estimate({&op, 1}, {&nvlink, 1}).ok());
  EXPECT_DOUBLE_EQ(pcie.time_s, 2 * (5e-6 + op.bytes / 2 / 63e9));
  EXPECT_NEAR(64 * pcie.time_s, 17.7e-3, 0.05e-3);
  EXPECT_NEAR(64 * nvlink.time_s, 4.0e-3, 0.05e-3);
}

TEST(GpuCollectiveTest, Int8UsesInt8PeakAndHalfTheBytes) {
  auto spec = GpuSpec("a100-80gb");
  spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_INT8);
  auto device = *CreateDevice(spec);
  Op op;
  op.kind = OpKind::kGemm;
  op.m = op.n = op.k = 4096;
  Cost c;
  ASSERT_TRUE(device->Estimate({&op, 1}, {&c, 1}).ok());
  EXPECT_DOUBLE_EQ(c.time_s, 2.0 * 4096 * 4096 * 4096 / (624e12 * 0.8) + 4e-6);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 3.0 * 4096 * 4096);
}

// ------------------------------------------------------ exact attention --

Tensor Random(ElementType type, std::vector<int64_t> shape, Rng& rng) {
  Tensor t = Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    t.Set(i, static_cast<float>(2 * rng.Uniform() - 1));
  }
  return t;
}

TEST(ReferenceAttentionTest, EqualScoresAverageTheValues) {
  // K = 0 makes every score equal: the output is the mean of V's rows.
  Rng rng(1, "test");
  AttentionCall call;
  call.q = Random(ElementType::kFp32, {2, 1, 8}, rng);
  call.k = Tensor::Zeros(ElementType::kFp32, {2, 5, 8});
  call.v = Random(ElementType::kFp32, {2, 5, 8}, rng);
  auto r = ExactAttention(call);
  ASSERT_TRUE(r.ok());
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 8; ++c) {
      double mean = 0;
      for (int j = 0; j < 5; ++j) mean += call.v.At((h * 5 + j) * 8 + c) / 5.0;
      EXPECT_NEAR(r->out.At(h * 8 + c), mean, 1e-6);
    }
  }
  EXPECT_EQ(r->stats.kv_positions, 2 * 5);
  EXPECT_EQ(r->stats.kv_positions_read, r->stats.kv_positions);
}

TEST(ReferenceAttentionTest, CausalFirstQuerySeesOnlyPositionZero) {
  Rng rng(2, "test");
  AttentionCall call;
  call.q = Random(ElementType::kFp32, {1, 4, 16}, rng);
  call.k = Random(ElementType::kFp32, {1, 4, 16}, rng);
  call.v = Random(ElementType::kFp32, {1, 4, 16}, rng);
  auto r = ExactAttention(call);
  ASSERT_TRUE(r.ok());
  for (int c = 0; c < 16; ++c) EXPECT_EQ(r->out.At(c), call.v.At(c));
  EXPECT_EQ(r->stats.kv_positions, 1 + 2 + 3 + 4);
}

TEST(ReferenceAttentionTest, MatchesTwoPositionClosedForm) {
  // One query, two keys: out = v0 + sigmoid(s1 - s0) (v1 - v0).
  AttentionCall call;
  call.q = Tensor::Zeros(ElementType::kFp32, {1, 1, 2});
  call.k = Tensor::Zeros(ElementType::kFp32, {1, 2, 2});
  call.v = Tensor::Zeros(ElementType::kFp32, {1, 2, 2});
  call.q.Set(0, 1.0f), call.q.Set(1, 2.0f);
  call.k.Set(0, 0.5f), call.k.Set(1, -1.0f), call.k.Set(2, 1.0f), call.k.Set(3, 1.0f);
  call.v.Set(0, 1.0f), call.v.Set(1, 0.0f), call.v.Set(2, 0.0f), call.v.Set(3, 3.0f);
  auto r = ExactAttention(call);
  ASSERT_TRUE(r.ok());
  const double s0 = (0.5 - 2.0) / std::sqrt(2.0), s1 = 3.0 / std::sqrt(2.0);
  const double w1 = 1.0 / (1.0 + std::exp(s0 - s1));
  EXPECT_NEAR(r->out.At(0), 1.0 - w1, 1e-6);
  EXPECT_NEAR(r->out.At(1), 3.0 * w1, 1e-6);
}

TEST(ReferenceAttentionTest, GroupedQueryHeadsShareKvHeads) {
  // 4 query heads over 2 KV heads: heads 0,1 read KV head 0; 2,3 read 1.
  Rng rng(3, "test");
  AttentionCall gqa;
  gqa.q = Random(ElementType::kFp32, {4, 1, 8}, rng);
  gqa.k = Random(ElementType::kFp32, {2, 6, 8}, rng);
  gqa.v = Random(ElementType::kFp32, {2, 6, 8}, rng);
  auto r = ExactAttention(gqa);
  ASSERT_TRUE(r.ok());
  for (int h = 0; h < 4; ++h) {
    AttentionCall one;
    one.q = Tensor::Zeros(ElementType::kFp32, {1, 1, 8});
    one.k = Tensor::Zeros(ElementType::kFp32, {1, 6, 8});
    one.v = Tensor::Zeros(ElementType::kFp32, {1, 6, 8});
    for (int c = 0; c < 8; ++c) one.q.Set(c, gqa.q.At(h * 8 + c));
    for (int i = 0; i < 48; ++i) {
      one.k.Set(i, gqa.k.At((h / 2) * 48 + i));
      one.v.Set(i, gqa.v.At((h / 2) * 48 + i));
    }
    auto single = ExactAttention(one);
    ASSERT_TRUE(single.ok());
    for (int c = 0; c < 8; ++c) EXPECT_EQ(r->out.At(h * 8 + c), single->out.At(c));
  }
}

TEST(ReferenceAttentionTest, Fp16InputsEqualTheirFp32Widening) {
  Rng rng(4, "test");
  AttentionCall half;
  half.q = Random(ElementType::kFp16, {2, 3, 16}, rng);
  half.k = Random(ElementType::kFp16, {2, 9, 16}, rng);
  half.v = Random(ElementType::kFp16, {2, 9, 16}, rng);
  AttentionCall wide;
  for (auto [src, dst] : {std::pair{&half.q, &wide.q}, {&half.k, &wide.k}, {&half.v, &wide.v}}) {
    *dst = Tensor::Zeros(ElementType::kFp32, src->shape);
    for (int64_t i = 0; i < src->NumElements(); ++i) dst->Set(i, src->At(i));
  }
  auto a = ExactAttention(half);
  auto b = ExactAttention(wide);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->out.bytes, b->out.bytes);
  EXPECT_EQ(a->stats.bytes_read * 2, b->stats.bytes_read);
}

TEST(ReferenceAttentionTest, RejectsBadShapes) {
  Rng rng(5, "test");
  AttentionCall call;
  call.q = Random(ElementType::kFp32, {3, 1, 8}, rng);
  call.k = Random(ElementType::kFp32, {2, 4, 8}, rng);
  call.v = Random(ElementType::kFp32, {2, 4, 8}, rng);
  auto r = ExactAttention(call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a multiple"), std::string::npos);
  call.q = Random(ElementType::kFp32, {2, 5, 8}, rng);
  EXPECT_NE(ExactAttention(call).status().message().find("q_len <= kv_len"),
            std::string::npos);
  call.q = Random(ElementType::kFp32, {2, 1, 4}, rng);
  EXPECT_NE(ExactAttention(call).status().message().find("d_head differs"),
            std::string::npos);
  call.q = Random(ElementType::kFp32, {2, 1, 8}, rng);
  call.v.bytes.pop_back();
  EXPECT_NE(ExactAttention(call).status().message().find("v holds"), std::string::npos);
}

TEST(GpuExecuteTest, IsTheExactReference) {
  Rng rng(6, "test");
  AttentionCall call;
  call.q = Random(ElementType::kFp16, {4, 2, 32}, rng);
  call.k = Random(ElementType::kFp16, {4, 10, 32}, rng);
  call.v = Random(ElementType::kFp16, {4, 10, 32}, rng);
  auto device = *CreateDevice(GpuSpec("h100-sxm-80gb", "nvlink4"));
  auto a = device->Execute(call);
  auto b = ExactAttention(call);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->out.bytes, b->out.bytes);
}

// --------------------------------------------------------------- rng --

TEST(RngTest, StreamsAreReproducibleAndIndependent) {
  Rng a(42, "arrivals"), b(42, "arrivals"), c(42, "lengths"), d(43, "arrivals");
  const uint64_t first = a.NextU64();
  EXPECT_EQ(first, b.NextU64());
  EXPECT_NE(first, c.NextU64());
  EXPECT_NE(first, d.NextU64());
  // Exponential(mean 2) and Gamma(k=4, theta=0.5) sample means.
  Rng e(1, "moments");
  double exp_sum = 0, gamma_sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    exp_sum += e.Exponential(2.0);
    gamma_sum += e.Gamma(4.0, 0.5);
  }
  EXPECT_NEAR(exp_sum / n, 2.0, 0.02);
  EXPECT_NEAR(gamma_sum / n, 2.0, 0.01);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(e.UniformInt(7), 7u);
}

// A unit whose attention costs 1 us and 100 bytes per (sequence, head),
// plus 10 us per op; it records the head ranges it is asked for.
class CountingUnit : public Device {
 public:
  DeviceDescription Describe() const override {
    DeviceDescription d;
    d.kind = "counting";
    d.parameters = {{"x", 1}};
    return d;
  }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    for (size_t i = 0; i < ops.size(); ++i) {
      const int64_t he = ops[i].head_end < 0 ? ops[i].heads : ops[i].head_end;
      const double n = static_cast<double>((he - ops[i].head_begin) * ops[i].seqs.size());
      ranges.push_back({ops[i].head_begin, he});
      costs[i] = Cost{};
      costs[i].time_s = 10e-6 + n * 1e-6;
      costs[i].dram_bytes = n * 100;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<AttentionResult> Execute(const AttentionCall&) const override {
    return absl::UnimplementedError("not used");
  }
  mutable std::vector<std::pair<int64_t, int64_t>> ranges;
};

TEST(PooledDeviceTest, SplitsHeadsAmongUnitsThatRunInParallel) {
  auto unit = std::make_unique<CountingUnit>();
  CountingUnit* u = unit.get();
  PooledDevice pool(std::move(unit), 3, 8e9);
  EXPECT_DOUBLE_EQ(pool.Describe().memory_bytes, 24e9);
  std::vector<AttentionSeq> seqs = {{1, 99, 5}, {1, 199, 6}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = op.kv_heads = 16;
  op.d_head = 64;
  op.seqs = seqs;
  Cost c;
  ASSERT_TRUE(pool.Estimate({&op, 1}, {&c, 1}).ok());
  // Units hold heads [0,5), [5,10), [10,16): the slowest has 6 heads x 2
  // sequences; every (sequence, head) is read once.
  EXPECT_EQ(u->ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}, {10, 16}}));
  EXPECT_DOUBLE_EQ(c.time_s, 10e-6 + 12e-6);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 16 * 2 * 100);
  // A head group [4, 11) touches all three units' shares.
  u->ranges.clear();
  op.head_begin = 4;
  op.head_end = 11;
  ASSERT_TRUE(pool.Estimate({&op, 1}, {&c, 1}).ok());
  EXPECT_EQ(u->ranges, (std::vector<std::pair<int64_t, int64_t>>{{4, 5}, {5, 10}, {10, 11}}));
  EXPECT_DOUBLE_EQ(c.time_s, 10e-6 + 10e-6);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 7 * 2 * 100);
}

// -------------------------------------------- attention-only devices' checks --

// CTA, ToPick, SpAtten and LAD open Estimate with CheckAttentionOps: each
// bad op is named by the device, the op's index and the allowed range, and
// a good op after the checks is costed.
TEST(CheckAttentionOpsTest, EveryAttentionOnlyDeviceRejectsTheSameBadOps) {
  std::vector<std::pair<std::string, servesim::v1::DeviceSpec>> specs(4);
  specs[0].first = "cta";
  *specs[0].second.mutable_cta()->mutable_cta() = *CtaPreset("cta_0");
  auto* m = specs[0].second.mutable_cta()->mutable_model();
  m->set_layers(24);
  m->set_heads(16);
  m->set_d_head(64);
  specs[1].first = "topick";
  *specs[1].second.mutable_topick()->mutable_topick() = *TopickPreset("topick");
  specs[2].first = "spatten";
  *specs[2].second.mutable_spatten()->mutable_spatten() = *SpattenPreset("spatten");
  specs[3].first = "lad";
  *specs[3].second.mutable_lad()->mutable_lad() = *LadPreset("lad_1.5");

  const AttentionSeq good_seq{1, 99, 0};
  Op good;
  good.kind = OpKind::kAttention;
  good.heads = 16, good.kv_heads = 16, good.d_head = 64;
  good.seqs = {&good_seq, 1};
  for (const auto& [kind, spec] : specs) {
    SCOPED_TRACE(kind);
    auto dev = CreateDevice(spec);
    ASSERT_TRUE(dev.ok()) << dev.status();
    auto message = [&](absl::Span<const Op> ops, size_t slots) {
      std::vector<Cost> costs(slots);
      const absl::Status st = (*dev)->Estimate(ops, absl::MakeSpan(costs));
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      return std::string(st.message());
    };
    EXPECT_EQ(message({&good, 1}, 2), kind + " device: 1 ops but 2 cost slots");
    Op ops[2] = {good, good};
    ops[1].kind = OpKind::kGemm;
    EXPECT_EQ(message(ops, 2), kind + " device: op 1 is not attention; the device runs "
                                      "attention only");
    ops[1] = good;
    ops[1].kv_heads = 5;
    EXPECT_EQ(message(ops, 2), kind + " device: op 1 has heads 16, kv_heads 5, d_head 64; "
                                      "expected >= 1 and heads a multiple of kv_heads");
    const AttentionSeq bad_seq{1, -3, 0};
    ops[1] = good;
    ops[1].seqs = {&bad_seq, 1};
    EXPECT_EQ(message(ops, 2), kind + " device: sequence with new_tokens 1, past_tokens -3; "
                                      "expected new_tokens >= 1 and past_tokens >= 0");
    // The shared checks pass a good op through to the cycle model.
    Cost c;
    ASSERT_TRUE((*dev)->Estimate({&good, 1}, {&c, 1}).ok());
    EXPECT_GT(c.time_s, 0);
  }
  // The helper alone, without a device: empty lists are fine.
  EXPECT_TRUE(CheckAttentionOps("x", {}, 0).ok());
}

TEST(CheckAttentionShapeTest, EveryPruningDeviceBoundsItsModelShape) {
  // An agent's client sends the spec: CTA's heads x d_head hash planes of
  // 2^30 x 2^30 once overflowed int64, and SpAtten indexed layer
  // INT32_MIN - 1. Each field set must be in the scenario model's range.
  std::vector<std::pair<std::string, servesim::v1::DeviceSpec>> specs(4);
  specs[0].first = "cta";
  *specs[0].second.mutable_cta()->mutable_cta() = *CtaPreset("cta_0");
  specs[1].first = "topick";
  *specs[1].second.mutable_topick()->mutable_topick() = *TopickPreset("topick");
  specs[2].first = "spatten";
  *specs[2].second.mutable_spatten()->mutable_spatten() = *SpattenPreset("spatten");
  specs[3].first = "lad";
  *specs[3].second.mutable_lad()->mutable_lad() = *LadPreset("lad_1.5");
  auto model = [](servesim::v1::DeviceSpec* spec) {
    return spec->has_cta()       ? spec->mutable_cta()->mutable_model()
           : spec->has_topick()  ? spec->mutable_topick()->mutable_model()
           : spec->has_spatten() ? spec->mutable_spatten()->mutable_model()
                                 : spec->mutable_lad()->mutable_model();
  };
  for (auto& [kind, spec] : specs) {
    SCOPED_TRACE(kind);
    auto* m = model(&spec);
    m->set_layers(1024);
    m->set_heads(4096);
    m->set_d_head(64);
    EXPECT_TRUE(CreateDevice(spec).ok());
    m->set_heads(1073741824);
    EXPECT_EQ(CreateDevice(spec).status().message(),
              kind + " device: model.heads = 1073741824; expected in [1, 4096]");
    m->set_heads(16);
    m->set_layers(-2147483647 - 1);
    EXPECT_EQ(CreateDevice(spec).status().message(),
              kind + " device: model.layers = -2147483648; expected in [1, 1024]");
    m->set_layers(24);
    m->set_d_head(4097);
    EXPECT_EQ(CreateDevice(spec).status().message(),
              kind + " device: model.d_head = 4097; expected in [1, 4096]");
  }
  EXPECT_TRUE(CheckAttentionShape("x", servesim::v1::AttentionShape()).ok());
}

TEST(CheckAttentionShapesTest, HeadDimensionAtMost4096) {
  // Kernels size fixed-point sums and per-slot buffers for model.d_head's
  // range; a tensor past it is refused before any of them runs.
  AttentionCall call;
  call.q = Tensor::Zeros(ElementType::kFp32, {1, 1, 4097});
  call.k = call.v = Tensor::Zeros(ElementType::kFp32, {1, 2, 4097});
  EXPECT_EQ(CheckAttentionShapes(call).message(), "d_head = 4097; expected at most 4096");
  call.q = Tensor::Zeros(ElementType::kFp32, {1, 1, 4096});
  call.k = call.v = Tensor::Zeros(ElementType::kFp32, {1, 2, 4096});
  EXPECT_TRUE(CheckAttentionShapes(call).ok());
}

}  // namespace
}  // namespace servesim::devices
