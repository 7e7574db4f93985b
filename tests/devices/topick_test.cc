// Token-Picker device: the estimate is conservative (every pruned token's
// probability is below thr, on random and adversarial data), thr = 0 equals
// the reference within the 12-bit quantisation bound, the cycle model by
// hand, the fidelity modes, bad specs.
//
// Figures (topick preset, d_head 64): 512 B per cycle (8 x 32 GB/s at
// 500 MHz), a 4-bit chunk of a row is 32 B, a 12-bit row 96 B, one chunk
// per lane and cycle, latency 30 cycles, 32 scoreboard entries.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
#include "devices/attention_data.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

using servesim::v1::PRUNE_FIDELITY_ANALYTIC;
using servesim::v1::PRUNE_FIDELITY_CALIBRATED;
using servesim::v1::PRUNE_FIDELITY_FULL;

servesim::v1::DeviceSpec Spec(const char* preset = "topick",
                              servesim::v1::PruneFidelity fidelity = PRUNE_FIDELITY_ANALYTIC) {
  servesim::v1::DeviceSpec spec;
  auto p = TopickPreset(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  *spec.mutable_topick()->mutable_topick() = *p;
  spec.mutable_topick()->set_fidelity(fidelity);
  return spec;
}

std::unique_ptr<TopickDevice> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = TopickDevice::Create(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  return std::unique_ptr<TopickDevice>(static_cast<TopickDevice*>(d->release()));
}

// A device with threshold `thr` for its functional kernel. ANALYTIC holds
// only for the preset's threshold, so any other is CALIBRATED (one short
// length keeps the start-up calibration cheap).
std::unique_ptr<TopickDevice> MakeThr(double thr, const char* preset = "topick") {
  auto spec = Spec(preset);
  if (thr != spec.topick().topick().threshold()) {
    spec.mutable_topick()->set_fidelity(PRUNE_FIDELITY_CALIBRATED);
    spec.mutable_topick()->mutable_calibration()->add_lengths(64);
    spec.mutable_topick()->mutable_calibration()->set_instances(1);
  }
  spec.mutable_topick()->mutable_topick()->set_threshold(thr);
  return Make(spec);
}

// q [1, 1, d], k = v [1, l, d] from integer rows (exact in 12-bit fixed
// point when the largest |value| of q and of k is 2047).
AttentionCall IntCall(const std::vector<int>& q, const std::vector<std::vector<int>>& k) {
  const int64_t d = static_cast<int64_t>(q.size()), l = static_cast<int64_t>(k.size());
  AttentionCall c;
  c.q = Tensor::Zeros(ElementType::kFp32, {1, 1, d});
  c.k = Tensor::Zeros(ElementType::kFp32, {1, l, d});
  c.v = Tensor::Zeros(ElementType::kFp32, {1, l, d});
  for (int64_t i = 0; i < d; ++i) c.q.Set(i, static_cast<float>(q[i]));
  for (int64_t j = 0; j < l; ++j) {
    for (int64_t i = 0; i < d; ++i) {
      c.k.Set(j * d + i, static_cast<float>(k[j][i]));
      c.v.Set(j * d + i, static_cast<float>((j * 7 + i * 3) % 11) - 5.0f);
    }
  }
  return c;
}

// Probabilities in double of q.k * scale over all tokens.
std::vector<double> TrueProbs(const AttentionCall& c, double scale) {
  const int64_t l = c.k.shape[1], d = c.k.shape[2];
  std::vector<double> s(l);
  double mx = -INFINITY;
  for (int64_t j = 0; j < l; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(c.q.At(i)) * c.k.At(j * d + i);
    s[j] = dot * scale;
    mx = std::max(mx, s[j]);
  }
  double z = 0;
  for (double& x : s) z += (x = std::exp(x - mx));
  for (double& x : s) x /= z;
  return s;
}

// Asserts every pruned token's exact probability is below thr (the call is
// run with attention scale `scale`); returns how many were pruned.
int64_t ExpectConservative(const TopickDevice& dev, AttentionCall c, double scale,
                           const char* what) {
  c.scale = static_cast<float>(scale);
  auto r = dev.RunKernel(c);
  EXPECT_TRUE(r.ok()) << r.status();
  const auto p = TrueProbs(c, c.scale);
  const double thr = dev.spec().threshold();
  int64_t pruned = 0;
  for (size_t j = 0; j < p.size(); ++j) {
    if (r->pruned_after_chunk[j] >= 0) {
      ++pruned;
      EXPECT_LT(p[j], thr) << what << ": token " << j << " pruned after chunk "
                           << int{r->pruned_after_chunk[j]} << " has probability " << p[j];
    }
  }
  return pruned;
}

// The scale that gives the scores q.k_j a root mean square of `rms`.
double ScaleForRms(const AttentionCall& c, double rms) {
  const int64_t l = c.k.shape[1], d = c.k.shape[2];
  double ss = 0;
  for (int64_t j = 0; j < l; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(c.q.At(i)) * c.k.At(j * d + i);
    ss += dot * dot;
  }
  return rms / std::sqrt(ss / static_cast<double>(l));
}

// The largest error of a 12-bit score (see the thr = 0 test), with scale
// 1/sqrt(d).
double ScoreErrorBound(const AttentionCall& c) {
  const int64_t l = c.k.shape[1], d = c.k.shape[2];
  double qmax = 0, kmax = 0, qabs = 0;
  for (int64_t i = 0; i < d; ++i) {
    qmax = std::max<double>(qmax, std::fabs(c.q.At(i)));
    qabs += std::fabs(c.q.At(i));
  }
  for (int64_t x = 0; x < l * d; ++x) kmax = std::max<double>(kmax, std::fabs(c.k.At(x)));
  const double sq = qmax / 2047, sk = kmax / 2047;
  double eps = 0;
  for (int64_t j = 0; j < l; ++j) {
    double kabs = 0;
    for (int64_t i = 0; i < d; ++i) kabs += std::fabs(c.k.At(j * d + i));
    eps = std::max(eps, (qabs * sk / 2 + kabs * sq / 2 + d * sq * sk / 4) /
                            std::sqrt(static_cast<double>(d)));
  }
  return eps;
}

std::vector<int> RandomRow(Rng& rng, int64_t d, int amplitude) {
  std::vector<int> r(d);
  for (auto& x : r) x = static_cast<int>(rng.UniformInt(2 * amplitude + 1)) - amplitude;
  r[rng.UniformInt(d)] = rng.Uniform() < 0.5 ? 2047 : -2047;  // scale exactly 1
  return r;
}

// ------------------------------------------------------------- presets --

TEST(TopickPresetTest, PresetsCreateAndPowersMatchTable2) {
  EXPECT_EQ(TopickPresetNames(), (std::vector<std::string>{"baseline", "topick", "topick_0.3"}));
  for (const auto& name : TopickPresetNames()) {
    auto dev = CreateDevice(Spec(name.c_str()));
    ASSERT_TRUE(dev.ok()) << dev.status();
    EXPECT_EQ((*dev)->Describe().kind, "topick");
    EXPECT_EQ((*dev)->Describe().preset, name);
  }
  // Table 2: 1492.78 mW in all; the baseline lacks margin generator, DAG,
  // PEC (1.3% of the baseline), scoreboard and RPDU (5.6%).
  EXPECT_NEAR(Make(Spec("topick"))->PowerW(), 1.49278, 1e-9);
  const double base = Make(Spec("baseline"))->PowerW();
  EXPECT_NEAR(base, 1.39707, 1e-9);
  EXPECT_NEAR((3.78 + 2.49 + 16 * 0.73) * 1e-3 / base, 0.013, 5e-4);
  EXPECT_NEAR(16 * (4.69 + 0.17) * 1e-3 / base, 0.056, 5e-4);
}

// ----------------------------------------------- the estimate is safe ----

TEST(TopickKernelTest, PrunedTokensAreBelowThresholdOnRandomData) {
  Rng rng(11, "topick.random");
  int64_t pruned = 0;
  for (double thr : {1e-3, 1e-2, 0.1}) {
    const auto dev = MakeThr(thr);
    for (int trial = 0; trial < 12; ++trial) {
      const int64_t d = trial % 3 == 0 ? 64 : (trial % 3 == 1 ? 24 : 100);
      const int64_t l = 20 + static_cast<int64_t>(rng.UniformInt(400));
      const int amp = 100 + static_cast<int>(rng.UniformInt(1900));
      std::vector<std::vector<int>> k(l);
      for (auto& row : k) row = RandomRow(rng, d, amp);
      const auto c = IntCall(RandomRow(rng, d, amp), k);
      const double rms = 1.0 + 7.0 * rng.Uniform();
      pruned += ExpectConservative(*dev, c, ScaleForRms(c, rms), "random");
    }
  }
  EXPECT_GT(pruned, 1000);  // the property was exercised
}

TEST(TopickKernelTest, PrunedTokensAreBelowThresholdOnGeneratorData) {
  auto g = AttentionDataGenerator::Create({});
  ASSERT_TRUE(g.ok());
  int64_t pruned = 0;
  for (double thr : {1e-3, 4e-3}) {
    const auto dev = MakeThr(thr);
    for (int i = 0; i < 6; ++i) {
      auto c = g->DecodeStep({i, i, i}, 300 + 200 * i);
      ASSERT_TRUE(c.ok());
      // Probabilities of the 12-bit data the kernel sees: requantise first.
      auto r = dev->RunKernel(*c);
      ASSERT_TRUE(r.ok());
      // Float data is not exact in 12 bits; the estimate is exact for the
      // quantised scores, whose error is at most eps (see the thr = 0 test),
      // so the true probability is below thr * e^(2 eps).
      const double eps = ScoreErrorBound(*c);
      EXPECT_LT(eps, 0.2);
      const auto p = TrueProbs(*c, 1.0 / 8.0);
      for (size_t j = 0; j < p.size(); ++j) {
        if (r->pruned_after_chunk[j] < 0) continue;
        ++pruned;
        EXPECT_LT(p[j], thr * std::exp(2 * eps)) << "instance " << i << " token " << j;
      }
    }
  }
  EXPECT_GT(pruned, 1000);
}

TEST(TopickKernelTest, PrunedTokensAreBelowThresholdOnAdversarialData) {
  const int64_t d = 32;
  Rng rng(5, "topick.adversarial");
  const auto dev = MakeThr(1e-3);
  const double scale = 1.0 / std::sqrt(32.0);
  std::vector<int> q = RandomRow(rng, d, 2047);
  double qabs = 0;
  for (int x : q) qabs += std::abs(x);
  // (a) The dominant token is token 1, visited last: early denominators are
  // small, so the estimate must not prune what only later looks small.
  {
    std::vector<std::vector<int>> k(400);
    for (auto& row : k) row = RandomRow(rng, d, 60);
    for (int64_t i = 0; i < d; ++i) k[1][i] = q[i] > 0 ? 2047 : -2047;
    EXPECT_GT(ExpectConservative(*dev, IntCall(q, k), 30.0 / (qabs * 2047), "dominant last"), 0);
  }
  // (b) Scores rising with age: the visit order (recent first) sees the
  // smallest scores first.
  {
    std::vector<std::vector<int>> k(300, std::vector<int>(d));
    for (int64_t j = 0; j < 300; ++j) {
      for (int64_t i = 0; i < d; ++i) k[j][i] = (q[i] > 0 ? 1 : -1) * static_cast<int>(2047 - 6 * j);
    }
    EXPECT_GT(ExpectConservative(*dev, IntCall(q, k), 30.0 / (qabs * 2047), "rising with age"), 0);
  }
  // (c) Keys at the extremes of 12-bit two's complement (chunks 1000 0000
  // 0001 and 0111 1111 1111: the widest margins) and a query with zeros.
  {
    std::vector<int> qz = q;
    for (int64_t i = 0; i < d; i += 3) qz[i] = 0;
    qz[1] = 2047;
    double qzabs = 0;
    for (int x : qz) qzabs += std::abs(x);
    std::vector<std::vector<int>> k(256, std::vector<int>(d));
    for (int64_t j = 0; j < 256; ++j) {
      for (int64_t i = 0; i < d; ++i) k[j][i] = rng.Uniform() < 0.5 ? 2047 : -2047;
    }
    ExpectConservative(*dev, IntCall(qz, k), 25.0 / (qzabs * 2047), "extremes");
  }
  // (d) All keys equal: every probability is 1/L = 1/200 > thr, nothing
  // may be pruned.
  {
    std::vector<std::vector<int>> k(200, RandomRow(rng, d, 2047));
    EXPECT_EQ(ExpectConservative(*dev, IntCall(q, k), scale, "equal"), 0);
  }
}

// --------------------------------------------- thr = 0 is exact attention --

TEST(TopickKernelTest, ZeroThresholdEqualsReferenceWithinQuantisationBound) {
  auto g = AttentionDataGenerator::Create({});
  ASSERT_TRUE(g.ok());
  const auto dev = MakeThr(0.0);
  for (int i = 0; i < 4; ++i) {
    auto c = g->DecodeStep({100 + i, 0, i}, 257 * (i + 1));
    ASSERT_TRUE(c.ok());
    const int64_t l = c->k.shape[1], d = 64;
    auto r = dev->RunKernel(*c);
    auto ref = ExactAttention(*c);
    ASSERT_TRUE(r.ok() && ref.ok());
    EXPECT_EQ(r->counts.chunk_fetched[0], l);
    EXPECT_EQ(r->counts.chunk_fetched[1], l);
    EXPECT_EQ(r->counts.chunk_fetched[2], l);
    EXPECT_EQ(r->counts.v_fetched, l);
    // Derived bound. Symmetric 12-bit quantisation with scale s = max|x| /
    // 2047 errs by at most s/2 per element, so a score errs by at most
    // eps_j = scale * (sum_i |q_i| sk/2 + |k_ji| sq/2 + sq sk/4). Perturbing
    // every logit by at most eps changes each probability by a factor in
    // [e^(-2 eps), e^(2 eps)], so sum_j |p'_j - p_j| <= e^(2 eps) - 1, and
    // an output element errs by at most (e^(2 eps) - 1) max|v| + sv/2.
    double qmax = 0, kmax = 0, vmax = 0, qabs = 0;
    for (int64_t c2 = 0; c2 < d; ++c2) qmax = std::max<double>(qmax, std::fabs(c->q.At(c2)));
    for (int64_t c2 = 0; c2 < d; ++c2) qabs += std::fabs(c->q.At(c2));
    for (int64_t x = 0; x < l * d; ++x) {
      kmax = std::max<double>(kmax, std::fabs(c->k.At(x)));
      vmax = std::max<double>(vmax, std::fabs(c->v.At(x)));
    }
    const double sq = qmax / 2047, sk = kmax / 2047, sv = vmax / 2047;
    double eps = 0;
    for (int64_t j = 0; j < l; ++j) {
      double kabs = 0;
      for (int64_t c2 = 0; c2 < d; ++c2) kabs += std::fabs(c->k.At(j * d + c2));
      eps = std::max(eps, (qabs * sk / 2 + kabs * sq / 2 + d * sq * sk / 4) / 8.0);
    }
    const double bound = (std::exp(2 * eps) - 1) * vmax + sv / 2 + 1e-5;
    double worst = 0;
    for (int64_t x = 0; x < d; ++x) worst = std::max<double>(worst, std::fabs(r->out.At(x) - ref->out.At(x)));
    EXPECT_LE(worst, bound) << "instance " << i << " eps " << eps;
    EXPECT_GT(worst, 0.0);  // quantisation is really applied
  }
}

TEST(TopickKernelTest, EverythingButTheSinkPrunedAfterTheFirstChunk) {
  // q = (4, 0, ...), k_0 = (40, 0, ...), k_j = (-40, 0, ...): s_0 = 20,
  // s_j = -20 (scale 1/8). In cycle 0 each of the 16 lanes requests its
  // first token (token 0 and tokens L-1 .. L-15); they arrive at cycle 30
  // and are decided with D = 0 (no estimate yet), so they request chunk 2.
  // Every later token's first chunk arrives with D = e^(s_min of token 0)
  // and is pruned (p'' ~ e^-35); tokens L-1 .. L-15 are pruned after chunk
  // 2; token 0 is kept after chunk 3.
  const int64_t l = 200, d = 64;
  AttentionCall c;
  c.q = Tensor::Zeros(ElementType::kFp32, {1, 1, d});
  c.k = Tensor::Zeros(ElementType::kFp32, {1, l, d});
  c.v = Tensor::Zeros(ElementType::kFp32, {1, l, d});
  c.q.Set(0, 4.0f);
  for (int64_t j = 0; j < l; ++j) {
    c.k.Set(j * d, j == 0 ? 40.0f : -40.0f);
    c.v.Set(j * d + 1, static_cast<float>(j));
  }
  const auto dev = MakeThr(1e-3);
  auto r = dev->RunKernel(c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->counts.chunk_fetched[0], l);
  EXPECT_EQ(r->counts.chunk_fetched[1], 16);
  EXPECT_EQ(r->counts.chunk_fetched[2], 1);
  EXPECT_EQ(r->counts.pruned_after[0], l - 16);
  EXPECT_EQ(r->counts.pruned_after[1], 15);
  EXPECT_EQ(r->counts.v_fetched, 1);
  EXPECT_EQ(r->pruned_after_chunk[0], -1);
  EXPECT_EQ(r->pruned_after_chunk[l - 1], 1);
  EXPECT_EQ(r->pruned_after_chunk[l - 16], 0);
  // K bytes: (L + 16 + 1) chunks of 64 x 4 bit; V: one 12-bit row.
  EXPECT_EQ(r->counts.k_bytes, (l + 17) * 32.0);
  EXPECT_EQ(r->counts.v_bytes, 96.0);
  // The output is token 0's value row (dequantised; token 0's V is zero).
  EXPECT_EQ(r->out.At(1), 0.0f);
}

// ------------------------------------------------------- cycle model -----

TEST(TopickCyclesTest, NoPruningByHand) {
  const auto dev = Make(Spec("topick"));
  const auto h = dev->HeadCost(1024, 64, 1.0, 1.0, 1.0);
  // K: 12 bits x d x L = 98304 B; V: 1024 rows x 96 B = 98304 B.
  EXPECT_EQ(h.k_bytes, 12.0 / 8 * 64 * 1024);
  EXPECT_EQ(h.v_bytes, 98304.0);
  // K: max(98304 / 512 = 192, 3072 chunks / 16 lanes = 192, scoreboard
  // (1024/16) x 3 x 30 / 32 = 180) + 3 x 30 = 282; V: max(192, 64) + 30.
  EXPECT_EQ(h.k_cycles, 282.0);
  EXPECT_EQ(h.v_cycles, 222.0);
}

TEST(TopickCyclesTest, EverythingPrunedAfterChunkOneByHand) {
  const auto dev = Make(Spec("topick"));
  const auto h = dev->HeadCost(1024, 64, 0.0, 0.0, 0.0);
  EXPECT_EQ(h.k_bytes, 4.0 / 8 * 64 * 1024);  // 4 bits x d x L
  EXPECT_EQ(h.v_bytes, 0.0);
  EXPECT_EQ(h.k_cycles, 64.0 + 30.0);  // max(32768/512, 1024/16, 60) + 30
  EXPECT_EQ(h.v_cycles, 0.0);
}

TEST(TopickCyclesTest, BaselineEstimateByHand) {
  const auto dev = Make(Spec("baseline"));
  std::vector<AttentionSeq> seqs = {{1, 1023, 7}, {1, 511, 8}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 4, op.kv_heads = 4, op.d_head = 64;
  op.seqs = seqs;
  Cost c;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c, 1}).ok());
  // Baseline: K and V rows of 96 B for every token; per head K = V =
  // max(L x 96 / 512, L / 16) + 30 cycles: L = 1024: 222 each; L = 512:
  // 126 each. Four heads.
  EXPECT_EQ(c.dram_bytes, 4 * 2 * 96.0 * (1024 + 512));
  EXPECT_EQ(c.cycles, 4 * (2 * 222.0 + 2 * 126.0));
  EXPECT_DOUBLE_EQ(c.time_s, c.cycles / 500e6);
  EXPECT_DOUBLE_EQ(c.compute_energy_pj, 1.39707 * c.time_s * 1e12);
  EXPECT_DOUBLE_EQ(c.dram_energy_pj, c.dram_bytes * 8 * 3.9);
  // A prefill chunk is dense: new 4, past 0: 10 causal pairs; K + V = 768 B;
  // max(768 / 512, 2 x 10 x 64 / 1024) + 30 = 31.5 cycles per head.
  std::vector<AttentionSeq> prefill = {{4, 0, 9}};
  op.seqs = prefill;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c, 1}).ok());
  EXPECT_EQ(c.cycles, 4 * 31.5);
  EXPECT_EQ(c.dram_bytes, 4 * 768.0);
}

TEST(TopickCyclesTest, ClosedFormTracksTheCycleSimulation) {
  auto g = AttentionDataGenerator::Create({});
  const auto dev = Make(Spec("topick"));
  for (int64_t l : {256, 1024, 2048}) {
    TopickCounts sum;
    for (int i = 0; i < 8; ++i) {
      auto r = dev->RunKernel(*g->DecodeStep({i, 3, i}, l));
      ASSERT_TRUE(r.ok());
      sum += r->counts;
    }
    const double n = static_cast<double>(sum.tokens);
    const auto h = dev->HeadCost(l, 64, sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n,
                                 sum.v_fetched / n);
    const double model = h.k_cycles + h.v_cycles, sim = sum.sim_cycles / 8;
    std::printf("L %lld: closed form %.1f, simulated %.1f cycles per head\n",
                static_cast<long long>(l), model, sim);
    // The closed form charges the whole dependent-chunk tail (depth x
    // latency) after the throughput-bound part, so it bounds the simulation
    // from above, by at most 20% on this data.
    EXPECT_GE(model, sim) << "L " << l;
    EXPECT_LE(model, 1.2 * sim) << "L " << l;
    EXPECT_DOUBLE_EQ(h.k_bytes + h.v_bytes, (sum.k_bytes + sum.v_bytes) / 8);
  }
}

// ------------------------------------------------------------ fidelity ----

TEST(TopickFidelityTest, AnalyticTableIsThePapersRatios) {
  const auto dev = Make(Spec("topick"));
  auto f = dev->Fractions(-1, 1024, 64);
  ASSERT_TRUE(f.ok());
  // V 12.1x; K: (1 + 0.600 + 0.469) / 3 = 1 / 1.45.
  EXPECT_NEAR(1.0 / (*f)[2], 12.1, 1e-9);
  EXPECT_NEAR(3.0 / (1 + (*f)[0] + (*f)[1]), 1.45, 1e-3);
  const auto h = dev->HeadCost(1024, 64, (*f)[0], (*f)[1], (*f)[2]);
  const auto b = Make(Spec("baseline"))->HeadCost(1024, 64, 1, 1, 1);
  // Total access reduction: 2 / (1 / 1.45 + 1 / 12.1) = 2.59 (paper: 2.57).
  EXPECT_NEAR((b.k_bytes + b.v_bytes) / (h.k_bytes + h.v_bytes), 2.59, 0.01);
}

TEST(TopickFidelityTest, CalibratedProfileMatchesTheKernel) {
  auto spec = Spec("topick", PRUNE_FIDELITY_CALIBRATED);
  const auto t0 = std::chrono::steady_clock::now();
  const auto dev = Make(spec);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("topick calibration: %.3f s\n", s);
  EXPECT_LT(dev->calibration_s(), 2.0);  // ~0.1 s in Release; slack for Debug
  // Fresh instances (other requests) at two lengths, 16 heads each: the
  // mean kept fraction is within 25% of the profile, the K chunk fractions
  // within 0.1.
  auto g = AttentionDataGenerator::Create({});
  for (int64_t l : {512, 1448}) {
    TopickCounts sum;
    for (int i = 0; i < 16; ++i) {
      auto r = dev->RunKernel(*g->DecodeStep({500 + i, i % 24, i % 16}, l));
      sum += r->counts;
    }
    const double n = static_cast<double>(sum.tokens);
    auto f = dev->Fractions(-1, l, 64);
    ASSERT_TRUE(f.ok());
    std::printf("L %lld: calibrated kept %.4f c2 %.3f c3 %.3f; measured kept %.4f c2 %.3f c3 %.3f\n",
                static_cast<long long>(l), (*f)[2], (*f)[0], (*f)[1], sum.v_fetched / n,
                sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n);
    EXPECT_NEAR((*f)[2] / (sum.v_fetched / n), 1.0, 0.25);
    EXPECT_NEAR((*f)[0], sum.chunk_fetched[1] / n, 0.1);
    EXPECT_NEAR((*f)[1], sum.chunk_fetched[2] / n, 0.1);
  }
}

TEST(TopickFidelityTest, FullModeIsMemoisedAndEqualsTheKernel) {
  auto spec = Spec("topick", PRUNE_FIDELITY_FULL);
  auto* m = spec.mutable_topick()->mutable_model();
  m->set_layers(2);
  m->set_heads(3);
  m->set_d_head(64);
  const auto dev = Make(spec);
  std::vector<AttentionSeq> a = {{1, 299, 4}}, b = {{1, 299, 5}, {1, 99, 4}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 3, op.kv_heads = 3, op.d_head = 64;
  op.seqs = a;
  Cost c1, c2, c3;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c1, 1}).ok());
  op.seqs = b;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c2, 1}).ok());
  op.seqs = a;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c3, 1}).ok());
  EXPECT_EQ(c1.time_s, c3.time_s);
  EXPECT_EQ(c1.dram_bytes, c3.dram_bytes);
  EXPECT_EQ(c1.energy_pj(), c3.energy_pj());
  // The memo holds the mean over every (layer, head) of request 4 at L 300.
  auto g = AttentionDataGenerator::Create({});
  TopickCounts sum;
  for (int layer = 0; layer < 2; ++layer) {
    for (int head = 0; head < 3; ++head) sum += dev->RunKernel(*g->DecodeStep({4, layer, head}, 300))->counts;
  }
  const double n = static_cast<double>(sum.tokens);
  const auto h = dev->HeadCost(300, 64, sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n,
                               sum.v_fetched / n);
  EXPECT_DOUBLE_EQ(c1.dram_bytes, 3 * (h.k_bytes + h.v_bytes));
  // A sequence with no request id (a hypothetical batch, e.g. the SLO cap)
  // is costed from the calibrated profile FULL mode also keeps.
  std::vector<AttentionSeq> unknown = {{1, 299, -1}};
  op.seqs = unknown;
  ASSERT_TRUE(dev->Estimate({&op, 1}, {&c1, 1}).ok());
  auto profile = dev->Fractions(-1, 300, 64);
  ASSERT_TRUE(profile.ok());
  const auto hp = dev->HeadCost(300, 64, (*profile)[0], (*profile)[1], (*profile)[2]);
  EXPECT_DOUBLE_EQ(c1.dram_bytes, 3 * (hp.k_bytes + hp.v_bytes));
}

TEST(TopickFidelityTest, FullModeRunsOnCapturedNpyTensors) {
  // A "capture" of 2 layers x 2 heads, T = 64 positions, written as .npy in
  // the documented layout (here from the generator, request 5); a FULL
  // device reading that folder prices request 0's step at L = 40 exactly
  // as the kernel run on those tensors says.
  const std::string dir =
      (std::filesystem::temp_directory_path() / "servesim_topick_npy").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto g = AttentionDataGenerator::Create({});
  ASSERT_TRUE(g.ok());
  for (int layer = 0; layer < 2; ++layer) {
    for (int head = 0; head < 2; ++head) {
      auto step = g->DecodeStep({5, layer, head}, 64);
      ASSERT_TRUE(step.ok());
      Tensor q = Tensor::Zeros(ElementType::kFp32, {64, 64});
      std::vector<float> row(64);
      for (int t = 0; t < 64; ++t) {
        g->Query({5, layer, head}, t, row.data());
        for (int c = 0; c < 64; ++c) q.Set(t * 64 + c, row[c]);
      }
      Tensor k = step->k, v = step->v;
      k.shape = v.shape = {64, 64};
      const std::string base = dir + "/layer" + std::to_string(layer) + "_head" +
                               std::to_string(head) + "_";
      ASSERT_TRUE(WriteNpy(base + "q.npy", q).ok());
      ASSERT_TRUE(WriteNpy(base + "k.npy", k).ok());
      ASSERT_TRUE(WriteNpy(base + "v.npy", v).ok());
    }
  }
  auto spec = Spec("topick", PRUNE_FIDELITY_FULL);
  auto* ds = spec.mutable_topick();
  ds->mutable_data()->set_npy_dir(dir);
  ds->mutable_model()->set_layers(2);
  ds->mutable_model()->set_heads(2);
  ds->mutable_model()->set_d_head(64);
  for (int64_t l : {16, 32, 64}) ds->mutable_calibration()->add_lengths(l);
  const auto dev = Make(spec);
  ASSERT_NE(dev, nullptr);
  auto f = dev->Fractions(0, 40, 64);
  ASSERT_TRUE(f.ok()) << f.status();
  TopickCounts sum;
  for (int layer = 0; layer < 2; ++layer) {
    for (int head = 0; head < 2; ++head) {
      auto captured = LoadNpyHead(dir, layer, head);
      ASSERT_TRUE(captured.ok()) << captured.status();
      auto call = DecodeStepFromHead(*captured, 40);
      ASSERT_TRUE(call.ok());
      sum += dev->RunKernel(*call)->counts;
    }
  }
  const double n = static_cast<double>(sum.tokens);
  EXPECT_DOUBLE_EQ((*f)[0], sum.chunk_fetched[1] / n);
  EXPECT_DOUBLE_EQ((*f)[1], sum.chunk_fetched[2] / n);
  EXPECT_DOUBLE_EQ((*f)[2], sum.v_fetched / n);
  // Past the capture's 64 positions the device says so.
  EXPECT_EQ(dev->Fractions(0, 65, 64).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------ bad input --

TEST(TopickBadInputTest, BadSpecsNameTheField) {
  auto expect = [](servesim::v1::DeviceSpec spec, const char* field) {
    auto d = TopickDevice::Create(spec);
    ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(d.status().message().find(field), std::string::npos) << d.status();
  };
  auto s = Spec();
  s.mutable_topick()->mutable_topick()->set_threshold(1.5);
  expect(s, "threshold");
  s = Spec();
  s.mutable_topick()->mutable_topick()->clear_dram_latency_s();
  expect(s, "dram_latency_s");
  s = Spec();
  s.mutable_topick()->mutable_topick()->set_operand_bits(16);
  expect(s, "operand_bits");
  // 30-bit operands made d x qmax x 2^29 overflow int64 at d = 128.
  s = Spec();
  s.mutable_topick()->mutable_topick()->set_chunk_bits(10);
  s.mutable_topick()->mutable_topick()->set_operand_bits(30);
  EXPECT_EQ(TopickDevice::Create(s).status().message(),
            "topick device: chunk_bits = 10; expected in [1, 8]");
  s = Spec("baseline");
  s.mutable_topick()->mutable_topick()->set_on_demand_k(true);
  expect(s, "on_demand_k");
  expect(Spec("topick", PRUNE_FIDELITY_FULL), "model.layers");
  const auto dev = Make(Spec());
  Op gemm;
  Cost c;
  EXPECT_EQ(dev->Estimate({&gemm, 1}, {&c, 1}).code(), absl::StatusCode::kInvalidArgument);
  AttentionCall prefill;
  prefill.q = Tensor::Zeros(ElementType::kFp32, {1, 2, 32});
  prefill.k = prefill.v = Tensor::Zeros(ElementType::kFp32, {1, 4, 32});
  EXPECT_EQ(dev->Execute(prefill).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TopickBadInputTest, TimingFiguresHaveLimits) {
  // Each of these reached the cycle kernel before: ceil(latency x clock)
  // past int64 (undefined), NaN from inf x 0, or memory so slow that a head
  // takes ~10^14 simulated cycles, one loop turn each.
  auto message = [](void (*edit)(servesim::v1::TopickSpec*)) {
    auto s = Spec();
    edit(s.mutable_topick()->mutable_topick());
    auto d = TopickDevice::Create(s);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(d.status().message());
  };
  EXPECT_EQ(message([](auto* t) { t->set_clock_hz(std::numeric_limits<double>::infinity()); }),
            "topick device: clock_hz = inf; expected in (0, 1e+11]");
  EXPECT_EQ(message([](auto* t) { t->set_dram_latency_s(1e11); }),
            "topick device: dram_latency_s = 1e+11; expected in [0, 0.001]");
  EXPECT_EQ(message([](auto* t) { t->set_channel_bandwidth_bytes_per_s(1e-300); }),
            "topick device: channel_bandwidth_bytes_per_s = 1e-300; expected at least "
            "clock_hz / (16 x hbm_channels) = 3.90625e+06 (1/16 byte per cycle); "
            "hbm_channels x channel_bandwidth_bytes_per_s / clock_hz = 1.6e-308");
  // At the limits the device is made: 1e11 Hz with the preset's 256 GB/s
  // is 2.56 bytes per cycle; 1 ms of latency is 10^8 cycles.
  auto s = Spec();
  s.mutable_topick()->mutable_topick()->set_clock_hz(1e11);
  s.mutable_topick()->mutable_topick()->set_dram_latency_s(1e-3);
  EXPECT_TRUE(TopickDevice::Create(s).ok());
  s = Spec();
  s.mutable_topick()->mutable_topick()->set_channel_bandwidth_bytes_per_s(500e6 / 16 / 8);
  EXPECT_TRUE(TopickDevice::Create(s).ok());
}

// --------------------------------------------------------- measurement ----

// GPT-2 medium dimensions (24 layers x 16 heads, d_head 64) at L = 1024,
// one request: V pruning ratio, DRAM-access reduction and attention speedup
// against the baseline (paper: 12.1x, 2.57x, 2.28x for ToPick).
TEST(TopickMeasureTest, Gpt2MediumAtL1024) {
  auto g = AttentionDataGenerator::Create({});
  for (const char* preset : {"topick", "topick_0.3"}) {
    const auto dev = Make(Spec(preset));
    TopickCounts sum;
    for (int layer = 0; layer < 24; ++layer) {
      for (int head = 0; head < 16; ++head) sum += dev->RunKernel(*g->DecodeStep({0, layer, head}, 1024))->counts;
    }
    const double n = static_cast<double>(sum.tokens);
    const auto h = dev->HeadCost(1024, 64, sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n,
                                 sum.v_fetched / n);
    const auto b = Make(Spec("baseline"))->HeadCost(1024, 64, 1, 1, 1);
    const double v_ratio = n / static_cast<double>(sum.v_fetched);
    const double k_red = 3.0 * n / static_cast<double>(sum.chunk_fetched[0] + sum.chunk_fetched[1] + sum.chunk_fetched[2]);
    const double access = (b.k_bytes + b.v_bytes) / (h.k_bytes + h.v_bytes);
    const double speedup = (b.k_cycles + b.v_cycles) / (h.k_cycles + h.v_cycles);
    std::printf("%s: V pruning %.1fx, K access %.2fx, DRAM access %.2fx, speedup %.2fx "
                "(simulated %.2fx), energy %.2fx\n",
                preset, v_ratio, k_red, access, speedup,
                (b.k_cycles + b.v_cycles) * 384 / sum.sim_cycles,
                ((b.k_cycles + b.v_cycles) * 1.39707 / 500e6 * 1e12 + (b.k_bytes + b.v_bytes) * 8 * 3.9) /
                    ((h.k_cycles + h.v_cycles) * dev->PowerW() / 500e6 * 1e12 +
                     (h.k_bytes + h.v_bytes) * 8 * 3.9));
    EXPECT_GT(v_ratio, 2.0);
    EXPECT_GT(access, 1.3);
    EXPECT_GT(speedup, 1.0);
  }
}

}  // namespace
}  // namespace servesim::devices
