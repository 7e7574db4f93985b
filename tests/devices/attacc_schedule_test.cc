// AttAcc device: the head schedule (placement, attention-level pipelining,
// the softmax unit, GQA), against hand-computed cases and a reference list
// schedule computed another way, and the memo of recent schedules against a
// cold device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "devices/attacc/attacc_device.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "tests/devices/attacc_test_util.h"
#include "tests/test_util.h"

namespace servesim::devices::attacc_test {
namespace {

// ------------------------------------------------------------- schedule --

TEST(AttAccScheduleTest, ImbalanceAndExplicitPlacement) {
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 2047}};
  Op op = Attention(seqs, 96, 96, 128);
  const double score = 1024 * kCap + 19;
  const double s = 32 + score + 32, c = score + 64;
  // Spread (greedy least-loaded): 96 heads over 40 stacks, <= 3 per stack,
  // one per channel; the three softmax requests of a stack arrive together
  // and queue on its softmax unit (37 cycles each).
  const Cost spread = Estimate1(*d, op);
  EXPECT_NEAR(spread.cycles, (s + 3 * 37 + 256 + c) * kRefresh, 1e-9);
  // All on stack 0: 6 heads per channel; the GEMV units never wait (each
  // context is ready before its turn): 6 x (S + C).
  std::vector<int32_t> stack0(96, 0);
  op.kv_head_stack = stack0;
  const Cost one = Estimate1(*d, op);
  EXPECT_NEAR(one.cycles, 6 * (s + c) * kRefresh, 1e-9);
  EXPECT_GT(one.time_s, 5 * spread.time_s);
  // Same bytes and energy: only the time depends on where heads sit.
  EXPECT_DOUBLE_EQ(one.dram_bytes, spread.dram_bytes);
  EXPECT_DOUBLE_EQ(one.dram_energy_pj, spread.dram_energy_pj);
  // Another stack, same load: same time; half on stack 3, half on 9: 3 per
  // channel.
  std::vector<int32_t> stack7(96, 7), halves(96, 3);
  for (int i = 48; i < 96; ++i) halves[i] = 9;
  op.kv_head_stack = stack7;
  EXPECT_DOUBLE_EQ(Estimate1(*d, op).cycles, one.cycles);
  op.kv_head_stack = halves;
  EXPECT_NEAR(Estimate1(*d, op).cycles, 3 * (s + c) * kRefresh, 1e-9);
}

TEST(AttAccScheduleTest, AttentionLevelPipelining) {
  // One stack, one channel: heads run one after another on its GEMV units.
  auto spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_stacks(1);
  spec.mutable_attacc()->mutable_attacc()->set_channels(1);
  const auto d = Make(spec);
  const AttAccHeadCycles h = d->HeadCycles(2048, 128);
  const double s = h.wr_gb + h.score + h.mv_sb, c = h.context + h.out;
  std::vector<AttentionSeq> seqs = {{1, 2047}};
  // One head: nothing to overlap.
  EXPECT_NEAR(Estimate1(*d, Attention(seqs, 1, 1, 128)).cycles, (h.gemv() + h.softmax) * kRefresh,
              1e-9);
  // Two heads: S0 S1 C0 C1; the softmax and MV_GB of head 0 hide under S1.
  for (int heads : {2, 3, 5}) {
    const Cost cost = Estimate1(*d, Attention(seqs, heads, heads, 128));
    const double serial = heads * (h.gemv() + h.softmax);
    const double busy = heads * (s + c);
    EXPECT_LT(cost.cycles, serial * kRefresh) << heads;
    EXPECT_GE(cost.cycles, busy * kRefresh - 1e-9) << heads;
    EXPECT_NEAR(cost.cycles, busy * kRefresh, 1e-9) << heads;  // long heads: no gaps
    EXPECT_NEAR(cost.score_s, heads * s * kRefresh * kTck, 1e-15);
    EXPECT_NEAR(cost.softmax_s, heads * h.softmax * kRefresh * kTck, 1e-15);
    EXPECT_NEAR(cost.context_s, heads * (h.mv_gb + c) * kRefresh * kTck, 1e-15);
  }
  // Pipelining off: S0 C0 S1 C1 ..., every softmax and MV_GB exposed.
  spec.mutable_attacc()->mutable_attacc()->set_attention_level_pipelining(false);
  const auto serial = Make(spec);
  EXPECT_NEAR(Estimate1(*serial, Attention(seqs, 3, 3, 128)).cycles,
              3 * (h.gemv() + h.softmax) * kRefresh, 1e-9);
}

TEST(AttAccScheduleTest, SharedSoftmaxUnitCanBind) {
  // One stack of 16 channels, 32 heads of L = 16: per head S = C = 32 + (2
  // columns x 4 x 32/18 + 19) + 32 (or + 64 for C: MV_SB + RD_SB), softmax
  // 16 cycles (3 + 13), MV_GB 32. The stack's one softmax unit serves 32
  // requests (512 cycles) while each channel's GEMV units need only 2 (S +
  // C) = 389: the last head's context waits for every softmax: S + 32 x 16
  // + MV_GB + C.
  auto spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_stacks(1);
  const auto d = Make(spec);
  const AttAccHeadCycles h = d->HeadCycles(16, 128);
  const double score = 2 * 4 * kCap + 19;
  EXPECT_DOUBLE_EQ(h.score, score);
  EXPECT_DOUBLE_EQ(h.softmax, 16);
  EXPECT_DOUBLE_EQ(h.mv_gb, 32);
  const double s = 32 + score + 32, c = score + 64;
  std::vector<AttentionSeq> seqs = {{1, 15}};
  const Cost cost = Estimate1(*d, Attention(seqs, 32, 32, 128));
  EXPECT_NEAR(cost.cycles, (s + 32 * 16 + 32 + c) * kRefresh, 1e-9);
  EXPECT_GT(cost.cycles, 2 * (s + c) * kRefresh);
}

TEST(AttAccScheduleTest, OneHeadPerChannelByHand) {
  // Three sequences of L = 4096, 16 and 2048, one head each, all on stack
  // 0: one head per channel (the schedule's closed-form path). Scores end
  // at S(L); the stack's softmax unit serves them in order of arrival
  // (L = 16, then 2048, then 4096), each context follows its softmax and
  // MV_GB; the op ends with the last context.
  auto spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_stacks(1);
  const auto d = Make(spec);
  std::vector<AttentionSeq> seqs = {{1, 4095}, {1, 15}, {1, 2047}};
  double softmax_free = 0, end = 0;
  for (int64_t l : {16, 2048, 4096}) {
    const AttAccHeadCycles h = d->HeadCycles(l, 128);
    const double s = h.wr_gb + h.score + h.mv_sb;
    softmax_free = std::max(softmax_free, s) + h.softmax;
    end = std::max(end, softmax_free + h.mv_gb + h.context + h.out);
  }
  EXPECT_NEAR(Estimate1(*d, Attention(seqs, 1, 1, 128)).cycles, end * kRefresh, 1e-9);
  // Two equal heads arrive together: the second waits one softmax.
  std::vector<AttentionSeq> twins = {{1, 2047}, {1, 2047}};
  const AttAccHeadCycles h = d->HeadCycles(2048, 128);
  const double s = h.wr_gb + h.score + h.mv_sb;
  EXPECT_NEAR(Estimate1(*d, Attention(twins, 1, 1, 128)).cycles,
              (s + 2 * h.softmax + h.mv_gb + h.context + h.out) * kRefresh, 1e-9);
}

TEST(AttAccScheduleTest, MtNlgDheadWastesLanes) {
  const auto d = Make();
  // d_head 160 = 40 per bank = 2.5 columns of 16 lanes: 3 columns.
  const AttAccHeadCycles h = d->HeadCycles(2048, 160);
  EXPECT_EQ(h.mac_ab_commands, 2 * 128 * 3);
  EXPECT_DOUBLE_EQ(d->HeadCellBytes(2048, 160), 768.0 * 32 * 64);
  EXPECT_DOUBLE_EQ(d->HeadCellBytes(2048, 160) / (2.0 * 2048 * 160 * 2), 1.2);
  EXPECT_DOUBLE_EQ(static_cast<double>(d->HeadMacs(2048, 160)) / (2.0 * 2048 * 160), 1.2);
  // d_head 128 uses every lane.
  EXPECT_EQ(d->HeadMacs(2048, 128), 2 * 2048 * 128);
}

TEST(AttAccScheduleTest, EstimateIsDeterministic) {
  const auto d = Make();
  Rng rng(7, "attacc");
  std::vector<AttentionSeq> seqs;
  for (int i = 0; i < 64; ++i) {
    seqs.push_back({1, static_cast<int64_t>(rng.UniformInt(4000))});
  }
  const Op op = Attention(seqs, 96, 96, 128);
  const Cost a = Estimate1(*d, op), b = Estimate1(*d, op);
  for (auto [x, y] : {std::pair{a.time_s, b.time_s},
                      {a.flops, b.flops},
                      {a.dram_bytes, b.dram_bytes},
                      {a.compute_energy_pj, b.compute_energy_pj},
                      {a.dram_energy_pj, b.dram_energy_pj},
                      {a.bg_bus_bytes, b.bg_bus_bytes},
                      {a.tsv_bytes, b.tsv_bytes},
                      {a.external_bytes, b.external_bytes},
                      {a.cycles, b.cycles},
                      {a.score_s, b.score_s},
                      {a.softmax_s, b.softmax_s},
                      {a.context_s, b.context_s}}) {
    EXPECT_EQ(x, y);
  }
  EXPECT_GT(a.time_s, 0);
}

TEST(AttAccScheduleTest, EstimateTimeFor64Seqs96Heads) {
  const auto d = Make();
  Rng rng(8, "attacc");
  std::vector<AttentionSeq> seqs;
  for (int i = 0; i < 64; ++i) {
    seqs.push_back({1, 1 + static_cast<int64_t>(rng.UniformInt(4096))});
  }
  Op op = Attention(seqs, 96, 96, 128);
  std::vector<int32_t> placement(64 * 96);
  for (size_t i = 0; i < placement.size(); ++i) placement[i] = static_cast<int32_t>(i % 40);
  for (bool placed : {false, true}) {
    op.kv_head_stack = placed ? absl::Span<const int32_t>(placement) : absl::Span<const int32_t>();
    Cost c;
    constexpr int kReps = 200;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) ASSERT_TRUE(d->Estimate({&op, 1}, {&c, 1}).ok());
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        kReps;
    std::printf("attacc Estimate, 64 seqs x 96 heads on 40 stacks (%s): %.1f us\n",
                placed ? "given placement" : "own placement", us);
    // Generous for debug builds; the sanitized build (ASan, UBSan and
    // libFuzzer's coverage hooks) runs it about 10x slower still.
    EXPECT_LT(us, test_util::kSanitizedBuild ? 50000 : 5000);
  }
  // The planner's head-level pipelining: 8 head groups of 12 heads in one
  // call.
  std::vector<Op> groups(8, op);
  for (int j = 0; j < 8; ++j) groups[j].head_begin = 12 * j, groups[j].head_end = 12 * (j + 1);
  std::vector<Cost> costs(8);
  constexpr int kReps = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) ASSERT_TRUE(d->Estimate(groups, absl::MakeSpan(costs)).ok());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      kReps;
  std::printf("attacc Estimate, the same as 8 head groups in one call: %.1f us\n", us);
  EXPECT_LT(us, 5000);
}

// The list schedule the device's header documents, computed another way,
// for ops with an explicit placement: items per stack in longest-first
// order; channels by a linear argmin over every channel (ties lowest); and
// each stack's softmax unit as a fixed point: assume no waits, run every
// channel's list (S0 .. S(f-1), then C0 S(f) C1 S(f+1) ..., f = 2 with
// attention-level pipelining, 1 without), sort all softmax requests by
// (arrival, channel), serve them first come first served, rerun the lists
// with the ready times found, until nothing changes. Ready times only grow
// from one round to the next and the schedule is causal, so this settles on
// the schedule itself. Returns the slowest stack's cycles.
double ReferenceSlowest(const AttAccDevice& d, const Op& op) {
  const auto& a = d.spec();
  const int f = a.attention_level_pipelining() ? 2 : 1;
  const int64_t n = static_cast<int64_t>(op.seqs.size());
  const int64_t group = op.heads / op.kv_heads;
  const int64_t hb = op.head_begin, he = op.head_end < 0 ? op.heads : op.head_end;
  struct Head {
    double s, c, sfm, mv_gb;
  };
  std::vector<Head> per_seq(n);
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) {
    const AttAccHeadCycles h = d.HeadCycles(op.seqs[i].past_tokens + 1, op.d_head);
    per_seq[i] = {h.wr_gb + h.score + h.mv_sb, h.context + h.out, h.softmax, h.mv_gb};
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return op.seqs[x].past_tokens > op.seqs[y].past_tokens;
  });
  double slowest = 0;
  for (int32_t st = 0; st < a.stacks(); ++st) {
    std::vector<double> load(a.channels(), 0.0);
    std::vector<std::vector<int64_t>> lists(a.channels());  // sequence per head
    for (int64_t i : order) {
      for (int64_t kv = hb / group; kv * group < he; ++kv) {
        if (op.kv_head_stack[i * op.kv_heads + kv] != st) continue;
        const int64_t heads = std::min(he, (kv + 1) * group) - std::max(hb, kv * group);
        int best = 0;
        for (int c = 1; c < a.channels(); ++c) {
          if (load[c] < load[best]) best = c;
        }
        load[best] += heads * (per_seq[i].s + per_seq[i].c);
        for (int64_t k = 0; k < heads; ++k) lists[best].push_back(i);
      }
    }
    std::vector<std::vector<double>> ready(a.channels()), arrival(a.channels());
    for (int c = 0; c < a.channels(); ++c) {
      ready[c].assign(lists[c].size(), -std::numeric_limits<double>::infinity());
      arrival[c].assign(lists[c].size(), 0.0);
    }
    std::vector<double> end(a.channels(), 0.0);
    for (int round = 0;; ++round) {
      EXPECT_LT(round, 100000) << "the fixed point does not settle";
      if (round >= 100000) return -1;
      struct Request {
        double arrival;
        int c;
        size_t k;
      };
      std::vector<Request> requests;
      for (int c = 0; c < a.channels(); ++c) {
        const std::vector<int64_t>& l = lists[c];
        double g = 0;
        for (size_t k = 0; k < std::min<size_t>(f, l.size()); ++k) {
          g += per_seq[l[k]].s;
          arrival[c][k] = g;
        }
        for (size_t k = 0; k < l.size(); ++k) {
          g = std::max(g, ready[c][k]) + per_seq[l[k]].c;
          if (k + f < l.size()) {
            g += per_seq[l[k + f]].s;
            arrival[c][k + f] = g;
          }
        }
        end[c] = g;
        for (size_t k = 0; k < l.size(); ++k) requests.push_back({arrival[c][k], c, k});
      }
      std::sort(requests.begin(), requests.end(), [](const Request& x, const Request& y) {
        return x.arrival < y.arrival || (x.arrival == y.arrival && x.c < y.c);
      });
      bool changed = false;
      double softmax_free = 0;
      for (const Request& r : requests) {
        const Head& h = per_seq[lists[r.c][r.k]];
        softmax_free = std::max(r.arrival, softmax_free) + h.sfm;
        const double now_ready = softmax_free + h.mv_gb;
        changed |= now_ready != ready[r.c][r.k];
        ready[r.c][r.k] = now_ready;
      }
      if (!changed) break;
    }
    for (double e : end) slowest = std::max(slowest, e);
  }
  return slowest;
}

TEST(AttAccScheduleTest, EqualsTheReferenceScheduleOnRandomBatches) {
  // Random decode batches, explicitly placed, through every path of the
  // device's schedule (at most one item per channel; at most as many heads
  // per channel as may be in flight; the general one), with lengths that
  // repeat (ties in both the channel loads and the softmax arrivals),
  // multi-head and grouped-query heads, head groups, one to 40 stacks in
  // use, with and without attention-level pipelining. Also with softmax
  // units 16 and 256 times narrower than the preset's, whose waits then
  // weigh as much as the GEMVs or more: the device schedules only the
  // stacks whose bound on waiting could make them the slowest, and a bound
  // too small would show here as a stack left out.
  Rng rng(7, "attacc-schedule");
  struct Shape {
    int64_t heads, kv_heads, d_head, groups;
  };
  const Shape shapes[] = {{96, 96, 128, 8}, {64, 8, 128, 4}, {40, 40, 64, 1}, {32, 4, 128, 2}};
  int cases = 0;
  const int32_t lanes = Spec().attacc().attacc().softmax_lanes();
  ASSERT_EQ(lanes % 256, 0);
  for (const int32_t softmax_lanes : {lanes, lanes / 16, lanes / 256}) {
    for (bool pipelined : {true, false}) {
      auto spec = Spec();
      spec.mutable_attacc()->mutable_attacc()->set_attention_level_pipelining(pipelined);
      spec.mutable_attacc()->mutable_attacc()->set_softmax_lanes(softmax_lanes);
      const auto d = Make(spec);
      for (int trial = 0; trial < 80; ++trial) {
        const Shape& sh = shapes[rng.UniformInt(4)];
        const int used_stacks = std::vector<int>{1, 2, 5, 40}[rng.UniformInt(4)];
        // Items (sequence, KV head) per stack and op: 1 to 160, so that each
        // path is taken (16 channels).
        const int64_t items =
            1 + static_cast<int64_t>(rng.UniformInt(rng.Uniform() < 0.5 ? 40 : 160));
        const int64_t kv_per_op = std::max<int64_t>(1, sh.kv_heads / sh.groups);
        const int64_t nseq = std::max<int64_t>(1, items * used_stacks / kv_per_op);
        std::vector<AttentionSeq> seqs(nseq);
        for (int64_t i = 0; i < nseq; ++i) {
          const bool repeat = i > 0 && rng.Uniform() < 0.3;
          const int64_t past = repeat ? seqs[rng.UniformInt(i)].past_tokens
                                      : static_cast<int64_t>(rng.UniformInt(6000));
          seqs[i] = {1, past, i};
        }
        std::vector<int32_t> stacks(nseq * sh.kv_heads);
        for (int32_t& st : stacks) st = static_cast<int32_t>(rng.UniformInt(used_stacks));
        for (int64_t g = 0; g < sh.groups; ++g) {
          Op op = Attention(seqs, sh.heads, sh.kv_heads, sh.d_head);
          op.kv_head_stack = stacks;
          op.head_begin = sh.heads * g / sh.groups;
          op.head_end = sh.heads * (g + 1) / sh.groups;
          const Cost cost = Estimate1(*d, op);
          EXPECT_DOUBLE_EQ(cost.cycles, ReferenceSlowest(*d, op) * kRefresh)
              << "softmax lanes " << softmax_lanes << ", pipelined " << pipelined << " trial "
              << trial << " group " << g << " of " << sh.groups << ", " << nseq << " sequences on "
              << used_stacks << " stacks";
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 1500);
}

TEST(AttAccMemoTest, WarmDeviceEqualsColdDeviceStepByStep) {
  // Decode steps of 7 sequences as a serving run makes them (L + 1 per
  // step, crossing 16-token buckets at different steps), in 8 head-group
  // ops: a device that has memoised earlier steps must return exactly what
  // a fresh device computes. The warm device gets the list's
  // Op::kv_head_stack_id, which lets it skip comparing the stacks; the cold
  // one gets 0.
  auto warm = CreateDevice(Spec());
  ASSERT_TRUE(warm.ok()) << warm.status();
  std::vector<int32_t> stacks(7 * 96);
  for (size_t i = 0; i < stacks.size(); ++i) stacks[i] = static_cast<int32_t>((i * 7) % 40);
  const uint64_t list_id = NewStackListId();
  for (int step = 0; step < 40; ++step) {
    std::vector<AttentionSeq> seqs;
    for (int s = 0; s < 7; ++s) seqs.push_back({1, 300 + 37 * s + step});
    std::vector<Op> ops(8);
    for (int g = 0; g < 8; ++g) {
      ops[g].kind = OpKind::kAttention;
      ops[g].heads = ops[g].kv_heads = 96;
      ops[g].d_head = 128;
      ops[g].seqs = seqs;
      ops[g].kv_head_stack = stacks;
      ops[g].head_begin = 12 * g;
      ops[g].head_end = 12 * (g + 1);
    }
    std::vector<Cost> a(8), b(8);
    for (Op& op : ops) op.kv_head_stack_id = list_id;
    ASSERT_TRUE((*warm)->Estimate(ops, absl::MakeSpan(a)).ok());
    for (Op& op : ops) op.kv_head_stack_id = 0;
    auto cold = CreateDevice(Spec());
    ASSERT_TRUE((*cold)->Estimate(ops, absl::MakeSpan(b)).ok());
    for (int g = 0; g < 8; ++g) {
      EXPECT_EQ(a[g].time_s, b[g].time_s) << step << " " << g;
      EXPECT_EQ(a[g].cycles, b[g].cycles) << step << " " << g;
      EXPECT_EQ(a[g].dram_energy_pj, b[g].dram_energy_pj) << step << " " << g;
      EXPECT_EQ(a[g].compute_energy_pj, b[g].compute_energy_pj) << step << " " << g;
    }
  }
}

TEST(AttAccMemoTest, BuffersRefilledInPlaceEqualAColdDevice) {
  // What the planner does: the same sequence and stack buffers, refilled
  // every step. The warm device sees the same addresses with new contents
  // (lengths, a re-placed sequence's stacks, another d_head, lengths past
  // the device's per-L table) step after step, and must answer what a
  // fresh device computes, field by field.
  constexpr int kSeqs = 5, kKv = 24, kSteps = 60;
  std::vector<AttentionSeq> seqs(kSeqs);
  std::vector<int32_t> stacks(kSeqs * kKv);
  std::vector<Op> ops(4);
  auto fill = [&](int step) {
    const int64_t d_head = step < 40 ? 128 : 64;
    const int64_t base = step < 50 ? 200 : 70000;  // past the per-L table
    for (int s = 0; s < kSeqs; ++s) seqs[s] = {1, base + 29 * s + step, s};
    // Sequence 2 is re-placed every 7 steps.
    for (int i = 0; i < kSeqs * kKv; ++i) {
      const int shift = i / kKv == 2 ? step / 7 : 0;
      stacks[i] = static_cast<int32_t>((i * 11 + shift) % 40);
    }
    for (int g = 0; g < 4; ++g) {
      ops[g] = Op{};
      ops[g].kind = OpKind::kAttention;
      ops[g].heads = ops[g].kv_heads = kKv;
      ops[g].d_head = d_head;
      ops[g].seqs = seqs;
      ops[g].kv_head_stack = stacks;
      ops[g].head_begin = 6 * g;
      ops[g].head_end = 6 * (g + 1);
    }
  };
  // Every step on the warm device first, back to back.
  const auto warm = Make();  // the device itself, as the planner holds it
  std::vector<std::vector<Cost>> got(kSteps, std::vector<Cost>(4));
  for (int step = 0; step < kSteps; ++step) {
    fill(step);
    ASSERT_TRUE(warm->Estimate(ops, absl::MakeSpan(got[step])).ok()) << step;
  }
  // Each fresh device reads its own copies, kept alive so that no two
  // steps share an address: nothing a device might remember can match.
  std::vector<std::vector<AttentionSeq>> seq_copies(kSteps);
  std::vector<std::vector<int32_t>> stack_copies(kSteps);
  for (int step = 0; step < kSteps; ++step) {
    fill(step);
    seq_copies[step] = seqs;
    stack_copies[step] = stacks;
    for (Op& op : ops) {
      op.seqs = seq_copies[step];
      op.kv_head_stack = stack_copies[step];
    }
    std::vector<Cost> b(4);
    const auto cold = Make();
    ASSERT_TRUE(cold->Estimate(ops, absl::MakeSpan(b)).ok()) << step;
    const std::vector<Cost>& a = got[step];
    for (int g = 0; g < 4; ++g) {
      EXPECT_EQ(a[g].time_s, b[g].time_s) << step << " " << g;
      EXPECT_EQ(a[g].cycles, b[g].cycles) << step << " " << g;
      EXPECT_EQ(a[g].flops, b[g].flops) << step << " " << g;
      EXPECT_EQ(a[g].dram_bytes, b[g].dram_bytes) << step << " " << g;
      EXPECT_EQ(a[g].bg_bus_bytes, b[g].bg_bus_bytes) << step << " " << g;
      EXPECT_EQ(a[g].tsv_bytes, b[g].tsv_bytes) << step << " " << g;
      EXPECT_EQ(a[g].score_s, b[g].score_s) << step << " " << g;
      EXPECT_EQ(a[g].softmax_s, b[g].softmax_s) << step << " " << g;
      EXPECT_EQ(a[g].context_s, b[g].context_s) << step << " " << g;
      EXPECT_EQ(a[g].dram_energy_pj, b[g].dram_energy_pj) << step << " " << g;
      EXPECT_EQ(a[g].compute_energy_pj, b[g].compute_energy_pj) << step << " " << g;
    }
  }
}

TEST(AttAccMemoTest, StackAfterABusyStackIsScheduledAlone) {
  // Sequence 0 (L = 100) puts all 22 KV heads on stack 0: every channel
  // busy. Sequence 1 (L = 8000) puts heads 20 and 21 on stack 1 and one
  // head on each of stacks 2..21. Stacks are scheduled in index order in
  // one call; stack 1 (two long heads) follows the busy stack 0 and must
  // see nothing of it, so the op takes exactly what those two long heads
  // take on a stack of their own.
  auto cost = [](const std::vector<AttentionSeq>& seqs, const std::vector<int32_t>& stacks,
                 int64_t hb, int64_t he) {
    auto device = CreateDevice(Spec());  // cold: no memo
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = op.kv_heads = 22;
    op.d_head = 128;
    op.seqs = seqs;
    op.kv_head_stack = stacks;
    op.head_begin = hb;
    op.head_end = he;
    Cost c;
    EXPECT_TRUE((*device)->Estimate({&op, 1}, {&c, 1}).ok());
    return c.time_s;
  };
  std::vector<int32_t> stacks(2 * 22, 0);
  for (int h = 0; h < 20; ++h) stacks[22 + h] = 2 + h;
  stacks[22 + 20] = stacks[22 + 21] = 1;
  const double both = cost({{1, 99}, {1, 7999}}, stacks, 0, 22);
  // Heads 20 and 21 of sequence 1 alone, on one stack.
  std::vector<int32_t> alone(22, 0);
  const double two_long = cost({{1, 7999}}, alone, 20, 22);
  // (Two heads on two channels still share the stack's softmax unit, so
  // the pair takes a little longer than one head.)
  EXPECT_GT(two_long, cost({{1, 7999}}, alone, 0, 1));
  EXPECT_EQ(both, two_long);
}

}  // namespace
}  // namespace servesim::devices::attacc_test
