// Scheduler layer under a fake clock: KV capacity, admission, preemption,
// chunked prefill budgets, rejection, routing, and the iteration planner
// against AttAcc's published decode latency.
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "devices/model.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/kv_cache.h"
#include "scheduler/planner.h"
#include "scheduler/router.h"

namespace servesim::scheduler {
namespace {

// Records what the scheduler reports.
class FakeObserver : public RequestObserver {
 public:
  struct Token {
    int64_t id;  // -1: a later token (OnGaps says whose no more)
    double t;
    double gap;  // -1: a first token
  };
  void OnFirstToken(const RequestState& r, double t) override {
    tokens.push_back({r.spec.id, t, -1});
  }
  void OnGaps(double t, double gap, int64_t count) override {
    gap_calls.push_back(count);
    for (int64_t k = 0; k < count; ++k) tokens.push_back({-1, t, gap});
  }
  void OnFinish(const RequestState& r, double t) override {
    finished.push_back(r.spec.id);
    finish_time.push_back(t);
    generated.push_back(r.generated);
  }
  void OnReject(const RequestSpec& r, RejectReason why, double) override {
    rejected.push_back({r.id, why});
  }
  std::vector<Token> tokens;
  std::vector<int64_t> gap_calls;  // each OnGaps call's count
  std::vector<int64_t> finished, generated;
  std::vector<double> finish_time;
  std::vector<std::pair<int64_t, RejectReason>> rejected;
};

BatchingConfig SmallConfig() {
  BatchingConfig c;
  c.kv_block_tokens = 16;
  c.kv_capacity_blocks = 10;
  c.kv_watermark = 0;
  c.max_context_tokens = 4096;
  c.max_batch_size = 8;
  c.max_tokens_per_iteration = 8192;
  return c;
}

RequestSpec Req(int64_t id, int64_t in, int64_t out) { return {id, 0.0, in, out, {}}; }

// --------------------------------------------------------------- KV --

TEST(KvCapacityTest, Gpt3OnDgxA100Hbm3) {
  // GPT-3 175B on 8 x A100-HBM3 (80 GiB), 90% usable, 16-token blocks,
  // activations for 8192 tokens:
  //   weights/xPU     174,568,476,672 x 2 / 8      = 43,642,119,168 B
  //   activations/xPU 2 x (12288 + 36x128 + 6144) x 8192 x 2 = 754,974,720 B
  //   KV/token/xPU    2 x 96 layers x 12 heads x 128 x 2     = 589,824 B
  //   usable = 77,309,411,328 - 43,642,119,168 - 754,974,720 = 32,912,317,440
  //   blocks = floor(32,912,317,440 / (16 x 589,824)) = 3487
  auto spec = devices::ModelPreset("gpt3-175b");
  auto model = devices::ModelDimsFromSpec(*spec);
  IterationPlanner sizes(model, 8, nullptr);
  EXPECT_EQ(sizes.KvBytesPerTokenPerXpu(), 589'824);
  EXPECT_DOUBLE_EQ(sizes.ActivationBytesPerXpu(8192), 754'974'720.0);
  KvCapacityInputs in;
  in.memory_bytes_per_xpu = 85'899'345'920.0;
  in.xpus = 8;
  in.memory_utilization = 0.9;
  in.weight_bytes = model.WeightBytes();
  in.activation_bytes_per_xpu = sizes.ActivationBytesPerXpu(8192);
  in.kv_bytes_per_token_per_xpu = sizes.KvBytesPerTokenPerXpu();
  in.block_tokens = 16;
  const KvCapacity kv = ComputeKvCapacity(in);
  EXPECT_DOUBLE_EQ(kv.usable_bytes_per_xpu, 32'912'317'440.0);
  EXPECT_EQ(kv.blocks, 3487);
  EXPECT_EQ(kv.tokens, 55'792);
  // AttAcc §3.2's point: a (2048, 2048) request needs 4096 tokens of KV, so
  // this replica holds at most 13 such requests.
  EXPECT_EQ(kv.tokens / 4096, 13);
}

TEST(KvCapacityTest, ReplicatesKvHeadsBeyondTheirCount) {
  // LLaMA-2 70B has 8 KV heads; at TP=16 each xPU still holds one.
  auto model = devices::ModelDimsFromSpec(*devices::ModelPreset("llama2-70b"));
  IterationPlanner tp8(model, 8, nullptr), tp16(model, 16, nullptr);
  EXPECT_EQ(tp8.kv_heads_per_xpu(), 1);
  EXPECT_EQ(tp16.kv_heads_per_xpu(), 1);
  EXPECT_EQ(tp16.KvBytesPerTokenPerXpu(), 2 * 80 * 1 * 128 * 2);
}

TEST(KvCapacityTest, NoRoomGivesZeroBlocks) {
  KvCapacityInputs in;
  in.memory_bytes_per_xpu = 40e9;
  in.weight_bytes = 350e9;
  in.kv_bytes_per_token_per_xpu = 1000;
  EXPECT_EQ(ComputeKvCapacity(in).blocks, 0);
}

TEST(KvCapacityTest, BlockCountsSaturateInsteadOfOverflowing) {
  EXPECT_EQ(KvBlocksIn(100, 16), 6);
  EXPECT_EQ(KvBlocksIn(96, 16), 6);
  EXPECT_EQ(KvBlocksIn(15.9, 16), 0);
  EXPECT_EQ(KvBlocksIn(-5, 16), 0);
  EXPECT_EQ(KvBlocksIn(100, 0), 0);
  EXPECT_EQ(KvBlocksIn(std::nan(""), 16), 0);
  EXPECT_EQ(KvBlocksIn(100, std::nan("")), 0);
  // 1e96 / 16 is past int64: the count stops at kMaxKvBlocks = 2^52.
  EXPECT_EQ(KvBlocksIn(1e96, 16), int64_t{1} << 52);
  EXPECT_EQ(KvBlocksIn(std::numeric_limits<double>::infinity(), 16), kMaxKvBlocks);
  EXPECT_EQ(KvBlocksIn(0x1p52 * 16 - 16, 16), kMaxKvBlocks - 1);
  KvCapacityInputs in;
  in.memory_bytes_per_xpu = 1e96;
  in.kv_bytes_per_token_per_xpu = 1;
  in.block_tokens = 1024;
  const KvCapacity kv = ComputeKvCapacity(in);
  EXPECT_EQ(kv.blocks, kMaxKvBlocks);
  EXPECT_EQ(kv.tokens, int64_t{1} << 62);
}

// ------------------------------------------------------ prefill-first --

TEST(PrefillFirstTest, AdmissionBlockedByKvCapacity) {
  ReplicaScheduler s(SmallConfig());  // 10 blocks of 16 tokens
  FakeObserver obs;
  s.Add(Req(0, 100, 4), 0, &obs);  // 7 blocks
  s.Add(Req(1, 60, 4), 0, &obs);   // 4 blocks: only 3 left
  const Batch& b = s.Schedule(0);
  ASSERT_EQ(b.entries.size(), 1u);
  EXPECT_TRUE(b.entries[0].prefill);
  EXPECT_EQ(b.entries[0].new_tokens, 100);
  EXPECT_EQ(b.prefill_tokens, 100);
  EXPECT_EQ(s.kv().used(), 7);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.queued_block_demand(), 4);
}

TEST(PrefillFirstTest, WatermarkKeepsBlocksFree) {
  BatchingConfig c = SmallConfig();
  c.kv_watermark = 0.2;  // 2 of 10 blocks
  ReplicaScheduler s(c);
  s.Add(Req(0, 100, 2), 0, nullptr);  // 7 blocks: 3 left >= 2
  s.Add(Req(1, 16, 2), 0, nullptr);   // 1 block: 2 left, not < 2: admitted
  s.Add(Req(2, 16, 2), 0, nullptr);   // would leave 1 < 2
  EXPECT_EQ(s.Schedule(0).entries.size(), 2u);
}

TEST(PrefillFirstTest, TokenBudgetAndOversizedFirstPrompt) {
  BatchingConfig c = SmallConfig();
  c.kv_capacity_blocks = 10000;
  c.max_tokens_per_iteration = 8192;
  c.max_context_tokens = 1 << 20;
  ReplicaScheduler s(c);
  s.Add(Req(0, 9000, 2), 0, nullptr);  // larger than the budget: runs alone
  s.Add(Req(1, 5000, 2), 0, nullptr);
  s.Add(Req(2, 3000, 2), 0, nullptr);
  s.Add(Req(3, 100, 2), 0, nullptr);
  EXPECT_EQ(s.Schedule(0).prefill_tokens, 9000);
  s.Complete(1, nullptr);
  // FCFS: 5000 + 3000 fit; 100 more would too (8100 <= 8192).
  const Batch& b = s.Schedule(1);
  EXPECT_EQ(b.prefill_tokens, 8100);
  EXPECT_EQ(b.entries.size(), 3u);
}

TEST(PrefillFirstTest, TokensTtftAndFinishUnderFakeClock) {
  ReplicaScheduler s(SmallConfig());
  FakeObserver obs;
  s.Add(Req(0, 20, 3), 0.0, &obs);
  s.Schedule(0.0);
  s.Complete(0.5, &obs);  // prefill ends: first token
  const Batch& d1 = s.Schedule(0.5);
  ASSERT_EQ(d1.entries.size(), 1u);
  EXPECT_FALSE(d1.entries[0].prefill);
  EXPECT_EQ(d1.entries[0].past_tokens, 20);
  s.Complete(0.6, &obs);
  EXPECT_EQ(s.Schedule(0.6).entries[0].past_tokens, 21);
  s.Complete(0.75, &obs);
  ASSERT_EQ(obs.tokens.size(), 3u);
  EXPECT_DOUBLE_EQ(obs.tokens[0].t, 0.5);
  EXPECT_LT(obs.tokens[0].gap, 0);
  EXPECT_DOUBLE_EQ(obs.tokens[1].gap, 0.6 - 0.5);
  EXPECT_DOUBLE_EQ(obs.tokens[2].gap, 0.75 - 0.6);
  ASSERT_EQ(obs.finished, std::vector<int64_t>{0});
  EXPECT_DOUBLE_EQ(obs.finish_time[0], 0.75);
  EXPECT_TRUE(s.Idle());
  EXPECT_EQ(s.kv().used(), 0);
  EXPECT_TRUE(s.Schedule(1.0).empty());
}

// A step's later tokens with equal gaps come in one OnGaps call: A and B
// decode in consecutive steps (one call of 2), then C prefills alone and
// joins them: A and B waited 1.5 s, C 0.5 s (two calls).
TEST(PrefillFirstTest, AStepsEqualGapsComeTogether) {
  ReplicaScheduler s(SmallConfig());
  FakeObserver obs;
  s.Add(Req(0, 20, 5), 0.0, &obs);
  s.Add(Req(1, 20, 5), 0.0, &obs);
  s.Schedule(0.0);
  s.Complete(1.0, &obs);  // both prefilled: first tokens
  EXPECT_EQ(s.Schedule(1.0).decode_tokens, 2);
  s.Complete(2.0, &obs);
  EXPECT_EQ(obs.gap_calls, (std::vector<int64_t>{2}));
  s.Add(Req(2, 20, 5), 2.0, &obs);
  EXPECT_EQ(s.Schedule(2.0).prefill_tokens, 20);  // prefill first, alone
  s.Complete(3.0, &obs);
  EXPECT_EQ(obs.gap_calls, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.Schedule(3.0).decode_tokens, 3);
  s.Complete(3.5, &obs);
  EXPECT_EQ(obs.gap_calls, (std::vector<int64_t>{2, 2, 1}));
  ASSERT_EQ(obs.tokens.size(), 8u);
  // Firsts at 1.0 (A, B) and 3.0 (C); later tokens in batch order.
  EXPECT_EQ(obs.tokens[4].id, 2);
  EXPECT_DOUBLE_EQ(obs.tokens[4].t, 3.0);
  EXPECT_DOUBLE_EQ(obs.tokens[2].gap, 1.0);
  EXPECT_DOUBLE_EQ(obs.tokens[5].gap, 1.5);
  EXPECT_DOUBLE_EQ(obs.tokens[6].gap, 1.5);
  EXPECT_DOUBLE_EQ(obs.tokens[7].gap, 0.5);
}

TEST(PrefillFirstTest, DecodeGrowthPreemptsTheNewestRequest) {
  BatchingConfig c = SmallConfig();
  c.kv_block_tokens = 4;
  c.kv_capacity_blocks = 4;
  ReplicaScheduler s(c);
  FakeObserver obs;
  s.Add(Req(0, 4, 8), 0, &obs);  // 1 block each; 4+8 = 12 tokens = 3 blocks
  s.Add(Req(1, 4, 8), 0, &obs);
  EXPECT_EQ(s.Schedule(0).entries.size(), 2u);
  s.Complete(1, &obs);  // both hold 4 tokens in 1 block; 2 blocks free
  // Decode 1: both need a 2nd block (5th token): 2 allocated, 0 free.
  EXPECT_EQ(s.Schedule(1).entries.size(), 2u);
  s.Complete(2, &obs);
  for (int step = 0; step < 3; ++step) {  // tokens 6..8 fit in block 2
    EXPECT_EQ(s.Schedule(2 + step).entries.size(), 2u);
    s.Complete(3 + step, &obs);
  }
  // Both hold 8 tokens; the 9th needs a 3rd block each and none is free:
  // request 1 (admitted last) is preempted, request 0 takes its blocks.
  const Batch& b = s.Schedule(5);
  ASSERT_EQ(b.entries.size(), 1u);
  EXPECT_EQ(s.state(b.entries[0].slot).spec.id, 0);
  EXPECT_EQ(s.total_preemptions(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  s.Complete(6, &obs);
  // Request 1 had generated 5 tokens: it re-prefills 4 + 5 = 9 tokens
  // when blocks allow; prefill-first tries it before decoding.
  bool saw_recompute = false;
  double t = 6;
  while (!s.Idle()) {
    const Batch& next = s.Schedule(t);
    ASSERT_FALSE(next.empty());
    for (const BatchEntry& e : next.entries) {
      if (e.prefill && s.state(e.slot).spec.id == 1) {
        EXPECT_EQ(e.new_tokens, 9);
        saw_recompute = true;
      }
    }
    t += 1;
    s.Complete(t, &obs);
  }
  EXPECT_TRUE(saw_recompute);
  EXPECT_EQ(obs.finished.size(), 2u);
  // Each request produced exactly its 8 tokens despite the preemption: one
  // first token each, 14 later ones.
  EXPECT_EQ(obs.generated, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(obs.tokens.size(), 16u);
  int firsts[2] = {0, 0};
  for (const auto& tok : obs.tokens) {
    if (tok.gap < 0) ++firsts[tok.id];
  }
  EXPECT_EQ(firsts[0], 1);
  EXPECT_EQ(firsts[1], 1);
  EXPECT_EQ(s.kv().used(), 0);
}

TEST(RejectTest, TooLongAndOverCapacity) {
  ReplicaScheduler s(SmallConfig());  // 160 tokens of KV, context 4096
  FakeObserver obs;
  EXPECT_EQ(s.Add(Req(0, 4000, 100), 0, &obs), RejectReason::kTooLong);
  EXPECT_EQ(s.Add(Req(1, 150, 20), 0, &obs), RejectReason::kExceedsKvCapacity);
  EXPECT_EQ(s.Add(Req(2, 150, 10), 0, &obs), RejectReason::kNone);  // 160 fits
  ASSERT_EQ(obs.rejected.size(), 2u);
  EXPECT_EQ(obs.rejected[0].second, RejectReason::kTooLong);
  EXPECT_TRUE(s.num_waiting() == 1);
}

// ---------------------------------------------------- chunked prefill --

TEST(ChunkedPrefillTest, DecodesFirstThenChunksWithinBudget) {
  BatchingConfig c = SmallConfig();
  c.policy = BatchingPolicy::kChunkedPrefill;
  c.max_tokens_per_iteration = 512;
  c.kv_capacity_blocks = 1000;
  ReplicaScheduler s(c);
  FakeObserver obs;
  for (int i = 0; i < 3; ++i) s.Add(Req(i, 10, 50), 0, &obs);
  EXPECT_EQ(s.Schedule(0).prefill_tokens, 30);
  s.Complete(1, &obs);  // three running decoders
  s.Add(Req(3, 1000, 5), 1, &obs);
  const Batch& b = s.Schedule(1);
  EXPECT_EQ(b.decode_tokens, 3);
  EXPECT_EQ(b.prefill_tokens, 509);  // 512 - 3 decodes
  EXPECT_EQ(b.emitting, 3);          // the partial chunk emits nothing
  s.Complete(2, &obs);
  const Batch& b2 = s.Schedule(2);
  EXPECT_EQ(b2.prefill_tokens, 491);  // the rest of the prompt
  EXPECT_EQ(b2.emitting, 4);          // ... which now yields a token
  bool found = false;
  for (const BatchEntry& e : b2.entries) {
    if (e.prefill) {
      EXPECT_EQ(e.past_tokens, 509);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(ChunkedPrefillTest, MaxBatchSizeCapsRunning) {
  BatchingConfig c = SmallConfig();
  c.policy = BatchingPolicy::kChunkedPrefill;
  c.kv_capacity_blocks = 1000;
  c.max_batch_size = 2;
  ReplicaScheduler s(c);
  for (int i = 0; i < 5; ++i) s.Add(Req(i, 8, 3), 0, nullptr);
  EXPECT_EQ(s.Schedule(0).entries.size(), 2u);
  EXPECT_EQ(s.num_running(), 2);
}

// --------------------------------------------------------------- router --

TEST(RouterTest, RoundRobin) {
  Router r(RoutingPolicy::kRoundRobin);
  std::vector<ReplicaLoad> loads(3);
  std::vector<int> picks;
  for (int i = 0; i < 5; ++i) picks.push_back(r.Route(loads));
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 2, 0, 1}));
}

TEST(RouterTest, LeastOutstandingTiesGoLow) {
  Router r(RoutingPolicy::kLeastOutstanding);
  std::vector<ReplicaLoad> loads(3);
  loads[0].outstanding = 2, loads[1].outstanding = 1, loads[2].outstanding = 1;
  EXPECT_EQ(r.Route(loads), 1);
}

TEST(RouterTest, LeastKvLoadComparesFractions) {
  Router r(RoutingPolicy::kLeastKvLoad);
  std::vector<ReplicaLoad> loads(2);
  loads[0] = {0, 50, 10, 100};   // 60%
  loads[1] = {0, 100, 10, 200};  // 55%
  EXPECT_EQ(r.Route(loads), 1);
  loads[1].kv_blocks_queued = 20;  // 60%: tie goes to 0
  EXPECT_EQ(r.Route(loads), 0);
}

TEST(RouterTest, PrefixAffinityWeighsCachedBlocksAgainstQueuedWork) {
  Router r(RoutingPolicy::kPrefixAffinity);
  std::vector<ReplicaLoad> loads(3);
  for (auto& l : loads) l.prompt_blocks = 64;
  // Replica 1 holds 48 of the prompt's 64 blocks but has 40 queued:
  // 40 + 16 = 56 ahead, against 10 + 64 = 74 and 0 + 64 = 64.
  loads[0].kv_blocks_queued = 10;
  loads[1].kv_blocks_queued = 40, loads[1].prefix_hit_blocks = 48;
  EXPECT_EQ(r.Route(loads), 1);
  // With 50 queued it is 66 ahead: the idle replica wins.
  loads[1].kv_blocks_queued = 50;
  EXPECT_EQ(r.Route(loads), 2);
  // No hits anywhere: the least queued; a tie goes to the lowest index.
  loads[1].prefix_hit_blocks = 0, loads[2].kv_blocks_queued = 10;
  EXPECT_EQ(r.Route(loads), 0);
}

TEST(ReplicaSchedulerTest, CachedPrefixBlocksCountsTheLeadingCachedBlocks) {
  BatchingConfig c;
  c.policy = BatchingPolicy::kVllmV1;
  c.kv_block_tokens = 16;
  c.kv_capacity_blocks = 100;
  c.kv_watermark = 0;
  c.max_context_tokens = 1 << 20;
  c.prefix_caching = true;
  ReplicaScheduler s(c);
  auto hashes = [](std::vector<uint64_t> h) {
    return std::make_shared<const std::vector<uint64_t>>(std::move(h));
  };
  RequestSpec a{0, 0.0, 64, 1, hashes({11, 12, 13, 14})};
  s.Add(a, 0, nullptr);
  s.Schedule(0);
  s.Complete(1, nullptr);  // its 4 full blocks are cached (and now free)
  // Shares the first two blocks; the third differs.
  RequestSpec b{1, 1.0, 80, 1, hashes({11, 12, 99, 14, 15})};
  EXPECT_EQ(s.CachedPrefixBlocks(b), 2);
  // A 64-token prompt with a's blocks: the last token is left to compute,
  // so 3 blocks at most (as admission takes them).
  RequestSpec same{2, 1.0, 64, 1, hashes({11, 12, 13, 14})};
  EXPECT_EQ(s.CachedPrefixBlocks(same), 3);
  RequestSpec none{3, 1.0, 64, 1, nullptr};
  EXPECT_EQ(s.CachedPrefixBlocks(none), 0);
}

// -------------------------------------------------------------- planner --

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    servesim::v1::DeviceSpec spec;
    *spec.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("a100-hbm3");
    *spec.mutable_gpu()->mutable_interconnect() = *devices::LinkPreset("nvlink3");
    spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_FP16);
    device_ = *devices::CreateDevice(spec);
  }
  static Batch Decode(const std::vector<int64_t>& past) {
    Batch b;
    for (size_t i = 0; i < past.size(); ++i) {
      b.entries.push_back({static_cast<int32_t>(i), 1, past[i], false, true, {}});
    }
    b.decode_tokens = b.emitting = static_cast<int64_t>(past.size());
    return b;
  }
  std::unique_ptr<devices::Device> device_;
};

TEST_F(PlannerTest, Gpt3DecodeOnDgxA100Hbm3AtBatch64) {
  // AttAcc §3.2's configuration: GPT-3 175B on a DGX of A100-HBM3 (TP = 8),
  // batch 64, (L_in, L_out) = (2048, 2048), whose decode iterations see
  // L = 2048..4096 (3072 on average). The paper reports ~80 ms per output
  // token there, more than half of it attention. The roofline's figures are
  // pinned (docs/devices/gpu.md prints them): 57.1 ms at L ~ 2048 (attention
  // 27.6 ms) and 70.6 ms at L ~ 3072 (attention 41.1 ms, 58%).
  auto model = devices::ModelDimsFromSpec(*devices::ModelPreset("gpt3-175b"));
  IterationPlanner planner(model, 8, device_.get());
  struct Point {
    int64_t first_past;
    double time_ms, attention_ms;
  };
  for (const Point& p : {Point{2016, 57.1, 27.6}, Point{3040, 70.6, 41.1}}) {
    std::vector<int64_t> past(64);
    for (int i = 0; i < 64; ++i) past[i] = p.first_past + i;  // L = past + 1 .. past + 64
    auto c = planner.Plan(Decode(past));
    ASSERT_TRUE(c.ok());
    const double attention_ms =
        c->stages[static_cast<int>(devices::Stage::kAttention)].time_s * 1e3;
    std::printf("GPT-3 175B decode, batch 64, L %lld..%lld, DGX A100-HBM3: %.2f ms "
                "(attention %.2f ms)\n", static_cast<long long>(p.first_past + 1),
                static_cast<long long>(p.first_past + 64), c->time_s * 1e3, attention_ms);
    EXPECT_NEAR(c->time_s * 1e3, p.time_ms, 0.02 * p.time_ms) << p.first_past;
    EXPECT_NEAR(attention_ms, p.attention_ms, 0.02 * p.attention_ms) << p.first_past;
  }
  std::vector<int64_t> past(64);
  for (int i = 0; i < 64; ++i) past[i] = 2016 + i;
  auto cost = planner.Plan(Decode(past));
  ASSERT_TRUE(cost.ok());
  // The FC layers read every weight once per iteration per xPU (12 d^2 / 8
  // per layer) plus their [64 x k] inputs and [64 x n] outputs:
  // QKV 12288->4608, projection 1536->12288, FF1 12288->6144, FF2 6144->12288.
  const double fc_bytes =
      cost->stages[static_cast<int>(devices::Stage::kQkv)].dram_bytes +
      cost->stages[static_cast<int>(devices::Stage::kProjection)].dram_bytes +
      cost->stages[static_cast<int>(devices::Stage::kFf1)].dram_bytes +
      cost->stages[static_cast<int>(devices::Stage::kFf2)].dram_bytes;
  const double weights = 12288.0 * (4608 + 1536 + 6144 + 6144);
  EXPECT_DOUBLE_EQ(weights, 12.0 * 12288 * 12288 / 8);
  const double activations =
      64.0 * ((12288 + 4608) + (1536 + 12288) + (12288 + 6144) + (6144 + 12288));
  EXPECT_DOUBLE_EQ(fc_bytes, 96 * 2 * (weights + activations));
}

TEST_F(PlannerTest, LayerOpsFollowMegatronSplit) {
  auto model = devices::ModelDimsFromSpec(*devices::ModelPreset("llama-65b"));
  IterationPlanner planner(model, 8, device_.get());
  ASSERT_TRUE(planner.Plan(Decode({100, 200, 300})).ok());
  const auto& ops = planner.last_ops();
  int gemms = 0;
  for (const auto& op : ops) {
    if (op.kind != devices::OpKind::kGemm) continue;
    ++gemms;
    switch (op.stage) {
      case devices::Stage::kQkv:
        EXPECT_EQ(op.n, 3 * 8 * 128);  // 8 heads per xPU, Q, K and V
        EXPECT_EQ(op.k, 8192);
        break;
      case devices::Stage::kFf1:
        EXPECT_EQ(op.n, 2 * 22016 / 8);  // SwiGLU gate + up
        break;
      case devices::Stage::kFf2:
        EXPECT_EQ(op.k, 22016 / 8);
        break;
      case devices::Stage::kLmHead:
        EXPECT_EQ(op.m, 3);
        EXPECT_EQ(op.n, 32000 / 8);
        break;
      default:
        break;
    }
    EXPECT_EQ(op.m, 3);
  }
  EXPECT_EQ(gemms, 5);
}

TEST_F(PlannerTest, TimeGrowsWithEachSequencesLength) {
  auto model = devices::ModelDimsFromSpec(*devices::ModelPreset("gpt3-175b"));
  IterationPlanner planner(model, 8, device_.get());
  const double short_ctx = planner.Plan(Decode(std::vector<int64_t>(16, 500)))->time_s;
  const double long_ctx = planner.Plan(Decode(std::vector<int64_t>(16, 4000)))->time_s;
  // 16 x 3500 more cached tokens x 4.72 MB / 8 xPUs / (3.35 TB/s x 0.85).
  const double expected = 16.0 * 3500 * 2 * 96 * 12 * 128 * 2 / (3.35e12 * 0.85);
  EXPECT_NEAR(long_ctx - short_ctx, expected, 1e-9);
}

// ------------------------------------------------------------ Project --

// Once nothing waits and every prompt is done, the projection is the batches
// that come, entry for entry: requests leave as their output ends.
TEST(ProjectTest, ProjectionIsTheComingBatchesWhenNothingArrives) {
  for (BatchingPolicy policy :
       {BatchingPolicy::kPrefillFirst, BatchingPolicy::kChunkedPrefill, BatchingPolicy::kVllmV1}) {
    BatchingConfig c = SmallConfig();
    c.policy = policy;
    c.kv_capacity_blocks = 1000;
    c.max_tokens_per_iteration = 64;  // prompts take several chunks (not prefill-first)
    ReplicaScheduler s(c);
    const int64_t outs[] = {5, 2, 9, 1, 7};
    for (int64_t i = 0; i < 5; ++i) s.Add(Req(i, 20 + 10 * i, outs[i]), 0, nullptr);
    std::vector<std::vector<Batch>> projections;  // made at each iteration
    std::vector<bool> settled;                    // nothing waits and no prompt is left after it
    std::vector<std::vector<std::array<int64_t, 3>>> actual;
    for (int it = 0; !s.Idle(); ++it) {
      ASSERT_LT(it, 100);
      const Batch& b = s.Schedule(it);
      std::vector<std::array<int64_t, 3>> entries;
      int64_t prefilling = 0;
      for (const BatchEntry& e : b.entries) {
        entries.push_back({e.request_id, e.new_tokens, e.past_tokens});
        const RequestState& r = s.state(e.slot);
        if (e.prefill && r.prefilled + e.new_tokens < r.prompt_tokens) ++prefilling;
      }
      actual.push_back(entries);
      projections.emplace_back();
      s.Project(32, &projections.back());
      // Requests not in this batch but still prefilling count too.
      for (int32_t slot = 0; slot < 5; ++slot) {
        const RequestState& r = s.state(slot);
        bool in = false;
        for (const BatchEntry& e : b.entries) in = in || e.slot == slot;
        if (!in && r.running && r.prefilled < r.prompt_tokens) ++prefilling;
      }
      settled.push_back(s.num_waiting() == 0 && prefilling == 0);
      s.Complete(it, nullptr);
    }
    int checked = 0;
    for (size_t i = 0; i < projections.size(); ++i) {
      if (!settled[i]) continue;
      const std::vector<Batch>& p = projections[i];
      // The projection runs to the end of the run, step for step.
      ASSERT_EQ(p.size(), actual.size() - i - 1)
          << "policy " << static_cast<int>(policy) << " iteration " << i;
      for (size_t k = 0; k < p.size(); ++k) {
        std::vector<std::array<int64_t, 3>> got;
        for (const BatchEntry& e : p[k].entries) {
          got.push_back({e.request_id, e.new_tokens, e.past_tokens});
          EXPECT_FALSE(e.prefill);
          EXPECT_TRUE(e.emits_token);
        }
        EXPECT_EQ(got, actual[i + 1 + k]) << "iteration " << i << " step " << k;
        EXPECT_EQ(p[k].decode_tokens, static_cast<int64_t>(got.size()));
        EXPECT_EQ(p[k].emitting, static_cast<int64_t>(got.size()));
      }
      ++checked;
    }
    // Every policy settles within a few iterations of the nine.
    EXPECT_GE(checked, 5) << "policy " << static_cast<int>(policy);
    EXPECT_TRUE(projections.back().empty());  // the last batch ends the run
  }
}

}  // namespace
}  // namespace servesim::scheduler
