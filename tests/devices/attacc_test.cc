// AttAcc device: the cycle model against hand-computed command counts, the
// power cap and bandwidth ratios, bytes and energy per level, bad inputs.
// The head schedule is attacc_schedule_test.cc, the functional kernel
// attacc_kernel_test.cc; the preset's figures are in attacc_test_util.h.
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

}  // namespace
}  // namespace servesim::devices::attacc_test
