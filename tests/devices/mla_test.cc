// Multi-head latent attention, FP8 and collectives across nodes:
// DeepSeek-V3's parameter and KV counts, the GPU's MLA attention kernel,
// FP8 GEMMs and a node-spanning all-reduce by hand, and the planner's MLA
// layer (docs/models.md). Every expected value is worked out in the
// comments.
#include <algorithm>
#include <memory>
#include <vector>

#include "devices/model.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::devices {
namespace {

ModelDims Preset(const char* name) { return ModelDimsFromSpec(*ModelPreset(name)); }

TEST(MlaModelTest, DeepSeekV3ParametersMatchThePublishedCounts) {
  const ModelDims m = Preset("deepseek-v3");
  ASSERT_TRUE(m.mla());
  ASSERT_TRUE(m.moe());
  // Q: 7168 x 1536, its norm 1536, 1536 x 128 x (128 + 64); KV: 7168 x
  // (512 + 64), its norm 512, 512 x 128 x (128 + 128); O: 128 x 128 x 7168.
  const int64_t attention = 7168LL * 1536 + 1536 + 1536LL * 128 * 192 + 7168LL * 576 + 512 +
                            512LL * 128 * 256 + 128LL * 128 * 7168;
  EXPECT_EQ(m.AttentionParamsPerLayer(), attention);
  EXPECT_EQ(attention, 187107328);
  // Per layer 61 x (7168 x 2112 + 1536 + 512) stay whole on every xPU.
  EXPECT_EQ(m.ReplicatedParams(), 61LL * (7168 * 2112 + 2048));
  // DeepSeek-V3 report: "671B total parameters with 37B activated".
  EXPECT_NEAR(m.TotalParams() / 1e9, 671.0, 0.1);
  EXPECT_NEAR(m.ActiveParams() / 1e9, 37.0, 0.6);
  // The cache: 512 + 64 elements per token and layer, bf16 (FP8 weights
  // keep a 16-bit cache unless kv_dtype says otherwise).
  EXPECT_EQ(m.kv_dtype, servesim::v1::DTYPE_BF16);
  EXPECT_EQ(m.KvBytesPerToken(), 61 * 576 * 2);
  // The same model with standard attention would cache 2 x 128 heads x 128.
  EXPECT_EQ(m.KvElementsPerLayer(128), 576);
  ModelDims mha = m;
  mha.kv_lora_rank = 0;
  EXPECT_EQ(mha.KvElementsPerLayer(128), 2 * 128 * 128);
}

TEST(MlaModelTest, Fp8WeightsAreOneByteButTheEmbeddingAndLmHeadStaySixteenBit) {
  const ModelDims m = Preset("deepseek-v3");
  EXPECT_EQ(m.dtype, servesim::v1::DTYPE_FP8);
  EXPECT_EQ(m.bytes_per_element, 1);
  EXPECT_EQ(m.act_bytes_per_element, 2);
  EXPECT_EQ(m.EmbeddingParams(), 2LL * 129280 * 7168);
  EXPECT_DOUBLE_EQ(m.WeightBytes(),
                   static_cast<double>(m.TotalParams()) + static_cast<double>(m.EmbeddingParams()));
  // An FP8 KV cache halves the cache; INT8 keeps its one byte everywhere.
  servesim::v1::ModelSpec spec = *ModelPreset("deepseek-v3");
  spec.set_kv_dtype(servesim::v1::DTYPE_FP8);
  EXPECT_EQ(ModelDimsFromSpec(spec).KvBytesPerToken(), 61 * 576);
  spec = *ModelPreset("gpt3-175b");
  spec.set_dtype(servesim::v1::DTYPE_INT8);
  const ModelDims int8 = ModelDimsFromSpec(spec);
  EXPECT_EQ(int8.kv_bytes_per_element, 1);
  EXPECT_EQ(int8.act_bytes_per_element, 1);
  EXPECT_DOUBLE_EQ(int8.WeightBytes(), static_cast<double>(int8.TotalParams()));
}

// A GPU with round figures: 1 TFLOP/s at 16 bits, 4 at FP8 (0: none), 1
// TB/s, 1 us per kernel.
std::unique_ptr<Device> RoundGpu(servesim::v1::DType dtype, double fp8_peak = 4e12,
                                 servesim::v1::DType kv_dtype = servesim::v1::DTYPE_UNSPECIFIED) {
  servesim::v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  auto* x = g->mutable_xpu();
  x->set_peak_flops_fp16(1e12);
  x->set_peak_flops_int8(2e12);
  x->set_peak_flops_fp8(fp8_peak);
  x->set_memory_bytes(1e10);
  x->set_memory_bw_bytes_per_s(1e12);
  x->set_compute_utilization(1);
  x->set_memory_utilization(1);
  x->set_kernel_overhead_s(1e-6);
  x->set_flop_energy_pj(1);
  x->set_int8_op_energy_pj(0.5);
  g->mutable_interconnect()->set_bandwidth_bytes_per_s(1e11);
  g->set_dtype(dtype);
  g->set_kv_dtype(kv_dtype);
  return *CreateDevice(spec);
}

Cost CostOf(const Device& d, const Op& op) {
  Cost c;
  EXPECT_TRUE(d.Estimate(absl::MakeConstSpan(&op, 1), absl::MakeSpan(&c, 1)).ok());
  return c;
}

TEST(GpuMlaTest, DecodeAttendsInTheLatentAndPrefillAsOrdinaryHeads) {
  auto gpu = RoundGpu(servesim::v1::DTYPE_BF16);
  // 2 heads, latent 4, RoPE 2, non-RoPE key 3, value 5.
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = Stage::kAttention;
  op.heads = op.kv_heads = 2;
  op.d_head = 3;
  op.kv_latent = 4;
  op.d_rope = 2;
  op.d_value = 5;
  const std::vector<AttentionSeq> decode = {{1, 9, 0}};
  op.seqs = decode;
  Cost c = CostOf(*gpu, op);
  // 10 (query, key) pairs x 2 heads x (2 x 6 score + 2 x 4 context + 5).
  EXPECT_DOUBLE_EQ(c.flops, 10 * 2 * 25);
  // Queries in (6) and latent outputs (4) per head, 2 bytes; the new
  // latent row written and 10 rows read, 6 elements of 2 bytes, once for
  // both heads.
  EXPECT_DOUBLE_EQ(c.dram_bytes, 2 * 2 * 10 + 11 * 6 * 2);
  // 500 FLOPs at 1 TFLOP/s outlast 172 bytes at 1 TB/s; one kernel.
  EXPECT_NEAR(c.time_s, 500e-12 + 1e-6, 1e-18);

  const std::vector<AttentionSeq> prefill = {{3, 0, 1}};
  op.seqs = prefill;
  c = CostOf(*gpu, op);
  // Causal: 1 + 2 + 3 = 6 pairs x 2 heads x (2 x 5 + 2 x 5 + 5).
  EXPECT_DOUBLE_EQ(c.flops, 6 * 2 * 25);
  // Q in and O out for 3 rows, keys and values for 3 rows read, each 2 heads
  // x (3 + 2 + 5) x 2 bytes; 3 latent rows written.
  EXPECT_DOUBLE_EQ(c.dram_bytes, (3 + 3) * 2 * 10 * 2 + 3 * 6 * 2);

  // Both in one batch: two kernels, their sums.
  const std::vector<AttentionSeq> both = {{1, 9, 0}, {3, 0, 1}};
  op.seqs = both;
  const Cost mixed = CostOf(*gpu, op);
  EXPECT_DOUBLE_EQ(mixed.flops, 500 + 300);
  EXPECT_NEAR(mixed.time_s, 500e-12 + 300e-12 + 2e-6, 1e-18);

  // An FP8 cache reads and writes latents at one byte.
  auto fp8kv = RoundGpu(servesim::v1::DTYPE_BF16, 4e12, servesim::v1::DTYPE_FP8);
  op.seqs = decode;
  EXPECT_DOUBLE_EQ(CostOf(*fp8kv, op).dram_bytes, 40 + 11 * 6);
}

TEST(GpuFp8Test, GemmsRunAtTheFp8RateWithOneByteWeights) {
  Op op;
  op.kind = OpKind::kGemm;
  op.stage = Stage::kFf1;
  op.m = 1000, op.n = 2000, op.k = 3000;
  const double flops = 2.0 * 1000 * 2000 * 3000;
  // Activations in and out at 2 bytes, weights at 1.
  const double bytes = (1000.0 * 3000 + 1000.0 * 2000) * 2 + 3000.0 * 2000;
  const Cost fp8 = CostOf(*RoundGpu(servesim::v1::DTYPE_FP8), op);
  EXPECT_DOUBLE_EQ(fp8.dram_bytes, bytes);
  EXPECT_NEAR(fp8.time_s, flops / 4e12 + 1e-6, 1e-15);
  EXPECT_DOUBLE_EQ(fp8.compute_energy_pj, flops * 0.5);
  // Without FP8 tensor cores (A100): weight-only FP8 at the 16-bit rate.
  const Cost weight_only = CostOf(*RoundGpu(servesim::v1::DTYPE_FP8, 0), op);
  EXPECT_DOUBLE_EQ(weight_only.dram_bytes, bytes);
  EXPECT_NEAR(weight_only.time_s, flops / 1e12 + 1e-6, 1e-15);
  EXPECT_DOUBLE_EQ(weight_only.compute_energy_pj, flops);
  // The LM head keeps 16-bit weights.
  op.stage = Stage::kLmHead;
  EXPECT_DOUBLE_EQ(CostOf(*RoundGpu(servesim::v1::DTYPE_FP8), op).dram_bytes,
                   (1000.0 * 3000 + 1000.0 * 2000 + 3000.0 * 2000) * 2);
}

TEST(GpuCollectiveTest, AnAllReduceAcrossNodesRunsAChannelPerNic) {
  servesim::v1::DeviceSpec spec;
  *spec.mutable_gpu()->mutable_xpu() = *XpuPreset("h100-sxm-80gb");
  *spec.mutable_gpu()->mutable_interconnect() = *LinkPreset("nvlink4");
  spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_BF16);
  Op op;
  op.kind = OpKind::kAllReduce;
  op.stage = Stage::kAllReduce;
  op.bytes = 16e6;
  op.participants = 16;
  // One node of 16 (no node size given): 30 NVLink steps of 3 us + 1 MB /
  // 450 GB/s.
  const Cost one_node = CostOf(**CreateDevice(spec), op);
  EXPECT_NEAR(one_node.time_s, 30 * (3e-6 + 1e6 / 450e9), 1e-15);
  // Two nodes of 8 with a 400 Gb/s NIC per GPU: a step moves 1/8 of its
  // 1 MB slice over the NIC (2.5 us) and 7/8 over NVLink (1.944 us); the
  // NIC sets the pace. Of the 30 steps, 2 cross a node boundary and take
  // the NIC's 5 us latency, 28 NVLink's 3 us: 75 + 10 + 84 = 169 us.
  spec.mutable_gpu()->set_xpus_per_node(8);
  *spec.mutable_gpu()->mutable_internode() = *LinkPreset("infiniband-ndr");
  const Cost two_nodes = CostOf(**CreateDevice(spec), op);
  EXPECT_NEAR(two_nodes.time_s, 30 * (1e6 / 8 / 50e9) + 2 * 5e-6 + 28 * 3e-6, 1e-15);
  // Four nodes of 4: 6 steps cross a boundary.
  spec.mutable_gpu()->set_xpus_per_node(4);
  EXPECT_NEAR(CostOf(**CreateDevice(spec), op).time_s,
              30 * std::max(1e6 / 4 / 50e9, 1e6 * 3 / 4 / 450e9) + 6 * 5e-6 + 24 * 3e-6, 1e-15);
  spec.mutable_gpu()->set_xpus_per_node(8);
  EXPECT_DOUBLE_EQ(two_nodes.link_bytes, 30.0 / 16 * 16e6);
  // Of which each xPU's NIC sends its channel's 1/8: 30 steps of 1 MB / 8.
  EXPECT_DOUBLE_EQ(two_nodes.internode_bytes, 30 * 1e6 / 8);
  EXPECT_DOUBLE_EQ(one_node.internode_bytes, 0);
  // Within a node (8 peers) the NIC is not used.
  op.participants = 8;
  const Cost in_node = CostOf(**CreateDevice(spec), op);
  EXPECT_NEAR(in_node.time_s, 14 * (3e-6 + 2e6 / 450e9), 1e-15);
  EXPECT_DOUBLE_EQ(in_node.internode_bytes, 0);
}

}  // namespace
}  // namespace servesim::devices

namespace servesim::scheduler {
namespace {

class MlaPlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    servesim::v1::DeviceSpec spec;
    *spec.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("h200-sxm-141gb");
    *spec.mutable_gpu()->mutable_interconnect() = *devices::LinkPreset("nvlink4");
    spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_FP8);
    device_ = *devices::CreateDevice(spec);
    model_ = devices::ModelDimsFromSpec(*devices::ModelPreset("deepseek-v3"));
  }
  PlannerConfig Config(int64_t tp) {
    PlannerConfig c;
    c.tensor_parallel = tp;
    c.xpu = device_.get();
    c.routing = std::make_shared<const devices::ExpertRouting>(
        *devices::ExpertRouting::Create(256, 8, 0, 1, 1));
    return c;
  }
  std::unique_ptr<devices::Device> device_;
  devices::ModelDims model_;
};

TEST_F(MlaPlannerTest, TensorParallelSplitsHeadsButEveryXpuHoldsTheWholeLatent) {
  IterationPlanner p(model_, Config(8));
  // The latent is one "head": not divided over the group.
  EXPECT_EQ(p.KvBytesPerTokenPerXpu(), 61 * 576 * 2);
  // Weights: the down-projections whole, the rest (experts split by width)
  // over 8.
  const double replicated = static_cast<double>(model_.ReplicatedParams());
  EXPECT_DOUBLE_EQ(p.WeightBytesPerXpu(), (model_.WeightBytes() - replicated) / 8 + replicated);
}

TEST_F(MlaPlannerTest, DecodeFoldsTheUpProjectionsAndPrefillExpandsItsContext) {
  IterationPlanner p(model_, Config(8));
  auto entry = [](int32_t slot, int64_t new_tokens, int64_t past_tokens) {
    BatchEntry e;
    e.slot = slot;
    e.new_tokens = new_tokens;
    e.past_tokens = past_tokens;
    e.prefill = new_tokens > 1;
    e.emits_token = true;
    return e;
  };
  Batch b;
  b.entries.push_back(entry(0, 1, 500));   // decode
  b.entries.push_back(entry(1, 1, 300));   // decode
  b.entries.push_back(entry(2, 100, 50));  // a prompt's last 100 after 50 cached
  b.decode_tokens = 2;
  b.prefill_tokens = 100;
  b.emitting = 3;
  ASSERT_TRUE(p.Plan(b).ok());
  std::vector<const devices::Op*> qkv, proj;
  const devices::Op* attention = nullptr;
  for (const auto& op : p.last_ops()) {
    if (op.stage == devices::Stage::kQkv) qkv.push_back(&op);
    if (op.stage == devices::Stage::kProjection) proj.push_back(&op);
    if (op.kind == devices::OpKind::kAttention) attention = &op;
  }
  ASSERT_EQ(qkv.size(), 4u);
  // Down-projections of every token: 7168 -> 1536 + 512 + 64.
  EXPECT_EQ(qkv[0]->m, 102);
  EXPECT_EQ(qkv[0]->n, 2112);
  EXPECT_EQ(qkv[0]->k, 7168);
  // Query up-projection: 16 heads of 128 + 64 per xPU.
  EXPECT_EQ(qkv[1]->n, 16 * 192);
  EXPECT_EQ(qkv[1]->k, 1536);
  // W_UK folded into the 2 decode queries: 16 heads x 128 -> 512.
  EXPECT_EQ(qkv[2]->m, 2);
  EXPECT_EQ(qkv[2]->n, 16 * 512);
  EXPECT_EQ(qkv[2]->k, 128);
  // The prefill's 150 context rows up-projected to keys and values.
  EXPECT_EQ(qkv[3]->m, 150);
  EXPECT_EQ(qkv[3]->n, 16 * 256);
  EXPECT_EQ(qkv[3]->k, 512);
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->heads, 16);
  EXPECT_EQ(attention->kv_latent, 512);
  EXPECT_EQ(attention->d_rope, 64);
  EXPECT_EQ(attention->d_value, 128);
  // W_UV on the decode rows, then o_proj.
  ASSERT_EQ(proj.size(), 2u);
  EXPECT_EQ(proj[0]->m, 2);
  EXPECT_EQ(proj[0]->n, 16 * 128);
  EXPECT_EQ(proj[0]->k, 512);
  EXPECT_EQ(proj[1]->m, 102);
  EXPECT_EQ(proj[1]->n, 7168);
  EXPECT_EQ(proj[1]->k, 16 * 128);

  // Same counts, another prefill context: the up-projection follows.
  b.entries[2].past_tokens = 70;  // same token counts
  ASSERT_TRUE(p.Plan(b).ok());
  for (const auto& op : p.last_ops()) {
    if (op.stage == devices::Stage::kQkv && op.k == 512) {
      EXPECT_EQ(op.m, 170);
    }
  }
}

}  // namespace
}  // namespace servesim::scheduler

// ------------------------------------------------ sliding windows, MXFP4 ----

namespace servesim::devices {
namespace {

TEST(SlidingWindowModelTest, GptOssParametersAndWeightsMatchThePublishedCounts) {
  const ModelDims big = Preset("gpt-oss-120b");
  // OpenAI's model card: 116.8B and 20.9B parameters.
  EXPECT_NEAR(big.TotalParams() / 1e9, 116.8, 0.05);
  EXPECT_NEAR(Preset("gpt-oss-20b").TotalParams() / 1e9, 20.9, 0.05);
  // Attention 2880 x 4096 + 2 x 2880 x 512 + 4096 x 2880 per layer.
  EXPECT_EQ(big.AttentionParamsPerLayer(), 26542080);
  // Alternating layers, the first sliding: 18 of each.
  EXPECT_EQ(big.SlidingLayers(), 18);
  EXPECT_EQ(big.FullAttentionLayers(), 18);
  // Routed experts at 4.25 bits, everything else bf16: about 65 GB, which
  // is why the model serves from one 80 GB GPU.
  const double routed = 36.0 * 128 * 3 * 2880 * 2880;
  EXPECT_EQ(big.RoutedExpertParams(), static_cast<int64_t>(routed));
  EXPECT_DOUBLE_EQ(big.WeightBytes(),
                   (static_cast<double>(big.TotalParams()) - routed) * 2 + routed * 4.25 / 8);
  EXPECT_NEAR(big.WeightBytes() / 1e9, 65.2, 0.1);
}

TEST(SlidingWindowGpuTest, QueriesSeeTheirLastWindowOfPositions) {
  auto gpu = RoundGpu(servesim::v1::DTYPE_FP16);
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = Stage::kAttention;
  op.heads = op.kv_heads = 1;
  op.d_head = 8;
  op.window = 4;
  // A decode step after 9 cached positions sees 4: 4 pairs x (4 x 8 + 5)
  // FLOPs; it reads 4 cached rows (K and V, 8 wide, 2 bytes), writes 1 row
  // and moves its query and output.
  const std::vector<AttentionSeq> decode = {{1, 9, 0}};
  op.seqs = decode;
  Cost c = CostOf(*gpu, op);
  EXPECT_DOUBLE_EQ(c.flops, 4 * 37);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 8 * 2 * (2 * 1 + 2 * 1 + 2 * 4));
  // A 6-token prompt: 1 + 2 + 3 + 4 + 4 + 4 = 18 pairs; one query block
  // reads its 6 rows.
  const std::vector<AttentionSeq> prompt = {{6, 0, 1}};
  op.seqs = prompt;
  c = CostOf(*gpu, op);
  EXPECT_DOUBLE_EQ(c.flops, 18 * 37);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 8 * 2 * (2 * 6 + 2 * 6 + 2 * 6));
  // A window wider than the context changes nothing.
  op.window = 100;
  Op full = op;
  full.window = 0;
  EXPECT_DOUBLE_EQ(CostOf(*gpu, op).time_s, CostOf(*gpu, full).time_s);
}

}  // namespace
}  // namespace servesim::devices

namespace servesim::scheduler {
namespace {

TEST(SlidingWindowPlannerTest, FullAndSlidingLayersEachAttendTheirWay) {
  servesim::v1::DeviceSpec spec;
  *spec.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("h100-sxm-80gb");
  *spec.mutable_gpu()->mutable_interconnect() = *devices::LinkPreset("nvlink4");
  spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_BF16);
  spec.mutable_gpu()->set_expert_dtype(servesim::v1::DTYPE_MXFP4);
  auto device = *devices::CreateDevice(spec);
  const devices::ModelDims m = devices::ModelDimsFromSpec(*devices::ModelPreset("gpt-oss-120b"));
  PlannerConfig c;
  c.xpu = device.get();
  c.routing = std::make_shared<const devices::ExpertRouting>(
      *devices::ExpertRouting::Create(128, 4, 0, 1, 1));
  IterationPlanner p(m, c);
  auto cost = p.Plan(UniformBatch(8, 1, 2000));
  ASSERT_TRUE(cost.ok()) << cost.status();
  std::vector<const devices::Op*> attention;
  for (const auto& op : p.last_ops()) {
    if (op.kind == devices::OpKind::kAttention) attention.push_back(&op);
  }
  ASSERT_EQ(attention.size(), 2u);
  EXPECT_EQ(attention[0]->window, 0);
  EXPECT_EQ(attention[1]->window, 128);
  // The attention stage: 18 layers of each op.
  std::vector<devices::Cost> each(2);
  const devices::Op ops[2] = {*attention[0], *attention[1]};
  ASSERT_TRUE(device->Estimate(ops, absl::MakeSpan(each)).ok());
  EXPECT_NEAR(cost->stages[static_cast<int>(devices::Stage::kAttention)].time_s,
              18 * each[0].time_s + 18 * each[1].time_s, 1e-12);
  // The sliding layers read 128 of 2,001 cached positions (plus the same
  // queries, outputs and new rows).
  EXPECT_LT(each[1].dram_bytes, each[0].dram_bytes / 10);
}

}  // namespace
}  // namespace servesim::scheduler
