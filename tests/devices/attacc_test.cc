// AttAcc device: the cycle model against hand-computed command counts, the
// power cap and bandwidth ratios, bytes and energy per level, the head
// schedule, the functional kernel against exact attention, bad inputs.
//
// Figures used below (attacc_bank preset, fp16, see devices/attacc/
// presets.cc): tCK 769 ps, t_rcd = t_rp = 19, t_ccdl 4, t_ccds 2, t_refi
// 5070, t_rfc 455, t_pim_move 4; per pCH 32 bank units of which 18 stream
// (factor 32/18 = 16/9); 2 pCHs per channel; 16 lanes (32 B columns of
// fp16); L split 16 ways (pCH x rank x BG), d_head 4 ways (banks).
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
#include "tests/test_util.h"

namespace servesim::devices {
namespace {

constexpr double kTck = 769e-12;
constexpr double kRefresh = 5070.0 / (5070.0 - 455.0);  // t_refi / (t_refi - t_rfc)
constexpr double kCap = 32.0 / 18.0;                    // 32 units, 18 stream

servesim::v1::DeviceSpec Spec(const char* preset = "attacc_bank") {
  servesim::v1::DeviceSpec spec;
  auto p = AttAccPreset(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  *spec.mutable_attacc()->mutable_attacc() = *p;
  spec.mutable_attacc()->set_dtype(servesim::v1::DTYPE_FP16);
  return spec;
}

std::unique_ptr<AttAccDevice> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = AttAccDevice::Create(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  return std::unique_ptr<AttAccDevice>(static_cast<AttAccDevice*>(d->release()));
}

std::unique_ptr<AttAccDevice> Make(const char* preset = "attacc_bank",
                                   bool power_constraint = true) {
  auto spec = Spec(preset);
  spec.mutable_attacc()->mutable_attacc()->set_power_constraint(power_constraint);
  return Make(spec);
}

Op Attention(const std::vector<AttentionSeq>& seqs, int64_t heads, int64_t kv_heads,
             int64_t d_head) {
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = Stage::kAttention;
  op.heads = heads, op.kv_heads = kv_heads, op.d_head = d_head;
  op.seqs = seqs;
  return op;
}

Cost Estimate1(const Device& d, const Op& op) {
  Cost c;
  const absl::Status s = d.Estimate({&op, 1}, {&c, 1});
  EXPECT_TRUE(s.ok()) << s;
  return c;
}

absl::Status EstimateStatus(const Device& d, const Op& op) {
  Cost c;
  return d.Estimate({&op, 1}, {&c, 1});
}

// --------------------------------------------------------------- presets --

TEST(AttAccPresetTest, PresetsAreCompleteAndCreate) {
  EXPECT_EQ(AttAccPresetNames(),
            (std::vector<std::string>{"attacc_bank", "attacc_bg", "attacc_buffer"}));
  for (const auto& name : AttAccPresetNames()) {
    auto spec = Spec(name.c_str());
    EXPECT_EQ(spec.attacc().attacc().preset(), name);
    EXPECT_EQ(spec.attacc().attacc().link().bandwidth_bytes_per_s(), 300e9);
    auto device = CreateDevice(spec);
    ASSERT_TRUE(device.ok()) << name << ": " << device.status();
    const DeviceDescription d = (*device)->Describe();
    EXPECT_EQ(d.kind, "attacc");
    EXPECT_EQ(d.preset, name);
    // 40 stacks x 16 GiB (HBM3_8Gb_2R, 16 channels).
    EXPECT_EQ(d.memory_bytes, 40.0 * 16 * (1ull << 30));
    EXPECT_EQ(d.accepts, (std::vector<OpKind>{OpKind::kAttention, OpKind::kGemm}));
  }
  auto bad = AttAccPreset("attacc_pim");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("attacc_bank, attacc_bg, attacc_buffer"),
            std::string::npos);
}

// --------------------------------------------------------------- cycles --

TEST(AttAccCyclesTest, HeadCyclesForL2048Dhead128ByHand) {
  const auto d = Make();
  const AttAccHeadCycles h = d->HeadCycles(2048, 128);
  // MAC_AB per GEMV = ceil(2048 / 16) x ceil(128 / (4 x 16)) = 128 x 2 = 256.
  EXPECT_EQ(h.mac_ab_commands, 512);
  // 256 columns x 32 B = 8 KiB per bank and GEMV = 8 rows; x 2 GEMVs.
  EXPECT_EQ(h.rows_opened, 16);
  EXPECT_DOUBLE_EQ(h.wr_gb, 4 * 2 * 4.0);  // 4 banks x 2 columns of q, 4 tCK
  // 256 MACs x t_ccdl 4 x 32/18 (18 of 32 units stream) + the first t_rcd
  // (later row switches hide in the 14 idle banks).
  EXPECT_DOUBLE_EQ(h.score, 256 * 4 * kCap + 19);
  EXPECT_DOUBLE_EQ(h.context, h.score);
  EXPECT_DOUBLE_EQ(h.mv_sb, 8 * 4.0);      // last group: 2 ranks x 4 BGs
  EXPECT_DOUBLE_EQ(h.mv_gb, 64 * 4.0);     // 8 BGs x ceil(2048 / 256) columns
  EXPECT_DOUBLE_EQ(h.out, (8 + 8) * 4.0);  // MV_SB 4 banks x 2 ranks + RD_SB 256 B / 32
  EXPECT_DOUBLE_EQ(h.softmax, 37);         // 3 x 8 beats + 13 fill
  EXPECT_DOUBLE_EQ(h.gemv(), 32 + 2 * (1024 * kCap + 19) + 32 + 256 + 64);

  // No power constraint: all 32 units stream, every row switch is exposed:
  // 1024 + 19 + 7 x (19 + 19) = 1309.
  const AttAccHeadCycles u = Make("attacc_bank", false)->HeadCycles(2048, 128);
  EXPECT_DOUBLE_EQ(u.score, 1309);
  EXPECT_EQ(u.mac_ab_commands, 512);
}

TEST(AttAccCyclesTest, RowBoundary) {
  // d_head 64: one column per position per bank; L = 512 gives 32 columns =
  // 1024 B = exactly one row per bank; L = 513 one more column: two rows.
  for (bool cap : {false, true}) {
    const auto d = Make("attacc_bank", cap);
    const AttAccHeadCycles a = d->HeadCycles(512, 64), b = d->HeadCycles(513, 64);
    EXPECT_EQ(a.mac_ab_commands, 2 * 32);
    EXPECT_EQ(b.mac_ab_commands, 2 * 33);
    EXPECT_EQ(a.rows_opened, 2 * 1);  // one row per GEMV (score, context)
    EXPECT_EQ(b.rows_opened, 2 * 2);  // +1 per GEMV
    if (!cap) {
      EXPECT_DOUBLE_EQ(a.score, 32 * 4 + 19);  // 147
      // The extra column (t_ccdl) plus an exposed PRE + ACT (t_rp + t_rcd).
      EXPECT_DOUBLE_EQ(b.score - a.score, 4 + (19 + 19));
    } else {
      // Only the extra column, spread over the 18-unit rotation.
      EXPECT_DOUBLE_EQ(a.score, 32 * 4 * kCap + 19);
      EXPECT_NEAR(b.score - a.score, 4 * kCap, 1e-9);
    }
  }
}

TEST(AttAccCyclesTest, SoftmaxCycles) {
  const auto d = Make();
  // 3 passes x ceil(L / 256) beats + 13 fill at 1.3 GHz, JEDEC-rounded to
  // tCK: L = 256: 16 cycles = 12.31 ns = 16.005 tCK -> 16 (authors' trace).
  EXPECT_DOUBLE_EQ(d->HeadCycles(256, 128).softmax, 16);
  // L = 2048: 3 x 8 + 13 = 37 cycles = 28.46 ns = 37.011 tCK -> 37.
  EXPECT_DOUBLE_EQ(d->HeadCycles(2048, 128).softmax, 37);
  EXPECT_DOUBLE_EQ(d->HeadCycles(1, 128).softmax, 16);
  EXPECT_DOUBLE_EQ(d->HeadCycles(257, 128).softmax, 19);  // 3 x 2 + 13
}

// ----------------------------------------------------- bandwidth & power --

TEST(AttAccBandwidthTest, PowerCapAndRatios) {
  const double pchs = 40 * 16 * 2;  // stacks x channels x pCH
  // External: one 32 B column per t_ccds per pCH = 20.8 GB/s; 26.6 TB/s.
  const double external = pchs * 32 / (2 * kTck);
  // The bank placement's MAC stream never has more than 18 units of a pCH
  // reading: 40 x 32 pCH x 18 x 32 B / (t_ccdl x tCK) = 239.7 TB/s ([P] §7.1:
  // 242 TB/s).
  const auto bank = Make("attacc_bank");
  EXPECT_DOUBLE_EQ(bank->InternalBandwidth(), pchs * 18 * 32 / (4 * kTck));
  EXPECT_NEAR(bank->InternalBandwidth(), 239.7e12, 0.1e12);
  EXPECT_DOUBLE_EQ(bank->ExternalBandwidth(), external);
  // Ratios to external: units x 32 B / t_ccdl against 32 B / t_ccds, i.e.
  // units / 2: bank 18/2 = 9, BG 6/2 = 3, buffer 1 unit per t_ccds = 1;
  // without the cap bank 32/2 = 16, BG 8/2 = 4, buffer 1.
  const struct {
    const char* preset;
    bool cap;
    double ratio;
  } cases[] = {{"attacc_bank", true, 9},   {"attacc_bg", true, 3},  {"attacc_buffer", true, 1},
               {"attacc_bank", false, 16}, {"attacc_bg", false, 4}, {"attacc_buffer", false, 1}};
  for (const auto& c : cases) {
    const auto d = Make(c.preset, c.cap);
    EXPECT_NEAR(d->InternalBandwidth() / d->ExternalBandwidth(), c.ratio, 1e-12)
        << c.preset << " cap " << c.cap;
  }
}

TEST(AttAccBandwidthTest, FeedForwardGemv) {
  const auto d = Make();
  Op op;
  op.kind = OpKind::kGemm;
  op.stage = Stage::kFf1;
  op.m = 4, op.k = 12288, op.n = 6144;
  const Cost c = Estimate1(*d, op);
  const double weights = 12288.0 * 6144 * 2;
  EXPECT_DOUBLE_EQ(c.time_s, 4 * weights / d->InternalBandwidth());
  EXPECT_DOUBLE_EQ(c.dram_bytes, 4 * weights);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4 * 12288 * 6144);
  EXPECT_DOUBLE_EQ(c.external_bytes, (4.0 * 12288 + 4.0 * 6144) * 2);
  EXPECT_DOUBLE_EQ(c.compute_energy_pj, 4.0 * 12288 * 6144 * 0.32);
}

// --------------------------------------------------------- bytes/energy --

TEST(AttAccEnergyTest, OneHeadPerLevelByHand) {
  // One head, L = 2048, d_head 128, bank placement.
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 2047}};
  const Cost c = Estimate1(*d, Attention(seqs, 1, 1, 128));
  // Cells -> bank units: 2 GEMVs x 256 columns x 32 B x 32 banks x 2 pCH
  // = 1,048,576 B = 2 x 2048 x 128 x 2 B (no padding).
  EXPECT_DOUBLE_EQ(c.dram_bytes, 1048576);
  // BG buses (2 B values, per pCH x 2): q broadcast 128 (512 B), score
  // partials 32 banks x 128 positions (16,384 B), probabilities 8 BGs x 128
  // (4,096 B), context partials 8 BGs x 128 (4,096 B); new K and V written
  // 2 x 128 x 2 = 512 B.
  EXPECT_DOUBLE_EQ(c.bg_bus_bytes, 512 + 16384 + 4096 + 4096 + 512);  // 25,600
  // TSVs: q 512, scores after the BG accumulators 8 x 128 (4,096), the
  // probabilities 4,096, context partials 4,096, new K/V 512.
  EXPECT_DOUBLE_EQ(c.tsv_bytes, 512 + 4096 + 4096 + 4096 + 512);  // 13,312
  // PHY: q 256 B in, output 256 B out, new K/V 512 B.
  EXPECT_DOUBLE_EQ(c.external_bytes, 256 + 256 + 512);
  // Energy (pJ/bit x 8):
  //  ACT/PRE: 16 rows x 32 banks x 2 pCH = 1024 rows x 1024 B x 0.88
  //           = 922,746.88
  //  cell RD/WR: (1,048,576 + 512) x 3.52 = 3,692,789.76
  //  column decoder -> BG mux: 25,600 x 8.08 = 206,848
  //  BG mux -> GIO + TSV: 13,312 x 8 x 1.73 = 184,238.08
  //  interposer: 1,024 x 2.4 = 2,457.6
  EXPECT_NEAR(c.dram_energy_pj, 922746.88 + 3692789.76 + 206848 + 184238.08 + 2457.6, 1e-6);
  // 2 x 2048 x 128 = 524,288 MACs x 0.32 + 5 x 2048 softmax ops x 0.16.
  EXPECT_NEAR(c.compute_energy_pj, 524288 * 0.32 + 10240 * 0.16, 1e-6);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 524288 + 10240);
  EXPECT_EQ(c.link_bytes, 0);
  // Time: S = WR_GB 32 + score + MV_SB 32; softmax 37; MV_GB 256;
  // C = context + out 64; x refresh.
  const double score = 1024 * kCap + 19;
  const double cycles = (32 + score + 32) + 37 + 256 + (score + 64);
  EXPECT_NEAR(c.cycles, cycles * kRefresh, 1e-9);
  EXPECT_NEAR(c.time_s, cycles * kRefresh * kTck, 1e-18);
  EXPECT_NEAR(c.score_s, (64 + score) * kRefresh * kTck, 1e-18);
  EXPECT_NEAR(c.softmax_s, 37 * kRefresh * kTck, 1e-18);
  EXPECT_NEAR(c.context_s, (256 + score + 64) * kRefresh * kTck, 1e-18);
}

TEST(AttAccEnergyTest, PlacementsMoveKvToDifferentLevels) {
  std::vector<AttentionSeq> seqs = {{1, 2047}};
  const Op op = Attention(seqs, 1, 1, 128);
  const Cost bank = Estimate1(*Make("attacc_bank"), op);
  const Cost bg = Estimate1(*Make("attacc_bg"), op);
  const Cost buffer = Estimate1(*Make("attacc_buffer"), op);
  for (const Cost* c : {&bank, &bg, &buffer}) EXPECT_DOUBLE_EQ(c->dram_bytes, 1048576);
  // BG: the cells' bytes cross the BG buses; buffer: the TSVs too.
  EXPECT_DOUBLE_EQ(bg.bg_bus_bytes, 1048576 + 512);
  EXPECT_DOUBLE_EQ(bg.tsv_bytes, bank.tsv_bytes);
  EXPECT_DOUBLE_EQ(buffer.bg_bus_bytes, 1048576 + 512);
  EXPECT_DOUBLE_EQ(buffer.tsv_bytes, 1048576 + 512);
  EXPECT_LT(bank.dram_energy_pj, bg.dram_energy_pj);
  EXPECT_LT(bg.dram_energy_pj, buffer.dram_energy_pj);
  EXPECT_LT(bank.time_s, bg.time_s);
  EXPECT_LT(bg.time_s, buffer.time_s);
}

TEST(AttAccEnergyTest, GqaReadsPerQueryHeadAndHeadGroupsAddUp) {
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 999}, {1, 3000}};
  Op op = Attention(seqs, 8, 2, 128);
  const Cost all = Estimate1(*d, op);
  // Every query head runs its own GEMVs over its KV head's K and V.
  EXPECT_DOUBLE_EQ(all.dram_bytes, 8 * (d->HeadCellBytes(1000, 128) + d->HeadCellBytes(3001, 128)));
  // Head groups [0, 3) and [3, 8): the same bytes; the new K/V of a KV head
  // are counted once (in the group with its first query head).
  op.head_end = 3;
  const Cost a = Estimate1(*d, op);
  op.head_begin = 3, op.head_end = -1;
  const Cost b = Estimate1(*d, op);
  EXPECT_DOUBLE_EQ(a.dram_bytes + b.dram_bytes, all.dram_bytes);
  EXPECT_DOUBLE_EQ(a.external_bytes + b.external_bytes, all.external_bytes);
  EXPECT_NEAR(a.dram_energy_pj + b.dram_energy_pj, all.dram_energy_pj, 1e-3);
  EXPECT_DOUBLE_EQ(a.flops + b.flops, all.flops);
  // Both groups in one call (as the planner's head-level pipelining asks):
  // the same costs, and the device's own placement is shared.
  Op ops[2] = {op, op};
  ops[0].head_begin = 0, ops[0].head_end = 3;
  Cost both[2];
  ASSERT_TRUE(d->Estimate(ops, both).ok());
  EXPECT_EQ(both[0].time_s, a.time_s);
  EXPECT_EQ(both[1].time_s, b.time_s);
  EXPECT_EQ(both[1].dram_energy_pj, b.dram_energy_pj);
}

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

// ------------------------------------------------------------ functional --

Tensor Random(ElementType type, std::vector<int64_t> shape, Rng& rng) {
  Tensor t = Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    t.Set(i, static_cast<float>(2 * rng.Uniform() - 1));
  }
  return t;
}

// |got - want| <= atol + rtol |want| with rtol 1e-2, atol 2e-3: fp16
// products and fp16 lane accumulation against the fp32 reference on inputs
// in [-1, 1] (fp16 has an 11-bit significand: 4.9e-4 relative per rounding).
// Returns the largest absolute error.
double ExpectClose(const Tensor& got, const Tensor& want, const char* what) {
  EXPECT_EQ(got.shape, want.shape) << what;
  double worst = 0;
  for (int64_t i = 0; i < got.NumElements(); ++i) {
    const double g = got.At(i), w = want.At(i);
    EXPECT_TRUE(std::isfinite(g)) << what << " element " << i;
    worst = std::max(worst, std::fabs(g - w));
    EXPECT_LE(std::fabs(g - w), 2e-3 + 1e-2 * std::fabs(w))
        << what << " element " << i << ": " << g << " vs " << w;
  }
  std::printf("%s: largest |error| %.2e\n", what, worst);
  return worst;
}

// Runs the kernel and checks it against ExactAttention, and its bytes and
// MACs against Estimate for the same single-sequence op.
double CheckKernel(const AttAccDevice& d, const AttentionCall& call, const char* what) {
  int64_t macs = 0;
  auto got = d.ExecuteCounted(call, &macs);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return 0;
  auto want = ExactAttention(call);
  EXPECT_TRUE(want.ok());
  const double worst = ExpectClose(got->out, want->out, what);
  const int64_t heads = call.q.shape[0], kv_heads = call.k.shape[0];
  const int64_t l = call.k.shape[1], dh = call.q.shape[2];
  EXPECT_EQ(got->stats.kv_positions, heads * l);
  EXPECT_EQ(got->stats.kv_positions_read, heads * l);
  EXPECT_EQ(got->stats.v_rows_read, heads * l);
  EXPECT_EQ(macs, heads * d.HeadMacs(l, dh)) << what;
  std::vector<AttentionSeq> seqs = {{1, l - 1}};
  const Cost c = Estimate1(d, Attention(seqs, heads, kv_heads, dh));
  EXPECT_DOUBLE_EQ(got->stats.bytes_read, c.dram_bytes) << what;
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * macs + 5.0 * heads * l) << what;
  return worst;
}

TEST(AttAccKernelTest, RandomInputsAllPlacements) {
  Rng rng(11, "attacc-kernel");
  for (const char* preset : {"attacc_bank", "attacc_bg", "attacc_buffer"}) {
    const auto d = Make(preset);
    AttentionCall call;
    call.q = Random(ElementType::kFp16, {4, 1, 128}, rng);
    call.k = Random(ElementType::kFp16, {4, 2048, 128}, rng);
    call.v = Random(ElementType::kFp16, {4, 2048, 128}, rng);
    // fp16 products and lane sums differ from the fp32 reference, within
    // the tolerance.
    EXPECT_GT(CheckKernel(*d, call, preset), 0) << preset;
  }
}

TEST(AttAccKernelTest, OddShapesGqaAndFp32Inputs) {
  Rng rng(12, "attacc-kernel");
  const auto d = Make();
  struct Case {
    int64_t heads, kv_heads, l, dh;
    ElementType type;
    const char* what;
  } cases[] = {
      {2, 2, 1, 128, ElementType::kFp16, "L = 1"},
      {3, 3, 301, 128, ElementType::kFp16, "L = 301 (not a multiple of 16)"},
      {2, 2, 777, 160, ElementType::kFp16, "d_head 160"},
      {8, 2, 515, 128, ElementType::kFp16, "GQA 8:2"},
      {2, 1, 100, 64, ElementType::kFp32, "fp32 inputs, d_head 64"},
  };
  for (const Case& c : cases) {
    AttentionCall call;
    call.q = Random(c.type, {c.heads, 1, c.dh}, rng);
    call.k = Random(c.type, {c.kv_heads, c.l, c.dh}, rng);
    call.v = Random(c.type, {c.kv_heads, c.l, c.dh}, rng);
    CheckKernel(*d, call, c.what);
  }
}

TEST(AttAccKernelTest, LargeScoreRange) {
  // scale 1 and q = 0.5: key 7 aligned (k = +0.9375: score +60), key 100
  // anti-aligned (-60), the rest random (|score| ~ 3). The max-subtracted
  // fp32 softmax neither overflows nor loses the winner.
  Rng rng(13, "attacc-kernel");
  for (const char* preset : {"attacc_bank", "attacc_buffer"}) {
    const auto d = Make(preset);
    const int64_t l = 531, dh = 128;
    AttentionCall call;
    call.scale = 1;
    call.q = Tensor::Zeros(ElementType::kFp16, {1, 1, dh});
    for (int64_t c = 0; c < dh; ++c) call.q.Set(c, 0.5f);
    call.k = Random(ElementType::kFp16, {1, l, dh}, rng);
    call.v = Random(ElementType::kFp16, {1, l, dh}, rng);
    for (int64_t c = 0; c < dh; ++c) {
      call.k.Set(7 * dh + c, 0.9375f);
      call.k.Set(100 * dh + c, -0.9375f);
    }
    CheckKernel(*d, call, "scores +-60");
    // A second key close to the winner (score 56): both matter.
    for (int64_t c = 0; c < dh; ++c) call.k.Set(300 * dh + c, 0.875f);
    CheckKernel(*d, call, "scores 60 and 56");
  }
}

// ------------------------------------------------------------ bad inputs --

TEST(AttAccBadInputTest, PrefillAndOtherOpsRejected) {
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 10}, {16, 0}};
  const absl::Status s = EstimateStatus(*d, Attention(seqs, 4, 4, 128));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("attacc runs decode attention only; prefill runs on the xPUs"),
            std::string::npos)
      << s;
  Op ew;
  ew.kind = OpKind::kElementwise;
  ew.elements = 10;
  EXPECT_EQ(EstimateStatus(*d, ew).code(), absl::StatusCode::kInvalidArgument);

  Rng rng(14, "attacc-kernel");
  AttentionCall call;
  call.q = Random(ElementType::kFp16, {2, 2, 64}, rng);
  call.k = Random(ElementType::kFp16, {2, 8, 64}, rng);
  call.v = Random(ElementType::kFp16, {2, 8, 64}, rng);
  auto r = d->Execute(call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("decode attention only"), std::string::npos);
}

TEST(AttAccBadInputTest, PlacementOutOfRange) {
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 10}};
  Op op = Attention(seqs, 4, 4, 128);
  std::vector<int32_t> placement = {0, 1, 2, 40};
  op.kv_head_stack = placement;
  absl::Status s = EstimateStatus(*d, op);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv_head_stack[3] = 40"), std::string::npos) << s;
  std::vector<int32_t> short_placement = {0, 1};
  op.kv_head_stack = short_placement;
  EXPECT_EQ(EstimateStatus(*d, op).code(), absl::StatusCode::kInvalidArgument);
  op.kv_head_stack = {};
  op.head_begin = 3, op.head_end = 2;
  EXPECT_EQ(EstimateStatus(*d, op).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AttAccBadInputTest, RememberedListsDoNotSkipTheStackCheck) {
  // A list's bounds are checked when the recent-list memo first meets it;
  // a list that differs from a remembered one only in an out-of-range
  // stack is new to the memo, so it is checked and rejected, and the
  // remembered list still answers as before.
  const auto d = Make();
  std::vector<AttentionSeq> seqs = {{1, 10}, {1, 500}};
  Op op = Attention(seqs, 4, 4, 128);
  std::vector<int32_t> good = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> bad = {0, 1, 2, 3, 4, 5, 6, 40};
  op.kv_head_stack = good;
  std::vector<Cost> first(1), again(1);
  ASSERT_TRUE(d->Estimate({op}, absl::MakeSpan(first)).ok());
  op.kv_head_stack = bad;
  absl::Status s = EstimateStatus(*d, op);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv_head_stack[7] = 40"), std::string::npos) << s;
  EXPECT_EQ(EstimateStatus(*d, op).code(), absl::StatusCode::kInvalidArgument) << "asked twice";
  op.kv_head_stack = good;
  ASSERT_TRUE(d->Estimate({op}, absl::MakeSpan(again)).ok());
  EXPECT_EQ(again[0].time_s, first[0].time_s);
  // An empty head range still checks the stacks.
  op.kv_head_stack = bad;
  op.head_begin = op.head_end = 2;
  EXPECT_EQ(EstimateStatus(*d, op).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AttAccBadInputTest, BadSpecNamesTheField) {
  auto check = [](servesim::v1::DeviceSpec spec, const std::string& want) {
    auto d = CreateDevice(spec);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(d.status().message().find(want), std::string::npos) << d.status();
  };
  auto spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_t_ccdl(0);
  check(spec, "attacc device: t_ccdl = 0; expected >= 1");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_gemv_units_active_per_pch(40);
  check(spec, "gemv_units_active_per_pch = 40; expected in [1, 32]");
  spec = Spec("attacc_bg");
  spec.mutable_attacc()->mutable_attacc()->set_gemv_units_active_per_pch(18);
  check(spec, "gemv_units_active_per_pch = 18; expected in [1, 8]");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_tck_s(-1);
  check(spec, "tck_s = -1; expected in (0, 1e-06]");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_gemv_clock_hz(
      std::numeric_limits<double>::infinity());
  check(spec, "gemv_clock_hz = inf; expected in (0, 1e+12]");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->mutable_link()->set_latency_s(
      std::numeric_limits<double>::infinity());
  check(spec, "link.latency_s = inf; expected >= 0 and finite");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_t_rfc(6000);
  check(spec, "t_rfc = 6000; expected < t_refi");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->clear_softmax_lanes();
  check(spec, "softmax_lanes is not set");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_row_bytes(1000);
  check(spec, "row_bytes = 1000; expected a multiple of column_bytes");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_placement(
      servesim::v1::ATTACC_PLACEMENT_UNSPECIFIED);
  check(spec, "placement");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->clear_link();
  check(spec, "link is not resolved");
  // A stack past 2^40 bytes (the overflow scenario_fuzz found for xPU
  // memory: int32 geometry multiplies to a pool whose KV block count is
  // past int64). 2^34 B x 64 is exactly the limit.
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_rows_per_bank(1 << 20);
  EXPECT_TRUE(CreateDevice(spec).ok());
  spec.mutable_attacc()->mutable_attacc()->set_row_bytes(2048);
  check(spec, "attacc device: stack capacity = 2.19902e+12; expected at most 2^40 bytes (1 TiB)");
  // Each geometry field has a range (on an agent the client sends them; a
  // channel count near 2^31 overflowed Estimate's per-channel arrays).
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_channels(2147483647);
  check(spec, "attacc device: channels = 2.14748e+09; expected in [1, 64]");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_stacks(4097);
  check(spec, "attacc device: stacks = 4097; expected in [1, 4096]");
  spec = Spec();
  spec.mutable_attacc()->mutable_attacc()->set_pseudo_channels(9);
  check(spec, "attacc device: pseudo_channels = 9; expected in [1, 8]");
}

TEST(AttAccBadInputTest, HeadItemsPerOpAreBounded) {
  // 4,097 sequences x 65,536 query heads (what an agent's client may send)
  // once overflowed the int32 per-stack head counts; 2^28 items, the most
  // a scenario makes (65,536 sequences x 4,096 heads), is the limit.
  const auto d = Make();
  const std::vector<AttentionSeq> seqs(4097, AttentionSeq{1, 0});
  const absl::Status over = EstimateStatus(*d, Attention(seqs, 65536, 1, 1));
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message(),
            "attacc device: attention op of 4097 sequences x 65536 query heads = 268500992 "
            "head items; expected at most 268435456");
  EXPECT_TRUE(EstimateStatus(*d, Attention({{1, 0}, {1, 7}}, 65536, 1, 1)).ok());
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
              << trial << " group " << g << " of " << sh.groups << ", " << nseq
              << " sequences on " << used_stacks << " stacks";
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
}  // namespace servesim::devices
