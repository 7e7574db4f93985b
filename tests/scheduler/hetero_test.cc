// The heterogeneous xPU + attention-device system (AttAcc §4-§6) with a fake
// attention device: head placement, admission bounds, SLO-limited batching,
// and the overlap schedules of the iteration planner (its hints to remote
// devices: planner_hints_test.cc).
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "devices/model.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/placement.h"
#include "scheduler/planner.h"
#include "tests/scheduler/hetero_test_util.h"

namespace servesim::scheduler {
namespace {

using devices::Cost;
using devices::Op;
using test::Config;
using test::Decode;
using test::FakeAttentionDevice;
using test::Gpt3;
using test::Gpu;
using test::HeteroPlannerTest;

// ------------------------------------------------------------ placement --

TEST(StackPlacementTest, GreedyLeastLoadedWithCapacity) {
  StackPlacement p(3, 1000, 2);
  ASSERT_TRUE(p.Place(0, 600));  // heads -> stacks 0, 1
  EXPECT_EQ(std::vector<int32_t>(p.StacksOf(0).begin(), p.StacksOf(0).end()),
            (std::vector<int32_t>{0, 1}));
  // Both heads go to the emptiest stack: 0 then 300 of 600, 600, 0.
  ASSERT_TRUE(p.Place(1, 300));
  EXPECT_EQ(std::vector<int32_t>(p.StacksOf(1).begin(), p.StacksOf(1).end()),
            (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(p.reserved(2), 600);
  // 500 more fits no stack (600 + 500 > 1000): nothing is placed.
  EXPECT_FALSE(p.Place(2, 500));
  EXPECT_EQ(p.reserved(0), 600);
  EXPECT_EQ(p.reserved(2), 600);
  p.Release(0);
  EXPECT_EQ(p.reserved(0), 0);
  EXPECT_EQ(p.reserved(1), 0);
  ASSERT_TRUE(p.Place(2, 500));
  EXPECT_EQ(std::vector<int32_t>(p.StacksOf(2).begin(), p.StacksOf(2).end()),
            (std::vector<int32_t>{0, 1}));
}

TEST(StackPlacementTest, GenerationChangesOnPlaceAndReleaseOnly) {
  StackPlacement p(3, 1000, 2), q(3, 1000, 2);
  EXPECT_NE(p.generation(), 0u);
  EXPECT_NE(p.generation(), q.generation());
  const uint64_t g0 = p.generation();
  ASSERT_TRUE(p.Place(0, 600));
  const uint64_t g1 = p.generation();
  EXPECT_NE(g1, g0);
  (void)p.StacksOf(0);  // reads leave it alone
  EXPECT_EQ(p.reserved(0), 600);
  EXPECT_EQ(p.generation(), g1);
  EXPECT_FALSE(p.Place(1, 5000));  // every call takes a new one, failed or not
  const uint64_t g2 = p.generation();
  EXPECT_NE(g2, g1);
  p.Release(0);
  EXPECT_NE(p.generation(), g2);
  EXPECT_NE(p.generation(), g0);
}

// Place against the rule it implements, written the plain way (for each
// head, a scan of every stack for the least reserved with room, ties to the
// lowest index), over random admissions and releases: equal reservations
// (ties), tokens that divide the gaps and that do not, stacks filling up,
// admissions that fail and must leave nothing behind, and one stack far
// emptier than the rest (levels skipped).
TEST(StackPlacementTest, PicksTheGreedyScanPicksOnRandomAdmissions) {
  Rng rng(7, "placement");
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng.NextU64() % uint64_t(n)); };
  int failures = 0, placed = 0;
  for (int round = 0; round < 300; ++round) {
    const int stacks = 1 + static_cast<int>(below(48));
    const int kv_heads = 1 + static_cast<int>(below(100));
    const int64_t capacity = 1 + below(round % 3 == 0 ? 64 : 100000);
    StackPlacement p(stacks, capacity, kv_heads);
    std::vector<int64_t> ref(stacks, 0);
    std::vector<std::vector<int32_t>> ref_of(64);
    std::vector<int64_t> ref_tokens(64, 0);
    for (int step = 0; step < 200; ++step) {
      const auto slot = static_cast<int32_t>(below(64));
      if (!ref_of[slot].empty()) {
        for (int32_t s : ref_of[slot]) ref[s] -= ref_tokens[slot];
        ref_of[slot].clear();
        p.Release(slot);
        continue;
      }
      const int64_t tokens =
          1 + (step % 5 == 0 ? below(4) : below(std::max<int64_t>(1, capacity / 4)));
      std::vector<int64_t> r = ref;
      std::vector<int32_t> want;
      bool ok = true;
      for (int h = 0; h < kv_heads && ok; ++h) {
        int best = -1;
        for (int s = 0; s < stacks; ++s) {
          if (r[s] + tokens <= capacity && (best < 0 || r[s] < r[best])) best = s;
        }
        if (best < 0) {
          ok = false;
          break;
        }
        r[best] += tokens;
        want.push_back(best);
      }
      ASSERT_EQ(p.Place(slot, tokens), ok) << "round " << round << " step " << step;
      if (!ok) {
        ++failures;
      } else {
        ++placed;
        ref = r;
        ref_of[slot] = want;
        ref_tokens[slot] = tokens;
        ASSERT_EQ(std::vector<int32_t>(p.StacksOf(slot).begin(), p.StacksOf(slot).end()), want)
            << "round " << round << " step " << step;
      }
      for (int s = 0; s < stacks; ++s) {
        ASSERT_EQ(p.reserved(s), ref[s]) << "round " << round << " stack " << s;
      }
    }
  }
  // Both outcomes were exercised, many times.
  EXPECT_GT(failures, 1000);
  EXPECT_GT(placed, 1000);
}

TEST(StackPlacementTest, SchedulerAdmitsOnlyWhatStacksHold) {
  BatchingConfig c;
  c.kv_capacity_blocks = 1 << 20;  // blocks never bind here
  c.kv_watermark = 0;
  c.max_context_tokens = 1 << 20;
  c.placement_stacks = 2;
  c.placement_capacity_tokens = 1000;
  c.placement_kv_heads = 4;  // 4 heads over 2 stacks: 2 heads per stack
  ReplicaScheduler s(c);
  for (int i = 0; i < 3; ++i) s.Add({i, 0, 200, 50, {}}, 0, nullptr);  // 250 each
  const Batch& b = s.Schedule(0);
  // Per stack: 2 heads x 250 per request; 1000 holds 2 requests.
  EXPECT_EQ(b.entries.size(), 2u);
  EXPECT_EQ(b.bound, BatchBound::kCapacity);
  ASSERT_EQ(b.entries[0].kv_stacks.size(), 4u);
  // A request whose single head exceeds a stack is rejected at arrival.
  EXPECT_EQ(s.Add({9, 0, 900, 101, {}}, 0, nullptr), RejectReason::kExceedsKvCapacity);
}

TEST(BatchBoundTest, SloCapStopsAdmission) {
  BatchingConfig c;
  c.kv_capacity_blocks = 1000;
  c.max_context_tokens = 4096;
  ReplicaScheduler s(c);
  for (int i = 0; i < 5; ++i) s.Add({i, 0, 10, 5, {}}, 0, nullptr);
  s.SetBatchCap(3);
  const Batch& b = s.Schedule(0);
  EXPECT_EQ(b.entries.size(), 3u);
  EXPECT_EQ(b.bound, BatchBound::kSlo);
  EXPECT_STREQ(BatchBoundName(b.bound), "slo");
}

// ---------------------------------------------------------------- SLO cap --

TEST(SloCapTest, LargestBatchMeetingTheTargetMatchesBruteForce) {
  auto gpu = Gpu();
  IterationPlanner planner(Gpt3(), 8, gpu.get());
  const double tbt = 0.050;
  auto cap = MaxBatchWithinSlo(planner, tbt, 2048, 256);
  ASSERT_TRUE(cap.ok());
  int64_t brute = 0;
  for (int64_t b = 1; b <= 256; ++b) {
    if (planner.Plan(Decode(b, 2048))->time_s <= tbt) brute = b;
  }
  EXPECT_EQ(*cap, brute);
  EXPECT_GT(*cap, 0);
  EXPECT_LT(*cap, 256);
  // AttAcc §3.2: at batch 64 GPT-3 misses a 50 ms SLO on the DGX.
  EXPECT_LT(*cap, 64);
  EXPECT_EQ(*MaxBatchWithinSlo(planner, 1e-6, 2048, 256), 0);
}

TEST(SloCapTest, AHintFindsTheSameCapInFewerPlans) {
  auto gpu = Gpu();
  FakeAttentionDevice fake(40);
  IterationPlanner planner(Gpt3(), Config(gpu.get(), &fake, OverlapPolicy::kSerial));
  const double tbt = 0.050;
  fake.attention_calls.clear();
  const int64_t cap = *MaxBatchWithinSlo(planner, tbt, 2048, 256);
  // Without a hint: a bisection of 1..256, eight plans (one attention op
  // each, recording its batch).
  ASSERT_EQ(fake.attention_calls.size(), 8u);
  ASSERT_GT(cap, 2);
  ASSERT_LT(cap, 250);
  EXPECT_LE(planner.Plan(Decode(cap, 2048))->time_s, tbt);
  EXPECT_GT(planner.Plan(Decode(cap + 1, 2048))->time_s, tbt);
  // Every hint gives the same answer.
  for (int64_t hint = 0; hint <= 256; ++hint) {
    EXPECT_EQ(*MaxBatchWithinSlo(planner, tbt, 2048, 256, hint), cap) << "hint " << hint;
  }
  // The answer as the hint: two plans, it and one more.
  fake.attention_calls.clear();
  EXPECT_EQ(*MaxBatchWithinSlo(planner, tbt, 2048, 256, cap), cap);
  EXPECT_EQ(fake.attention_calls, (std::vector<int64_t>{cap, cap + 1}));
  // One above: it fails, the one below passes.
  fake.attention_calls.clear();
  EXPECT_EQ(*MaxBatchWithinSlo(planner, tbt, 2048, 256, cap + 1), cap);
  EXPECT_EQ(fake.attention_calls, (std::vector<int64_t>{cap + 1, cap}));
  // Three below: up by 1, 2 and 4, which overshoots, then a bisection of
  // what lies between.
  fake.attention_calls.clear();
  EXPECT_EQ(*MaxBatchWithinSlo(planner, tbt, 2048, 256, cap - 3), cap);
  EXPECT_EQ(fake.attention_calls,
            (std::vector<int64_t>{cap - 3, cap - 2, cap, cap + 4, cap + 2, cap + 1}));
  // Nothing meets the target: down from the hint to 1.
  fake.attention_calls.clear();
  EXPECT_EQ(*MaxBatchWithinSlo(planner, 1e-6, 2048, 256, 4), 0);
  EXPECT_EQ(fake.attention_calls, (std::vector<int64_t>{4, 3, 1}));
}

// --------------------------------------------------------------- planner --

TEST_F(HeteroPlannerTest, HeadLevelBetweenBusiestResourceAndSerial) {
  for (int64_t b : {8, 64, 200}) {
    const Batch batch = Decode(b, 2048);
    auto serial = Plan(OverlapPolicy::kSerial, batch);
    auto head = Plan(OverlapPolicy::kHeadLevel, batch);
    ASSERT_TRUE(serial.ok() && head.ok());
    EXPECT_LE(head->time_s, serial->time_s) << b;
    const double busiest = std::max({head->xpu_busy_s, head->device_busy_s, head->link_busy_s});
    EXPECT_GE(head->time_s * (1 + 1e-12), busiest) << b;
    // Serial is the sum of the three critical paths: its time is at least
    // the xPU and device busy times added.
    EXPECT_GE(serial->time_s + 1e-12, serial->xpu_busy_s + serial->device_busy_s) << b;
  }
}

// Plan(batch, spans, f): the spans of layers below f as a full recording
// has them, in its order, then per track one span "layers" from the
// earliest start to the latest end of the rest.
void ExpectFoldedIsTheFullRecordingFolded(const std::vector<Span>& full,
                                          const std::vector<Span>& folded, int32_t f,
                                          const std::string& name) {
  std::vector<Span> kept;
  std::map<Track, std::pair<double, double>> rest;
  for (const Span& sp : full) {
    if (sp.layer < f) {
      kept.push_back(sp);
      continue;
    }
    auto [it, fresh] = rest.try_emplace(sp.track, sp.start_s, sp.end_s);
    if (!fresh) {
      it->second.first = std::min(it->second.first, sp.start_s);
      it->second.second = std::max(it->second.second, sp.end_s);
    }
  }
  ASSERT_EQ(folded.size(), kept.size() + rest.size()) << name;
  ASSERT_FALSE(rest.empty()) << name;
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(folded[i].track, kept[i].track) << name << " " << i;
    EXPECT_EQ(folded[i].name, kept[i].name) << name << " " << i;
    EXPECT_EQ(folded[i].layer, kept[i].layer) << name << " " << i;
    EXPECT_EQ(folded[i].group, kept[i].group) << name << " " << i;
    EXPECT_EQ(folded[i].start_s, kept[i].start_s) << name << " " << i;
    EXPECT_EQ(folded[i].end_s, kept[i].end_s) << name << " " << i;
  }
  auto it = rest.begin();
  for (size_t i = kept.size(); i < folded.size(); ++i, ++it) {
    EXPECT_EQ(folded[i].track, it->first) << name;
    EXPECT_EQ(folded[i].name, "layers") << name;
    EXPECT_EQ(folded[i].layer, f) << name;
    EXPECT_EQ(folded[i].start_s, it->second.first) << name;
    EXPECT_EQ(folded[i].end_s, it->second.second) << name;
  }
}

TEST_F(HeteroPlannerTest, SpansReplayTheScheduleOfEveryPolicy) {
  // The recorded spans are the schedule the cost came from: the same cost,
  // no two spans of one track overlapping, the last span ending at the
  // iteration's time, each resource's spans adding up to its busy time, and
  // under head-level pipelining the device attending group j while the xPU
  // computes a later group's QKV tile.
  const Batch batch = Decode(64, 2048);
  struct Variant {
    OverlapPolicy policy;
    OverlapRule rule;
  };
  for (const Variant& v : {Variant{OverlapPolicy::kSerial, OverlapRule::kListSchedule},
                           Variant{OverlapPolicy::kHeadLevel, OverlapRule::kListSchedule},
                           Variant{OverlapPolicy::kHeadLevelFf, OverlapRule::kListSchedule},
                           Variant{OverlapPolicy::kBatchLevel, OverlapRule::kListSchedule},
                           Variant{OverlapPolicy::kSerial, OverlapRule::kAttAccSimulator},
                           Variant{OverlapPolicy::kHeadLevel, OverlapRule::kAttAccSimulator},
                           Variant{OverlapPolicy::kHeadLevelFf, OverlapRule::kAttAccSimulator}}) {
    const OverlapPolicy policy = v.policy;
    PlannerConfig config = Config(gpu_.get(), &fake_, policy);
    config.overlap_rule = v.rule;
    IterationPlanner planner(Gpt3(), config);
    auto plain = planner.Plan(batch);
    std::vector<Span> spans;
    auto traced = planner.Plan(batch, &spans);
    ASSERT_TRUE(plain.ok() && traced.ok());
    const std::string name = std::string(OverlapPolicyName(policy)) +
                             (v.rule == OverlapRule::kAttAccSimulator ? " (authors)" : "");
    EXPECT_EQ(plain->time_s, traced->time_s) << name;
    ASSERT_FALSE(spans.empty()) << name;
    for (int32_t f : {0, 1, 2, 5}) {
      std::vector<Span> folded;
      auto cost = planner.Plan(batch, &folded, f);
      ASSERT_TRUE(cost.ok()) << name;
      EXPECT_EQ(cost->time_s, traced->time_s) << name;
      ExpectFoldedIsTheFullRecordingFolded(spans, folded, f, absl::StrCat(name, " from ", f));
    }
    std::map<Track, std::vector<std::pair<double, double>>> by_track;
    double end = 0, xpu = 0, device = 0;
    for (const Span& sp : spans) {
      by_track[sp.track].push_back({sp.start_s, sp.end_s});
      end = std::max(end, sp.end_s);
      if (sp.track == Track::kXpu) xpu += sp.end_s - sp.start_s;
      if (sp.track == Track::kDevice) device += sp.end_s - sp.start_s;
    }
    for (auto& [track, v] : by_track) {
      std::sort(v.begin(), v.end());
      for (size_t i = 1; i < v.size(); ++i) {
        EXPECT_LE(v[i - 1].second, v[i].first + 1e-15) << name << " " << TrackName(track);
      }
    }
    EXPECT_NEAR(end, traced->time_s, 1e-12 * traced->time_s) << name;
    EXPECT_NEAR(xpu, traced->xpu_busy_s, 1e-9 * traced->xpu_busy_s) << name;
    EXPECT_NEAR(device, traced->device_busy_s, 1e-9 * traced->device_busy_s) << name;
    if (policy == OverlapPolicy::kHeadLevel && v.rule == OverlapRule::kListSchedule) {
      // Layer 0: group 0's attention overlaps the QKV tile of group 1+.
      double att0_start = -1, att0_end = -1, last_qkv_start = -1;
      for (const Span& sp : spans) {
        if (sp.layer != 0) continue;
        if (sp.track == Track::kDevice && sp.group == 0) {
          att0_start = sp.start_s;
          att0_end = sp.end_s;
        }
        if (sp.track == Track::kXpu && sp.name == "qkv") {
          last_qkv_start = std::max(last_qkv_start, sp.start_s);
        }
      }
      EXPECT_LT(att0_start, last_qkv_start);
      EXPECT_GT(att0_end, att0_start);
    }
  }
  // Without a device: the xPU's ops back to back.
  IterationPlanner gpu_only(Gpt3(), 8, gpu_.get());
  std::vector<Span> spans;
  auto cost = gpu_only.Plan(batch, &spans);
  ASSERT_TRUE(cost.ok());
  std::vector<Span> folded;
  ASSERT_TRUE(gpu_only.Plan(batch, &folded, 2).ok());
  ExpectFoldedIsTheFullRecordingFolded(spans, folded, 2, "xPU only");
  double sum = 0;
  for (const Span& sp : spans) {
    EXPECT_EQ(sp.track, Track::kXpu);
    sum += sp.end_s - sp.start_s;
  }
  EXPECT_NEAR(sum, cost->time_s, 1e-9 * cost->time_s);
  EXPECT_NEAR(spans.back().end_s, cost->time_s, 1e-9 * cost->time_s);
}

// cluster.overlap_rule ATTACC_SIMULATOR: the authors' `_pipeline` rule
// (scheduler/planner.h, OverlapRule), in each of its cases, by hand. GPT-3
// on 8 xPUs holds 12 query heads per xPU, so m = 1/12; the fake device's
// attention of all 96 heads takes b x (past + 1) x 96 ns / 40; the link
// moves b x (96 + 2 x 96) x 128 x 2 bytes out and b x 96 x 128 x 2 back,
// each at 8 x its bandwidth plus 3 us. The planner's other pieces (QKV,
// projection) come from the serial plan's stages; a layer's time minus
// what the rule changes is the same in every plan.
TEST_F(HeteroPlannerTest, AttAccSimulatorRuleByHand) {
  const double layers = 96, m = 1.0 / 12;
  struct Case {
    int64_t past;
    double link_bytes_per_s;
    int branch;  // 1: A > FC, 2: FC >= A and FC > X, 3: FC >= A and FC <= X
  };
  for (const Case& k :
       {Case{1000, 300e9, 2}, Case{4000, 300e9, 1}, Case{1000, 1e8, 3}, Case{4000, 1e8, 1}}) {
    SCOPED_TRACE(::testing::Message() << "past " << k.past << " link " << k.link_bytes_per_s);
    const int64_t b = 16;
    auto plan = [&](OverlapPolicy policy, OverlapRule rule) {
      PlannerConfig c = Config(gpu_.get(), &fake_, policy);
      c.link_bytes_per_s = k.link_bytes_per_s;
      c.overlap_rule = rule;
      IterationPlanner planner(Gpt3(), c);
      return *planner.Plan(Decode(b, k.past));
    };
    const IterationCost serial = plan(OverlapPolicy::kSerial, OverlapRule::kListSchedule);
    const double qkv = serial.stages[static_cast<int>(devices::Stage::kQkv)].time_s / layers;
    const double proj =
        serial.stages[static_cast<int>(devices::Stage::kProjection)].time_s / layers;
    const double a = b * double(k.past + 1) * 96 * 1e-9 / 40;
    const double link = k.link_bytes_per_s * 8;
    const double x = 3e-6 + b * 288.0 * 128 * 2 / link + 3e-6 + b * 96.0 * 128 * 2 / link;
    const double fc = qkv + proj;
    ASSERT_EQ(k.branch, a > fc ? 1 : fc > x ? 2 : 3);
    // Serially the transfers hide behind the attention but for m of them
    // (or the attention behind them).
    const IterationCost serial_rule = plan(OverlapPolicy::kSerial, OverlapRule::kAttAccSimulator);
    const double exposed = a > x ? m * x : x - (1 - m) * a;
    EXPECT_NEAR(serial.time_s - serial_rule.time_s, layers * (x - exposed), 1e-9 * serial.time_s);
    // Head level: QKV to the projection's end.
    double core = 0;
    if (k.branch == 1) core = m * fc + exposed + a;
    if (k.branch == 2) core = fc + m * a + m * x;
    if (k.branch == 3) core = m * fc + x + m * a;
    const IterationCost head = plan(OverlapPolicy::kHeadLevel, OverlapRule::kAttAccSimulator);
    EXPECT_NEAR(serial.time_s - head.time_s, layers * (fc + x + a - core), 1e-9 * serial.time_s);
    // The same work on every resource, and one attention op of every head.
    EXPECT_NEAR(head.xpu_busy_s, serial.xpu_busy_s, 1e-12);
    EXPECT_NEAR(head.device_busy_s, serial.device_busy_s, 1e-12);
  }
  fake_.attention_calls.clear();
  PlannerConfig c = Config(gpu_.get(), &fake_, OverlapPolicy::kHeadLevel);
  c.overlap_rule = OverlapRule::kAttAccSimulator;
  IterationPlanner planner(Gpt3(), c);
  ASSERT_TRUE(planner.Plan(Decode(16, 1000)).ok());
  EXPECT_EQ(fake_.attention_calls.size(), 1u);
}

TEST_F(HeteroPlannerTest, StagesCoverEveryResourcesWork) {
  auto cost = Plan(OverlapPolicy::kSerial, Decode(16, 1000));
  ASSERT_TRUE(cost.ok());
  double xpu = 0;
  for (int st = 0; st < devices::kNumStages; ++st) {
    if (st != static_cast<int>(devices::Stage::kAttention)) xpu += cost->stages[st].time_s;
  }
  // Serially, the xPU's stages add up to its busy time, and the device's
  // attention (16 x 1001 positions x 96 heads x 1 ns / 40 stacks, x 96
  // layers) is the attention stage.
  EXPECT_NEAR(xpu, cost->xpu_busy_s, 1e-12);
  EXPECT_NEAR(cost->stages[static_cast<int>(devices::Stage::kAttention)].time_s,
              96 * 16.0 * 1001 * 96 * 1e-9 / 40, 1e-12);
}

TEST_F(HeteroPlannerTest, SerialSendsAllHeadsAtOnceHeadLevelPerGroup) {
  fake_.attention_calls.clear();
  ASSERT_TRUE(Plan(OverlapPolicy::kSerial, Decode(16, 1000)).ok());
  EXPECT_EQ(fake_.attention_calls.size(), 1u);
  fake_.attention_calls.clear();
  ASSERT_TRUE(Plan(OverlapPolicy::kHeadLevel, Decode(16, 1000)).ok());
  EXPECT_EQ(fake_.attention_calls.size(), 8u);  // one op per head group
}

TEST_F(HeteroPlannerTest, FeedForwardSplitFollowsTheBandwidthRule) {
  IterationPlanner planner(Gpt3(), Config(gpu_.get(), &fake_, OverlapPolicy::kHeadLevelFf));
  // §6.2: xPU : device throughput = BW_xpu * BS : BW_dev * 1.
  const double bx = 8 * 3.35e12, bd = 9 * 8 * 3.35e12;
  for (int64_t bs : {1, 9, 64, 256}) {
    EXPECT_DOUBLE_EQ(planner.FfDeviceFraction(bs), bd / (bx * bs + bd)) << bs;
  }
  // Clamped to the partitions placed for batch 1 and for the max batch.
  EXPECT_DOUBLE_EQ(planner.FfDeviceFraction(1000), bd / (bx * 256 + bd));
  EXPECT_DOUBLE_EQ(planner.FfDeviceFraction(0), bd / (bx + bd));
  auto cost = planner.Plan(Decode(9, 2048));
  ASSERT_TRUE(cost.ok());
  EXPECT_DOUBLE_EQ(cost->ff_device_fraction, 0.5);  // 9 x BW_xpu = BW_dev at BS 9
  auto head = Plan(OverlapPolicy::kHeadLevel, Decode(9, 2048));
  EXPECT_LT(cost->time_s, head->time_s);  // co-processing helps at small batches
}

TEST_F(HeteroPlannerTest, BatchLevelRunsTwoHalves) {
  fake_.attention_calls.clear();
  auto cost = Plan(OverlapPolicy::kBatchLevel, Decode(13, 2048));
  ASSERT_TRUE(cost.ok());
  EXPECT_EQ(fake_.attention_calls, (std::vector<int64_t>{7, 6}));
  EXPECT_GE(cost->time_s * (1 + 1e-12), std::max(cost->xpu_busy_s, cost->device_busy_s));
  // With prefill in the batch it falls back to serial.
  Batch mixed = Decode(4, 100);
  mixed.entries.push_back(BatchEntry{0, 64, 0, true, true, {}});
  mixed.prefill_tokens = 64;
  ++mixed.emitting;
  fake_.attention_calls.clear();
  ASSERT_TRUE(Plan(OverlapPolicy::kBatchLevel, mixed).ok());
  EXPECT_EQ(fake_.attention_calls, (std::vector<int64_t>{4}));
}

// A device that forwards to another and counts the ops it was asked.
class CountingDevice : public devices::Device {
 public:
  explicit CountingDevice(const devices::Device* inner) : inner_(inner) {}
  devices::DeviceDescription Describe() const override { return inner_->Describe(); }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    ops_asked += static_cast<int64_t>(ops.size());
    return inner_->Estimate(ops, costs);
  }
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override {
    return inner_->Execute(call);
  }
  mutable int64_t ops_asked = 0;

 private:
  const devices::Device* inner_;
};

TEST_F(HeteroPlannerTest, ReusedXpuCostsEqualAFreshPlannersAndSkipTheDevice) {
  // One planner across iterations reuses the xPU costs of a same-shaped
  // batch (the planner's memo); every result must equal a fresh planner's,
  // field by field, whatever came before.
  Batch prefill_a;
  prefill_a.entries.push_back(BatchEntry{0, 300, 0, true, true, {}, 7});
  prefill_a.prefill_tokens = 300;
  prefill_a.emitting = 1;
  Batch prefill_b = prefill_a;  // same tokens, another request and context
  prefill_b.entries[0].past_tokens = 100;
  prefill_b.entries[0].request_id = 8;
  const std::vector<Batch> batches = {Decode(8, 2048), Decode(8, 2049), Decode(8, 3000),
                                      prefill_a,       prefill_b,       Decode(8, 3001),
                                      Decode(9, 3001), Decode(8, 3002)};
  for (OverlapPolicy policy :
       {OverlapPolicy::kSerial, OverlapPolicy::kHeadLevelFf, OverlapPolicy::kBatchLevel}) {
    CountingDevice counting(gpu_.get());
    IterationPlanner reused(Gpt3(), Config(&counting, &fake_, policy));
    for (size_t i = 0; i < batches.size(); ++i) {
      auto got = reused.Plan(batches[i]);
      auto want = Plan(policy, batches[i]);
      ASSERT_TRUE(got.ok() && want.ok()) << i;
      EXPECT_EQ(got->time_s, want->time_s) << i;
      EXPECT_EQ(got->xpu_busy_s, want->xpu_busy_s) << i;
      EXPECT_EQ(got->device_busy_s, want->device_busy_s) << i;
      EXPECT_EQ(got->total.energy_pj(), want->total.energy_pj()) << i;
      EXPECT_EQ(got->total.flops, want->total.flops) << i;
      for (size_t st = 0; st < got->stages.size(); ++st) {
        EXPECT_EQ(got->stages[st].time_s, want->stages[st].time_s) << i << " stage " << st;
      }
    }
    // Asked anew: the first decode, the two prefills (different contexts),
    // the decode after them, the batch of 9 and the batch of 8 after it;
    // 11 ops per layer (two halves' under batch-level pipelining, which
    // prefill iterations leave for serial) and 3 for the tail.
    const int64_t decode = policy == OverlapPolicy::kBatchLevel ? 2 * 11 + 3 : 11 + 3;
    EXPECT_EQ(counting.ops_asked, 4 * decode + 2 * (11 + 3)) << OverlapPolicyName(policy);
  }
}

TEST_F(HeteroPlannerTest, PrefillAttentionStaysOnTheXpus) {
  Batch prefill;
  prefill.entries.push_back(BatchEntry{0, 512, 0, true, true, {}});
  prefill.prefill_tokens = 512;
  prefill.emitting = 1;
  fake_.attention_calls.clear();
  auto cost = Plan(OverlapPolicy::kSerial, prefill);
  ASSERT_TRUE(cost.ok());
  EXPECT_TRUE(fake_.attention_calls.empty());
  EXPECT_EQ(cost->device_busy_s, 0);
  // The prefilled K/V goes to the device: 512 x 2 x 96 heads x 128 x 2 B per
  // layer; everything else on the links (the all-reduces) is as on the xPUs
  // alone.
  IterationPlanner gpu_only(Gpt3(), 8, gpu_.get());
  auto alone = gpu_only.Plan(prefill);
  ASSERT_TRUE(alone.ok());
  EXPECT_DOUBLE_EQ(cost->total.link_bytes - alone->total.link_bytes, 96.0 * 512 * 2 * 96 * 128 * 2);
}

}  // namespace
}  // namespace servesim::scheduler
