// SpAtten device: Alg. 3 top-k with ties, all ratios 0 at 12 bits equals
// the reference, cascade-pruned tokens never return, the per-layer ratio
// schedule, the cycle model by hand, FULL memo, and a GPT-2-medium-sized
// measurement.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "devices/attention_data.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

servesim::v1::DeviceSpec Spec(const char* preset = "spatten",
                              servesim::v1::PruneFidelity f = servesim::v1::PRUNE_FIDELITY_ANALYTIC) {
  servesim::v1::DeviceSpec spec;
  auto p = SpattenPreset(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  *spec.mutable_spatten()->mutable_spatten() = *p;
  spec.mutable_spatten()->set_fidelity(f);
  return spec;
}

std::unique_ptr<SpattenDevice> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = SpattenDevice::Create(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  return std::unique_ptr<SpattenDevice>(static_cast<SpattenDevice*>(d->release()));
}

TEST(SpattenTopKTest, KthLargestWithTiesAsAlgorithm3) {
  const std::vector<double> v = {5, 3, 5, 1, 5, 2};
  int64_t work = 0;
  TopK t = QuickSelect(v, 2, 1, &work);
  EXPECT_EQ(t.kth, 5);
  EXPECT_EQ(t.num_eq, 2);  // two of the three 5s
  EXPECT_EQ(TopKIndices(v, 2, 1, nullptr), (std::vector<int64_t>{0, 2}));
  // Alg. 3 returns a threshold, not always the k-th value itself: with
  // pivot 5 then 2 it stops when |FIFO_R| = target with num_eq 0, and the
  // filter (> kth, plus num_eq equal ones) still selects exactly k. For
  // every pivot stream: count(> kth) + num_eq = k, num_eq <= count(= kth).
  for (uint64_t seed = 0; seed < 20; ++seed) {
    t = QuickSelect(v, 4, seed, nullptr);
    int64_t above = 0, equal = 0;
    for (double x : v) above += x > t.kth, equal += x == t.kth;
    EXPECT_EQ(above + t.num_eq, 4) << "seed " << seed;
    EXPECT_LE(t.num_eq, equal) << "seed " << seed;
  }
  EXPECT_EQ(TopKIndices(v, 4, 7, nullptr), (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_GE(work, 6);  // at least one pass over the input
  // Exactly k, and no unselected element above a selected one, on data
  // full of ties, for every k and several pivot streams.
  Rng rng(3, "spatten.topk.test");
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<double> x(1 + rng.UniformInt(60));
    for (double& e : x) e = static_cast<double>(rng.UniformInt(5));
    for (int64_t k = 1; k <= static_cast<int64_t>(x.size()); ++k) {
      const auto idx = TopKIndices(x, k, trial, nullptr);
      ASSERT_EQ(static_cast<int64_t>(idx.size()), k);
      std::vector<uint8_t> in(x.size(), 0);
      double lo = 1e9;
      for (int64_t i : idx) in[i] = 1, lo = std::min(lo, x[i]);
      for (size_t i = 0; i < x.size(); ++i) {
        if (!in[i]) {
          EXPECT_LE(x[i], lo);
        }
      }
    }
  }
}

TEST(SpattenKernelTest, AllRatiosZeroAt12BitsEqualsReference) {
  auto g = AttentionDataGenerator::Create({});
  const auto dev = Make(Spec("dense"));
  for (int64_t l : {100, 700}) {
    auto call = LayerCall(*g, 3, 5, 4, l);
    ASSERT_TRUE(call.ok());
    auto r = dev->Execute(*call);
    auto ref = ExactAttention(*call);
    ASSERT_TRUE(r.ok() && ref.ok());
    EXPECT_EQ(r->stats.kv_positions_read, 4 * l);
    EXPECT_EQ(r->stats.v_rows_read, 4 * l);
    // 12-bit symmetric quantisation bound per head (as the topick test):
    // eps = max_j (sum|q| sk/2 + sum|k_j| sq/2 + d sq sk/4) / sqrt(d);
    // |error| <= (e^(2 eps) - 1) max|v| + sv/2.
    const int64_t d = 64;
    for (int64_t h = 0; h < 4; ++h) {
      double qmax = 0, qabs = 0, kmax = 0, vmax = 0;
      for (int64_t c = 0; c < d; ++c) {
        qmax = std::max<double>(qmax, std::fabs(call->q.At(h * d + c)));
        qabs += std::fabs(call->q.At(h * d + c));
      }
      for (int64_t x = 0; x < l * d; ++x) {
        kmax = std::max<double>(kmax, std::fabs(call->k.At(h * l * d + x)));
        vmax = std::max<double>(vmax, std::fabs(call->v.At(h * l * d + x)));
      }
      const double sq = qmax / 2047, sk = kmax / 2047, sv = vmax / 2047;
      double eps = 0;
      for (int64_t j = 0; j < l; ++j) {
        double kabs = 0;
        for (int64_t c = 0; c < d; ++c) kabs += std::fabs(call->k.At((h * l + j) * d + c));
        eps = std::max(eps, (qabs * sk / 2 + kabs * sq / 2 + d * sq * sk / 4) / 8.0);
      }
      const double bound = (std::exp(2 * eps) - 1) * vmax + sv / 2 + 1e-5;
      for (int64_t c = 0; c < d; ++c) {
        EXPECT_LE(std::fabs(r->out.At(h * d + c) - ref->out.At(h * d + c)), bound);
      }
    }
  }
}

TEST(SpattenKernelTest, RatioSchedule) {
  const auto dev = Make(Spec());
  // 24 layers: round(0.15 x 24) = 4 unpruned, then 0.45 .. 0.65 over 20.
  EXPECT_EQ(dev->TokenRatio(3, 24), 0.0);
  EXPECT_DOUBLE_EQ(dev->TokenRatio(4, 24), 0.45);
  EXPECT_DOUBLE_EQ(dev->TokenRatio(23, 24), 0.65);
  EXPECT_DOUBLE_EQ(dev->TokenRatio(14, 24), 0.45 + 0.2 * 10 / 19);
  // Heads: round(0.3 x 24) = 7 unpruned.
  EXPECT_EQ(dev->HeadRatio(6, 24), 0.0);
  EXPECT_DOUBLE_EQ(dev->HeadRatio(7, 24), 0.08);
}

TEST(SpattenKernelTest, PrunedTokensNeverReturn) {
  auto g = AttentionDataGenerator::Create({});
  const auto dev = Make(Spec());
  const int layers = 6, heads = 4;
  SpattenSession s(*dev, layers, heads);
  std::vector<uint8_t> pruned;
  for (int64_t l = 300; l < 306; ++l) {
    for (int layer = 0; layer < layers; ++layer) {
      SpattenCounts c;
      auto r = s.RunLayer(layer, *LayerCall(*g, 1, layer, heads, l), &c);
      ASSERT_TRUE(r.ok()) << r.status();
      const auto& now = s.token_pruned();
      for (size_t j = 0; j < pruned.size(); ++j) {
        if (pruned[j]) {
          EXPECT_TRUE(now[j]) << "token " << j << " came back at L " << l;
        }
      }
      pruned = now;
      // A layer fetches K of at most ceil(L (1 - r_t)) tokens per run head.
      const double cap = std::ceil(l * (1 - dev->TokenRatio(layer, layers)) - 1e-9);
      EXPECT_LE(c.k_tokens, c.heads_run * cap);
      EXPECT_FALSE(now[l - 1]);  // the current token is kept
    }
  }
  int64_t n = 0;
  for (uint8_t p : pruned) n += p;
  EXPECT_GT(n, 150);  // ~0.65 of 305 after the deepest layer
}

TEST(SpattenCyclesTest, DenseHeadByHand) {
  const auto dev = Make(Spec("dense"));
  std::vector<AttentionSeq> seqs = {{1, 1023, 0}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 1, op.kv_heads = 1, op.d_head = 64;
  op.seqs = seqs;
  Cost c;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c, 1}).ok());
  // K and V: 12 bits x 64 x 1024 = 98304 B each; fetch 196608 / 512 = 384
  // cycles beats Q x K (1024 / 8), softmax (1024 / 8) and prob x V
  // (1024 / 8); plus 60 cycles of latency.
  EXPECT_EQ(c.dram_bytes, 2 * 98304.0);
  EXPECT_EQ(c.cycles, 384.0 + 60.0);
  EXPECT_DOUBLE_EQ(c.compute_energy_pj, 2.6 * c.time_s * 1e12);
  // The spatten preset's ANALYTIC row: 0.909 heads, K 0.35 L and V 0.175 L
  // at 6 + 0.059 x 4 bits.
  const auto sp = Make(Spec());
  ASSERT_TRUE(sp->Estimate({&op, 1}, {&c, 1}).ok());
  EXPECT_NEAR(c.dram_bytes, 0.909 * (0.35 + 0.175) * 1024 * 64 * (6 + 0.059 * 4) / 8, 1e-6);
}

TEST(SpattenFidelityTest, FullMemoIsStableAndCalibratedIsQuick) {
  auto spec = Spec("spatten", servesim::v1::PRUNE_FIDELITY_FULL);
  auto* m = spec.mutable_spatten()->mutable_model();
  m->set_layers(4);
  m->set_heads(4);
  m->set_d_head(64);
  const auto dev = Make(spec);
  std::vector<AttentionSeq> a = {{1, 199, 1}}, b = {{1, 200, 1}, {1, 99, 2}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 4, op.kv_heads = 4, op.d_head = 64;
  Cost c1, c2, c3;
  op.seqs = a;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c1, 1}).ok());
  op.seqs = b;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c2, 1}).ok());
  op.seqs = a;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c3, 1}).ok());
  EXPECT_EQ(c1.time_s, c3.time_s);
  EXPECT_EQ(c1.dram_bytes, c3.dram_bytes);
  auto cal = Make(Spec("spatten", servesim::v1::PRUNE_FIDELITY_CALIBRATED));
  std::printf("spatten calibration: %.3f s\n", cal->calibration_s());
  EXPECT_LT(cal->calibration_s(), 5.0);  // 0.11 s in Release
  auto row = cal->Fractions(-1, 1024);
  ASSERT_TRUE(row.ok());
  std::printf("spatten calibrated at 1024: heads %.3f K %.3f V %.3f lsb %.3f\n", (*row)[0],
              (*row)[1], (*row)[2], (*row)[3]);
  EXPECT_GT((*row)[1], (*row)[2]);  // value pruning on top of token pruning
}

// GPT-2 medium (24 x 16, d_head 64) at L = 1024, one request, the second of
// two steps: DRAM access against dense 12-bit and fp16 (paper: 10.0x, its
// average over 30 benchmarks against unpruned data).
TEST(SpattenMeasureTest, Gpt2MediumAtL1024) {
  auto g = AttentionDataGenerator::Create({});
  for (const char* preset : {"spatten", "spatten_8+4"}) {
    const auto dev = Make(Spec(preset));
    SpattenSession s(*dev, 24, 16);
    SpattenCounts last;
    for (int64_t l : {1023, 1024}) {
      for (int layer = 0; layer < 24; ++layer) {
        SpattenCounts c;
        ASSERT_TRUE(s.RunLayer(layer, *LayerCall(*g, 0, layer, 16, l), &c).ok());
        if (l == 1024) last += c;
      }
    }
    const double dense12 = 24 * 16 * 2 * 1024 * 64 * 12 / 8.0;
    const double bytes = last.k_bytes + last.v_bytes;
    const auto row = SpattenDevice::RowOf(last);
    std::printf("%s: heads kept %.3f, K rows %.3f, V rows %.3f, LSB %.3f; DRAM access vs "
                "dense 12-bit %.2fx, vs fp16 %.2fx\n",
                preset, row[0], row[1], row[2], row[3], dense12 / bytes, dense12 * 16 / 12 / bytes);
    EXPECT_GT(dense12 / bytes, 2.0);
  }
}

TEST(SpattenBadInputTest, BadSpecsNameTheField) {
  auto s = Spec();
  s.mutable_spatten()->mutable_spatten()->set_value_ratio(1.0);
  auto d = SpattenDevice::Create(s);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("value_ratio"), std::string::npos);
  s = Spec();
  s.mutable_spatten()->mutable_spatten()->clear_msb_bits();
  EXPECT_NE(SpattenDevice::Create(s).status().message().find("msb_bits"), std::string::npos);
  s = Spec();
  s.mutable_spatten()->mutable_spatten()->set_clock_hz(std::numeric_limits<double>::infinity());
  EXPECT_EQ(SpattenDevice::Create(s).status().message(),
            "spatten device: clock_hz = inf; expected > 0 and finite");
  EXPECT_NE(SpattenDevice::Create(Spec("spatten", servesim::v1::PRUNE_FIDELITY_FULL))
                .status().message().find("model.layers"),
            std::string::npos);
  EXPECT_EQ(SpattenPresetNames(),
            (std::vector<std::string>{"dense", "spatten", "spatten_1/8", "spatten_8+4"}));
  auto reg = CreateDevice(Spec());
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ((*reg)->Describe().kind, "spatten");
}

}  // namespace
}  // namespace servesim::devices
