// Mixture of experts: parameter counts, the routing model, the GPU's MoE
// block (roofline and moe.csv), the planner's MoE layer and its exchange
// (docs/moe.md). Every expected value is worked out by hand in the comments.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "devices/gpu/gpu_device.h"
#include "devices/gpu/profile.h"
#include "devices/model.h"
#include "devices/moe_routing.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::devices {
namespace {

namespace fs = std::filesystem;

ModelDims Preset(const char* name) { return ModelDimsFromSpec(*ModelPreset(name)); }

TEST(MoeModelTest, Qwen3MoeParametersMatchThePublishedCounts) {
  const ModelDims m = Preset("qwen3-30b-a3b");
  ASSERT_TRUE(m.moe());
  // Attention: 2048 x 4096 (Q) + 2 x 2048 x 512 (K, V) + 4096 x 2048 (O).
  EXPECT_EQ(m.AttentionParamsPerLayer(), 18874368);
  // One expert: 3 x 2048 x 768.
  EXPECT_EQ(m.ExpertParams(), 4718592);
  // Router 2048 x 128 + 128 experts.
  EXPECT_EQ(m.MoeParamsPerLayer(), 262144 + 128 * 4718592);
  // 48 x (attention + MoE + two 2048 norms + two 128 QK norms) + untied
  // embeddings 2 x 151936 x 2048 + the final norm.
  const int64_t layer = 18874368 + 262144 + 128LL * 4718592 + 2 * 2048 + 2 * 128;
  EXPECT_EQ(m.TotalParams(), 48 * layer + 2LL * 151936 * 2048 + 2048);
  // Qwen: "30.5B in total and 3.3B activated".
  EXPECT_NEAR(m.TotalParams() / 1e9, 30.5, 0.05);
  EXPECT_NEAR(m.ActiveParams() / 1e9, 3.3, 0.06);
  EXPECT_EQ(m.RoutedExpertParams(), 48LL * 128 * 4718592);
}

TEST(MoeModelTest, MixtralParametersMatchThePublishedCounts) {
  const ModelDims m = Preset("mixtral-8x7b");
  // Mistral AI: 46.7B total, 12.9B active per token.
  EXPECT_NEAR(m.TotalParams() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(m.ActiveParams() / 1e9, 12.9, 0.05);
  EXPECT_FALSE(Preset("llama3.1-8b").moe());
  EXPECT_EQ(Preset("llama3.1-8b").ActiveParams(), Preset("llama3.1-8b").TotalParams());
}

TEST(ExpertRoutingTest, UniformLoadIsTheBinomialExpectation) {
  auto r = ExpertRouting::Create(128, 8, 0, 1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  for (double q : r->pick_probability()) EXPECT_DOUBLE_EQ(q, 8.0 / 128);
  // 10 tokens: 10 x 8 / 2 assignments per rank; each of its 64 experts is
  // touched with probability 1 - (1 - 1/16)^10.
  const ExpertLoad l = r->Rank(1, 10);
  EXPECT_NEAR(l.assignments, 40, 1e-9);
  EXPECT_NEAR(l.experts_touched, 64 * (1 - std::pow(15.0 / 16, 10)), 1e-9);
  EXPECT_EQ(r->busiest_rank(), 0);
  // One token touches exactly top-k experts over all ranks.
  auto one = ExpertRouting::Create(128, 8, 0, 1, 1);
  EXPECT_NEAR(one->Rank(0, 1).experts_touched, 8, 1e-9);
  EXPECT_EQ(r->Rank(0, 0).assignments, 0);
}

TEST(ExpertRoutingTest, SkewKeepsTopKPerTokenAndIsDrawnFromTheSeed) {
  auto a = ExpertRouting::Create(64, 6, 1.2, 7, 4);
  auto b = ExpertRouting::Create(64, 6, 1.2, 7, 4);
  auto c = ExpertRouting::Create(64, 6, 1.2, 8, 4);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto& q = a->pick_probability();
  EXPECT_NEAR(std::accumulate(q.begin(), q.end(), 0.0), 6, 1e-9);
  for (double v : q) {
    EXPECT_GT(v, 0);
    EXPECT_LE(v, 1);
  }
  EXPECT_EQ(a->pick_probability(), b->pick_probability());
  EXPECT_NE(a->pick_probability(), c->pick_probability());
  // Zipf(1.2) over 64 experts, 6 picks a token: the hottest's share, 6 /
  // sum_j j^-1.2 = 1.76, caps at 1, and the other 5 picks spread over the
  // rest in proportion to j^-1.2: the second is picked 5 x 2^-1.2 /
  // sum_{j>=2} j^-1.2 = 0.900 of the time, (3/2)^1.2 = 1.63 times as often
  // as the third.
  std::vector<double> sorted = q;
  std::sort(sorted.rbegin(), sorted.rend());
  double rest = 0;
  for (int j = 2; j <= 64; ++j) rest += std::pow(j, -1.2);
  EXPECT_EQ(sorted[0], 1);
  EXPECT_NEAR(sorted[1], 5 * std::pow(2, -1.2) / rest, 1e-12);
  EXPECT_NEAR(sorted[1] / sorted[2], std::pow(1.5, 1.2), 1e-12);
  // With one pick a token none caps: the hottest expert is picked 2^1.2 =
  // 2.30 times as often as the second.
  auto top1 = ExpertRouting::Create(64, 1, 1.2, 7, 4);
  ASSERT_TRUE(top1.ok());
  std::vector<double> q1 = top1->pick_probability();
  std::sort(q1.rbegin(), q1.rend());
  EXPECT_NEAR(q1[0] / q1[1], std::pow(2, 1.2), 1e-12);
  // The busiest rank carries at least the mean load.
  double best = 0;
  for (int r = 0; r < 4; ++r) best = std::max(best, a->Rank(r, 100).assignments);
  EXPECT_DOUBLE_EQ(a->Busiest(100).assignments, best);
  EXPECT_GE(best, 100 * 6 / 4.0);
}

TEST(ExpertRoutingTest, BadShapesAreRefusedWithTheAllowedRange) {
  EXPECT_NE(ExpertRouting::Create(128, 0, 0, 1, 1).status().message().find("1..num_experts"),
            std::string::npos);
  EXPECT_NE(ExpertRouting::Create(128, 8, 0, 1, 3).status().message().find("3 ranks"),
            std::string::npos);
  EXPECT_NE(ExpertRouting::Create(128, 8, -1, 1, 1).status().message().find("[0, 16]"),
            std::string::npos);
}

// A GPU with round figures: 1 TFLOP/s, 1 TB/s, 1 us per kernel.
std::unique_ptr<Device> RoundGpu(const std::string& profile_dir = "", int64_t expert_d_ff = 0) {
  servesim::v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  auto* x = g->mutable_xpu();
  x->set_peak_flops_fp16(1e12);
  x->set_peak_flops_int8(2e12);
  x->set_memory_bytes(1e10);
  x->set_memory_bw_bytes_per_s(1e12);
  x->set_compute_utilization(1);
  x->set_memory_utilization(1);
  x->set_kernel_overhead_s(1e-6);
  g->mutable_interconnect()->set_bandwidth_bytes_per_s(1e11);
  g->mutable_interconnect()->set_latency_s(1e-6);
  g->set_dtype(servesim::v1::DTYPE_FP16);
  if (!profile_dir.empty()) {
    g->mutable_profile()->set_dir(profile_dir);
    g->mutable_profile()->set_d_model(8);
    g->mutable_profile()->set_expert_d_ff(expert_d_ff);
  }
  return *CreateDevice(spec);
}

Op MoeOp(int64_t m, double routed, double touched) {
  Op op;
  op.kind = OpKind::kMoe;
  op.stage = Stage::kMoe;
  op.m = m;
  op.k = 8;
  op.n = 6;
  op.experts_total = 4;
  op.top_k = 2;
  op.expert_matrices = 3;
  op.routed = routed;
  op.experts_touched = touched;
  return op;
}

TEST(GpuMoeTest, OneLayerFlopsBytesAndTimeByHand) {
  auto gpu = RoundGpu();
  // 4 tokens of width 8, top-2 of 4 experts 6 wide: 8 assignments over 4
  // experts.
  Cost c;
  ASSERT_TRUE(
      gpu->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(4, 8, 4)}), absl::MakeSpan(&c, 1))
          .ok());
  // Router 2*4*8*4 = 256; experts 8 * (2*8*6*3 + 6*6) = 2592.
  EXPECT_DOUBLE_EQ(c.flops, 256 + 2592);
  // Bytes x2: router 4*8 + 8*4 + 4*4 = 80; weights 4*3*8*6 = 576; rows in
  // and out 2*4*8 = 64; intermediates 8*2*3*6 = 288; expert outputs 8*8 = 64.
  EXPECT_DOUBLE_EQ(c.dram_bytes, 2 * (80 + 576 + 64 + 288 + 64));
  // Time: 2 rows per expert padded to 16: (2848 + (64 - 8) * 288) FLOPs at
  // 1 TFLOP/s beats 2144 bytes at 1 TB/s; plus four kernels.
  EXPECT_NEAR(c.time_s, (2848 + 56 * 288) / 1e12 + 4e-6, 1e-15);
}

std::string MoeBundle(const std::string& name, const std::string& moe_csv, int tp) {
  const fs::path root = fs::path(::testing::TempDir()) / "moe_test" / name;
  fs::remove_all(root);
  for (int t : {1, tp}) {
    fs::create_directories(root / ("tp" + std::to_string(t)));
    std::ofstream(root / ("tp" + std::to_string(t)) / "dense.csv")
        << "layer,tokens,time_us\nqkv_proj,1,10\n";
    std::ofstream(root / ("tp" + std::to_string(t)) / "per_sequence.csv")
        << "layer,sequences,time_us\nlm_head,1,100\n";
    std::ofstream(root / ("tp" + std::to_string(t)) / "attention.csv")
        << "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,5\n";
  }
  std::ofstream(root / "tp1" / "moe.csv") << moe_csv;
  return (root / ("tp" + std::to_string(tp))).string();
}

constexpr char kMoeCsv[] =
    "tokens,activated_experts,time_us\n"
    "1,2,50\n2,2,60\n2,4,100\n4,2,70\n4,4,120\n";

TEST(GpuMoeTest, ProfileIsExactAtGridPointsLinearBetweenAndSharedByTpFolders) {
  // A tp2 folder without moe.csv takes tp1's (the bundle measures TP 1).
  auto p = GpuProfile::Load(MoeBundle("grid", kMoeCsv, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->has_moe());
  bool beyond = false;
  double ct = 0, cx = 0;
  EXPECT_DOUBLE_EQ((*p)->Moe(2, 4, &beyond, &ct, &cx), 100e-6);
  // Tokens 3, experts 3: row 2 gives 80, row 4 gives 95; halfway 87.5.
  EXPECT_NEAR((*p)->Moe(3, 3, &beyond, &ct, &cx), 87.5e-6, 1e-15);
  // Row 1 only measured 2 experts: held there (not "beyond").
  EXPECT_NEAR((*p)->Moe(1.5, 3, &beyond, &ct, &cx), 0.5 * 50e-6 + 0.5 * 80e-6, 1e-15);
  EXPECT_FALSE(beyond);
  EXPECT_DOUBLE_EQ((*p)->Moe(8, 4, &beyond, &ct, &cx), 120e-6);
  EXPECT_TRUE(beyond);
  EXPECT_EQ(ct, 4);

  // The device: 4 assignments of top-2 = 2 tokens, 4 experts: 100 us.
  auto gpu = RoundGpu((*p)->dir(), 6);
  Cost c;
  ASSERT_TRUE(
      gpu->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(2, 4, 4)}), absl::MakeSpan(&c, 1))
          .ok());
  EXPECT_DOUBLE_EQ(c.time_s, 100e-6);
  // Past the grid: the last point scaled by the roofline's ratio.
  Cost big, edge, roof_big, roof_edge;
  auto roof = RoundGpu();
  ASSERT_TRUE(
      gpu->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(16, 32, 4)}), absl::MakeSpan(&big, 1))
          .ok());
  ASSERT_TRUE(roof->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(16, 32, 4)}),
                             absl::MakeSpan(&roof_big, 1))
                  .ok());
  ASSERT_TRUE(roof->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(4, 8, 4)}),
                             absl::MakeSpan(&roof_edge, 1))
                  .ok());
  ASSERT_TRUE(
      gpu->Estimate(absl::MakeConstSpan(std::vector<Op>{MoeOp(4, 8, 4)}), absl::MakeSpan(&edge, 1))
          .ok());
  EXPECT_DOUBLE_EQ(edge.time_s, 120e-6);  // the grid's last point
  EXPECT_NEAR(big.time_s, edge.time_s * roof_big.time_s / roof_edge.time_s, 1e-15);
}

TEST(GpuMoeTest, BadMoeRowsNameTheFileAndLine) {
  auto p =
      GpuProfile::Load(MoeBundle("bad", "tokens,activated_experts,time_us\n4,2,7\n2,2,6\n", 1));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("moe.csv:3"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace servesim::devices

namespace servesim::scheduler {
namespace {

class MoePlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    servesim::v1::DeviceSpec spec;
    *spec.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("h100-sxm-80gb");
    *spec.mutable_gpu()->mutable_interconnect() = *devices::LinkPreset("nvlink4");
    spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_BF16);
    device_ = *devices::CreateDevice(spec);
    model_ = devices::ModelDimsFromSpec(*devices::ModelPreset("qwen3-30b-a3b"));
  }
  PlannerConfig Config(int64_t dp, bool ep) {
    PlannerConfig c;
    c.tensor_parallel = 1;
    c.data_parallel = dp;
    c.expert_parallel = ep;
    c.xpu = device_.get();
    c.routing = std::make_shared<const devices::ExpertRouting>(
        *devices::ExpertRouting::Create(128, 8, 0, 1, ep ? dp : 1));
    return c;
  }
  static const devices::Op* Find(const std::vector<devices::Op>& ops, devices::Stage s) {
    for (const auto& op : ops) {
      if (op.stage == s) return &op;
    }
    return nullptr;
  }
  std::unique_ptr<devices::Device> device_;
  devices::ModelDims model_;
};

TEST_F(MoePlannerTest, ExpertParallelRanksExchangeTheGroupsTokens) {
  IterationPlanner p(model_, Config(2, true));
  p.SetGroupTokens(10);
  ASSERT_TRUE(p.Plan(UniformBatch(4, 1, 100)).ok());
  const devices::Op* moe = Find(p.last_ops(), devices::Stage::kMoe);
  ASSERT_NE(moe, nullptr);
  EXPECT_EQ(Find(p.last_ops(), devices::Stage::kFf1), nullptr);  // no dense FF
  // The group's 10 tokens reach every rank; top-8 of 128 experts split 64 a
  // rank: 40 assignments, whole experts.
  EXPECT_EQ(moe->m, 10);
  EXPECT_EQ(moe->n, 768);
  EXPECT_NEAR(moe->routed, 40, 1e-9);
  EXPECT_NEAR(moe->experts_touched, 64 * (1 - std::pow(15.0 / 16, 10)), 1e-9);
  // All-gather in, reduce-scatter out: 10 x 2048 bf16 over the 2 ranks.
  const devices::Op* ex = Find(p.last_ops(), devices::Stage::kMoeDispatch);
  ASSERT_NE(ex, nullptr);
  EXPECT_EQ(ex->kind, devices::OpKind::kAllReduce);
  EXPECT_DOUBLE_EQ(ex->bytes, 10 * 2048 * 2);
  EXPECT_EQ(ex->participants, 2);
  // Weights per rank: half the routed experts, all the rest.
  const double routed = 48.0 * 128 * 4718592 * 2;
  EXPECT_DOUBLE_EQ(p.WeightBytesPerXpu(), model_.WeightBytes() - routed / 2);
}

TEST_F(MoePlannerTest, WithoutExpertParallelismEveryRankHoldsASliceOfEveryExpert) {
  IterationPlanner p(model_, Config(2, false));
  ASSERT_TRUE(p.Plan(UniformBatch(5, 1, 100)).ok());  // group tokens: 5 x 2
  const devices::Op* moe = Find(p.last_ops(), devices::Stage::kMoe);
  ASSERT_NE(moe, nullptr);
  EXPECT_EQ(moe->m, 10);
  EXPECT_EQ(moe->n, 384);
  EXPECT_NEAR(moe->routed, 80, 1e-9);
  EXPECT_NEAR(moe->experts_touched, 128 * (1 - std::pow(15.0 / 16, 10)), 1e-9);
}

TEST_F(MoePlannerTest, AnIdleRankRunsTheMoeLayersForTheOthers) {
  IterationPlanner p(model_, Config(2, true));
  auto idle = p.PlanIdleRank(10);
  ASSERT_TRUE(idle.ok()) << idle.status();
  // 48 layers x (MoE block + exchange), nothing else.
  p.SetGroupTokens(10);
  ASSERT_TRUE(p.Plan(UniformBatch(4, 1, 100)).ok());
  const devices::Op* moe = Find(p.last_ops(), devices::Stage::kMoe);
  const devices::Op* ex = Find(p.last_ops(), devices::Stage::kMoeDispatch);
  devices::Cost c[2];
  ASSERT_TRUE(device_->Estimate(std::vector<devices::Op>{*moe, *ex}, absl::MakeSpan(c, 2)).ok());
  EXPECT_NEAR(idle->time_s, 48 * (c[0].time_s + c[1].time_s), 1e-12);
  EXPECT_GT(idle->time_s, 0);
  auto busy = p.Plan(UniformBatch(4, 1, 100));
  EXPECT_GT(busy->time_s, idle->time_s);
}

TEST_F(MoePlannerTest, SkewedRanksWaitForTheSlowestNotTheBusiest) {
  PlannerConfig c = Config(8, true);
  c.routing = std::make_shared<const devices::ExpertRouting>(
      *devices::ExpertRouting::Create(128, 8, 2, 3, 8));
  IterationPlanner p(model_, c);
  p.SetGroupTokens(64);
  ASSERT_TRUE(p.Plan(UniformBatch(8, 1, 100)).ok());
  const devices::Op* moe = Find(p.last_ops(), devices::Stage::kMoe);
  ASSERT_NE(moe, nullptr);
  // Every rank's MoE op; the planner's is the slowest of them.
  double slowest = 0, chosen = 0;
  for (int64_t r = 0; r < 8; ++r) {
    devices::Op op = *moe;
    const devices::ExpertLoad l = c.routing->Rank(r, 64);
    op.routed = l.assignments;
    op.experts_touched = l.experts_touched;
    devices::Cost cost;
    ASSERT_TRUE(device_->Estimate(absl::MakeConstSpan(&op, 1), absl::MakeSpan(&cost, 1)).ok());
    slowest = std::max(slowest, cost.time_s);
  }
  devices::Cost mine;
  ASSERT_TRUE(device_->Estimate(absl::MakeConstSpan(moe, 1), absl::MakeSpan(&mine, 1)).ok());
  chosen = mine.time_s;
  EXPECT_DOUBLE_EQ(chosen, slowest);
  // At 64 tokens the weight reads dominate: the rank touching the most
  // experts, not the one with the hot experts' assignments.
  EXPECT_NE(c.routing->MostTouched(64), c.routing->busiest_rank());
  EXPECT_NEAR(moe->experts_touched, c.routing->Rank(c.routing->MostTouched(64), 64).experts_touched,
              1e-12);
}

// An attention device that charges 1 us per attention op.
class MicrosecondAttention : public devices::Device {
 public:
  devices::DeviceDescription Describe() const override {
    devices::DeviceDescription d;
    d.kind = "fake";
    d.accepts = {devices::OpKind::kAttention};
    return d;
  }
  absl::Status Estimate(absl::Span<const devices::Op> ops,
                        absl::Span<devices::Cost> costs) const override {
    for (size_t i = 0; i < ops.size(); ++i) costs[i].time_s = 1e-6;
    return absl::OkStatus();
  }
  absl::StatusOr<devices::AttentionResult> Execute(const devices::AttentionCall&) const override {
    return absl::UnimplementedError("costs only");
  }
};

TEST_F(MoePlannerTest, BesideAnAttentionDeviceTheExpertsTakeTheFeedForwardsPlace) {
  MicrosecondAttention att;
  PlannerConfig c = Config(1, false);
  c.tensor_parallel = 2;
  c.attention = &att;
  c.link_bytes_per_s = 64e9;
  c.link_latency_s = 1e-6;
  IterationPlanner p(model_, c);
  auto cost = p.Plan(UniformBatch(8, 1, 100));
  ASSERT_TRUE(cost.ok()) << cost.status();
  // Decode attention went to the device: 48 layers x 1 us.
  EXPECT_NEAR(cost->device_busy_s, 48e-6, 1e-12);
  // The xPUs' FF block is the MoE block for 8 tokens on each of the two
  // xPUs, every expert 768 / 2 wide: 64 assignments.
  devices::Op moe;
  moe.kind = devices::OpKind::kMoe;
  moe.stage = devices::Stage::kMoe;
  moe.m = 8, moe.n = 384, moe.k = 2048;
  moe.experts_total = 128, moe.top_k = 8, moe.expert_matrices = 3;
  moe.routed = 64;
  moe.experts_touched = 128 * (1 - std::pow(15.0 / 16, 8));
  moe.tokens = 8, moe.sequences = 8;
  devices::Cost want;
  ASSERT_TRUE(device_->Estimate(absl::MakeConstSpan(&moe, 1), absl::MakeSpan(&want, 1)).ok());
  EXPECT_NEAR(cost->stages[static_cast<int>(devices::Stage::kFf1)].time_s, 48 * want.time_s, 1e-12);
}

TEST_F(MoePlannerTest, DenseFirstLayersKeepTheDenseFeedForward) {
  devices::ModelDims m = model_;
  m.dense_layers = 3;
  IterationPlanner moe_only(model_, Config(1, false));
  IterationPlanner mixed(m, Config(1, false));
  const Batch b = UniformBatch(8, 1, 64);
  auto a = moe_only.Plan(b);
  auto c = mixed.Plan(b);
  ASSERT_TRUE(a.ok() && c.ok());
  // 3 layers trade the MoE block for the 6144-wide dense FF.
  const devices::Cost& moe = a->stages[static_cast<int>(devices::Stage::kMoe)];
  const devices::Cost& moe3 = c->stages[static_cast<int>(devices::Stage::kMoe)];
  EXPECT_NEAR(moe3.time_s, moe.time_s * 45 / 48, 1e-12);
  EXPECT_GT(c->stages[static_cast<int>(devices::Stage::kFf1)].flops, 0);
  EXPECT_DOUBLE_EQ(c->stages[static_cast<int>(devices::Stage::kFf1)].flops,
                   3 * 2.0 * 8 * (2 * 6144) * 2048);
}

}  // namespace
}  // namespace servesim::scheduler
