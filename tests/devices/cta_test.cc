// CTA device: LSH and clustering by hand (the slides' example), w -> 0
// equals exact attention, the operation counts equal the slides' formulas,
// the cycle model by hand, the presets' measured RL/RA, the fidelity modes,
// bad specs.
//
// Figures (cta_0 preset): a 64 x 64 systolic array at 1 GHz, 256 B per
// cycle (8 x 32 GB/s), 60 cycles of DRAM latency, 16-bit operands, 8
// hashes per level, d_model 1024 for GPT-2 medium (16 heads x 64).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "devices/attention_data.h"
#include "devices/cta/cta_device.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

using servesim::v1::PRUNE_FIDELITY_ANALYTIC;
using servesim::v1::PRUNE_FIDELITY_CALIBRATED;
using servesim::v1::PRUNE_FIDELITY_FULL;

servesim::v1::DeviceSpec Spec(const char* preset = "cta_0",
                              servesim::v1::PruneFidelity fidelity = PRUNE_FIDELITY_ANALYTIC) {
  servesim::v1::DeviceSpec spec;
  auto p = CtaPreset(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  *spec.mutable_cta()->mutable_cta() = *p;
  spec.mutable_cta()->set_fidelity(fidelity);
  auto* m = spec.mutable_cta()->mutable_model();
  m->set_layers(24);
  m->set_heads(16);
  m->set_d_head(64);
  return spec;
}

std::unique_ptr<CtaDevice> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = CtaDevice::Create(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  return std::unique_ptr<CtaDevice>(static_cast<CtaDevice*>(d->release()));
}

// An LSH family set by hand: directions and offsets as given.
CtaLsh HandLsh(int64_t dim, std::vector<std::vector<double>> a, std::vector<double> b, double w) {
  CtaLsh l;
  l.dim = dim;
  l.hashes = static_cast<int>(a.size());
  l.width = w;
  for (const auto& row : a) l.a.insert(l.a.end(), row.begin(), row.end());
  l.b = std::move(b);
  return l;
}

// The slides' example X (6 tokens x 4).
const std::vector<double> kSlidesX = {2,  1, 2, 3, 4,  1, 2, 3, 4,  1, 2, 3,
                                      10, 2, 2, 3, 12, 2, 2, 3, 12, 2, 2, 3};

TEST(CtaTest, LshHashesByHand) {
  // H = floor((A x + B) / w) with A = [e0; e1], B = (1, 0), w = 4:
  // x = (2, 1, ...) -> (floor(3/4), floor(1/4)) = (0, 0); (10, 2) -> (2, 0);
  // (12, 2) -> (3, 0); (-5, 9) -> (floor(-4/4), floor(9/4)) = (-1, 2).
  const CtaLsh l = HandLsh(2, {{1, 0}, {0, 1}}, {1, 0}, 4);
  auto keys = [&](double x0, double x1) {
    const double x[2] = {x0, x1};
    double p[2];
    l.Project(x, 1.0, p);
    return std::vector<int64_t>{l.Key(p[0], 0), l.Key(p[1], 1)};
  };
  EXPECT_EQ(keys(2, 1), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(keys(10, 2), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(keys(12, 2), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(keys(-5, 9), (std::vector<int64_t>{-1, 2}));
  // Clusters in order of first appearance.
  int64_t k = 0;
  const auto ct = CtaClusterKeys({5, 5, 7, 5, 7, 9}, 6, 1, &k);
  EXPECT_EQ(k, 3);
  EXPECT_EQ(ct, (std::vector<int32_t>{0, 0, 1, 0, 1, 2}));
  // Made directions are unit length and offsets in [0, w).
  const CtaLsh r = CtaLsh::Make(16, 4, 0.5, 7, "t");
  for (int i = 0; i < 4; ++i) {
    double n = 0;
    for (int c = 0; c < 16; ++c) n += r.a[i * 16 + c] * r.a[i * 16 + c];
    EXPECT_NEAR(n, 1.0, 1e-12);
    EXPECT_GE(r.b[i], 0);
    EXPECT_LT(r.b[i], 0.5);
  }
}

TEST(CtaTest, TwoLevelCompressionReproducesTheSlidesExample) {
  // Level 1 on x0 with w = 8: (2, 4, 4) -> 0, (10, 12, 12) -> 1; centroids
  // (10/3, 1, 2, 3) and (34/3, 2, 2, 3). Residuals on x0: -4/3, 2/3, 2/3,
  // -4/3, 2/3, 2/3; level 2 with w = 1, b = 0.5: floor(-5/6) = -1,
  // floor(7/6) = 1: CT2 = 0, 1, 1, 0, 1, 1 -- the slides' CT1/CT2 table
  // (1,1 1,2 1,2 2,1 2,2 2,2) -- and c1 + c2 reconstructs X exactly.
  const CtaLsh l1 = HandLsh(4, {{1, 0, 0, 0}}, {0}, 8);
  const CtaLsh l2 = HandLsh(4, {{1, 0, 0, 0}}, {0.5}, 1);
  const CtaCompression c = CtaCompress(kSlidesX.data(), 6, 4, 1.0, l1, &l2);
  EXPECT_EQ(c.k1, 2);
  EXPECT_EQ(c.k2, 2);
  EXPECT_EQ(c.ct1, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(c.ct2, (std::vector<int32_t>{0, 1, 1, 0, 1, 1}));
  EXPECT_NEAR(c.c1[0], 10.0 / 3, 1e-12);
  EXPECT_NEAR(c.c1[4], 34.0 / 3, 1e-12);
  EXPECT_NEAR(c.c2[0], -4.0 / 3, 1e-12);
  EXPECT_NEAR(c.c2[4], 2.0 / 3, 1e-12);
  for (int j = 0; j < 6; ++j) {
    for (int e = 0; e < 4; ++e) {
      EXPECT_NEAR(c.c1[c.ct1[j] * 4 + e] + c.c2[c.ct2[j] * 4 + e], kSlidesX[j * 4 + e], 1e-12);
    }
  }
  // Attention on the compressed tokens (identity projections, X as Q, K
  // and V, queries 1-level with w = 8: two query clusters): the key side is
  // exact, so each query cluster's output is exact attention of its
  // centroid query; PAG does k0 n = 12 exps, scores and output k0 (k1 + k2)
  // d = 2 x 4 x 4 = 32 MACs each (dense: 36 x 4 = 144).
  const CtaCompression cq = CtaCompress(kSlidesX.data(), 6, 4, 1.0, l1, nullptr);
  std::vector<double> kbar(c.c1);
  kbar.insert(kbar.end(), c.c2.begin(), c.c2.end());
  std::vector<double> out(6 * 4);
  CtaOpCounts counts;
  const double scale = 0.1;
  CtaCoreAttention(cq.c1.data(), cq.k1, kbar.data(), kbar.data(), c.k1, c.k2, cq.ct1, c.ct1, c.ct2,
                   4, scale, /*causal=*/false, out.data(), &counts);
  EXPECT_EQ(counts.pag_exps, 12);
  EXPECT_EQ(counts.score_macs, 32);
  EXPECT_EQ(counts.output_macs, 32);
  EXPECT_EQ(counts.dense_score_macs, 144);
  for (int i = 0; i < 6; ++i) {
    const double* q = cq.c1.data() + cq.ct1[i] * 4;
    std::vector<double> s(6), o(4, 0.0);
    double m = -1e300, sum = 0;
    for (int j = 0; j < 6; ++j) {
      s[j] = 0;
      for (int e = 0; e < 4; ++e) s[j] += q[e] * kSlidesX[j * 4 + e] * scale;
      m = std::max(m, s[j]);
    }
    for (int j = 0; j < 6; ++j) {
      const double p = std::exp(s[j] - m);
      sum += p;
      for (int e = 0; e < 4; ++e) o[e] += p * kSlidesX[j * 4 + e];
    }
    for (int e = 0; e < 4; ++e) EXPECT_NEAR(out[i * 4 + e], o[e] / sum, 1e-9) << i << "," << e;
  }
}

AttentionCall RandomCall(int64_t heads, int64_t kv_heads, int64_t nq, int64_t nkv, int64_t d,
                         uint64_t seed) {
  Rng rng(seed, "cta.test");
  AttentionCall c;
  c.q = Tensor::Zeros(ElementType::kFp32, {heads, nq, d});
  c.k = Tensor::Zeros(ElementType::kFp32, {kv_heads, nkv, d});
  c.v = Tensor::Zeros(ElementType::kFp32, {kv_heads, nkv, d});
  for (Tensor* t : {&c.q, &c.k, &c.v}) {
    for (int64_t i = 0; i < t->NumElements(); ++i) t->Set(i, static_cast<float>(rng.Normal()));
  }
  return c;
}

TEST(CtaTest, WidthToZeroEqualsExactAttention) {
  // `dense` (compress off: w -> 0): every distinct token is its own cluster,
  // every residual 0, so the output is exact attention: decode, causal
  // prefill chunks, GQA, and data from the attention generator.
  auto dev = Make(Spec("dense"));
  ASSERT_NE(dev, nullptr);
  auto gen = AttentionDataGenerator::Create({});
  ASSERT_TRUE(gen.ok());
  std::vector<AttentionCall> calls = {RandomCall(4, 4, 1, 50, 32, 1),
                                      RandomCall(4, 2, 7, 30, 32, 2),
                                      RandomCall(2, 1, 16, 16, 24, 3)};
  auto step = gen->DecodeStep({3, 5, 1}, 300);
  ASSERT_TRUE(step.ok());
  calls.push_back(*step);
  for (size_t i = 0; i < calls.size(); ++i) {
    auto got = dev->RunKernel(calls[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    auto want = ExactAttention(calls[i]);
    ASSERT_TRUE(want.ok());
    const int64_t kv_heads = calls[i].k.shape[0], nkv = calls[i].k.shape[1];
    EXPECT_EQ(got->second.k1, kv_heads * nkv) << i;
    EXPECT_EQ(got->second.k2, kv_heads) << i;  // one zero-residual cluster
    for (int64_t e = 0; e < want->out.NumElements(); ++e) {
      ASSERT_NEAR(got->first.out.At(e), want->out.At(e), 2e-5) << i << " @" << e;
    }
  }
  // The X-level layer (GPT-2-like tokens, projections, exact attention
  // computed beside it): relative error at rounding level, k0 = k1 = n
  // distinct tokens, k2 = 1.
  const CtaTokenGenerator tokens(1, 128, {});
  const int64_t n = 48, D = 128, H = 2, dh = 32;
  std::vector<double> x(n * D), wq, wk, wv, a, b, c;
  for (int64_t j = 0; j < n; ++j) tokens.Token(0, 0, j, x.data() + j * D);
  for (int64_t h = 0; h < H; ++h) {
    tokens.HeadWeights(0, h, dh, &a, &b, &c);
    wq.insert(wq.end(), a.begin(), a.end());
    wk.insert(wk.end(), b.begin(), b.end());
    wv.insert(wv.end(), c.begin(), c.end());
  }
  const CtaHashes hashes = MakeCtaHashes(dev->spec(), D, 1);
  for (bool causal : {false, true}) {
    const CtaLayerResult r = CtaLayer(hashes, x, n, D, wq, wk, wv, H, dh, causal);
    EXPECT_LT(r.relative_error, 1e-12) << causal;
    EXPECT_EQ(r.counts.k2, 1);
    EXPECT_EQ(r.counts.k0, r.counts.k1);
  }
}

TEST(CtaTest, OperationCountsEqualTheSlidesFormulas) {
  // n d^2 -> k0 d^2 (queries) and (k1 + k2) d^2 (keys, values); n^2 d ->
  // k0 (k1 + k2) d for the scores and the output; n^2 exps -> k0 n. With
  // d^2 = d_model x d_head per head here.
  const int64_t n = 128, D = 256, H = 2, dh = 32;
  auto spec = Spec("cta_1");
  spec.mutable_cta()->set_d_model(static_cast<int32_t>(D));
  const CtaTokenGenerator tokens(1, D, {});
  std::vector<double> x(n * D), wq, wk, wv, a, b, c;
  for (int64_t j = 0; j < n; ++j) tokens.Token(9, 2, j, x.data() + j * D);
  for (int64_t h = 0; h < H; ++h) {
    tokens.HeadWeights(2, h, dh, &a, &b, &c);
    wq.insert(wq.end(), a.begin(), a.end());
    wk.insert(wk.end(), b.begin(), b.end());
    wv.insert(wv.end(), c.begin(), c.end());
  }
  const CtaHashes hashes = MakeCtaHashes(spec.cta().cta(), D, 1);
  const CtaLayerResult r = CtaLayer(hashes, x, n, D, wq, wk, wv, H, dh, /*causal=*/false);
  const CtaOpCounts& k = r.counts;
  ASSERT_GT(k.k0, 1);
  ASSERT_LT(k.k0, n);  // compression happened
  ASSERT_LT(k.k1 + k.k2, n);
  const double kk = static_cast<double>(k.k1 + k.k2);
  EXPECT_EQ(k.linear_macs, (k.k0 + 2 * kk) * D * dh * H);
  EXPECT_EQ(k.dense_linear_macs, 3.0 * n * D * dh * H);
  EXPECT_EQ(k.score_macs, k.k0 * kk * dh * H);
  EXPECT_EQ(k.output_macs, k.k0 * kk * dh * H);
  EXPECT_EQ(k.dense_score_macs, 1.0 * n * n * dh * H);
  EXPECT_EQ(k.pag_exps, 1.0 * k.k0 * n * H);
  EXPECT_EQ(k.dense_exps, 1.0 * n * n * H);
  EXPECT_DOUBLE_EQ(k.rl(), (k.k0 + 2 * kk) / (3.0 * n));
  EXPECT_DOUBLE_EQ(k.ra(), k.k0 * kk / (1.0 * n * n));
  // Causal: one AP row per query, k0 (k1 + k2) d scores, n (k1 + k2) d
  // output, at most k0 n exps.
  const CtaLayerResult rc = CtaLayer(hashes, x, n, D, wq, wk, wv, H, dh, /*causal=*/true);
  EXPECT_EQ(rc.counts.score_macs, k.score_macs);
  EXPECT_EQ(rc.counts.output_macs, n * kk * dh * H);
  EXPECT_LE(rc.counts.pag_exps, k.pag_exps);
  EXPECT_EQ(rc.counts.dense_score_macs, n * (n + 1) / 2.0 * dh * H);
}

TEST(CtaTest, CycleModelByHand) {
  auto dev = Make(Spec("cta_0"));
  ASSERT_NE(dev, nullptr);
  EXPECT_DOUBLE_EQ(dev->BytesPerCycle(), 256);
  EXPECT_EQ(dev->d_model(), 1024);
  // ceil(100 / 64) x ceil(3 / 64) x 64 + 64 + 64 = 256.
  EXPECT_DOUBLE_EQ(dev->GemmCycles(100, 3, 64), 256);
  EXPECT_DOUBLE_EQ(dev->GemmCycles(0, 3, 64), 0);
  // Decode, 16 heads of 64, L = 1024, k1 + k2 = 600:
  //  hash   2 x (1 x 1 x 1024 + 128)              = 2304
  //  CIM    2
  //  CAG    ceil((2 x 2 x 16 x 64 + 8) / 64)       = 65
  //  scores 16 x (ceil(600/64) x 1 x 64 + 128)     = 16 x 768 = 12288
  //  PAG    16 x 1024 / 16                         = 1024
  //  output 16 x (1 x 1 x 600 + 128)               = 11648
  //  compute 27331; bytes 16 x (2 x 600 x 64 + 4 x 64) x 2 + 2 x 1024 x 2
  //  = 2469888 -> 9648 cycles; total 27331 + 60 = 27391.
  const CtaCycles c = dev->SeqCycles(1, 1023, 16, 64, 1, 600);
  EXPECT_DOUBLE_EQ(c.hash, 2304);
  EXPECT_DOUBLE_EQ(c.cim, 2);
  EXPECT_DOUBLE_EQ(c.cag, 65);
  EXPECT_DOUBLE_EQ(c.score, 12288);
  EXPECT_DOUBLE_EQ(c.pag, 1024);
  EXPECT_DOUBLE_EQ(c.output, 11648);
  EXPECT_DOUBLE_EQ(c.bytes, 2469888);
  EXPECT_DOUBLE_EQ(c.memory, 9648);
  EXPECT_DOUBLE_EQ(c.total, 27391);
  // Prefill of 512 tokens, 16 heads of 64, k0 = 300, k1 + k2 = 320:
  //  hash   ceil(512/64) x ceil(16/64) x 1024 + 128 + 8 x 1 x 1024 + 128 = 16640
  //  CIM    1536; CAG 4 x 512 x 1024 / 64 = 32768
  //  linear 16 x 5 x 1024 + 128 + 32 x 5 x 1024 + 128 = 246016
  //  scores 16 x (5 x 5 x 64 + 128) = 27648; PAG 16 x 300 x 512 / 16 = 153600
  //  output 16 x (1 x 8 x 320 + 128) = 43008
  const CtaCycles p = dev->SeqCycles(512, 0, 16, 64, 300, 320);
  EXPECT_DOUBLE_EQ(p.hash, 16640);
  EXPECT_DOUBLE_EQ(p.cim, 1536);
  EXPECT_DOUBLE_EQ(p.cag, 32768);
  EXPECT_DOUBLE_EQ(p.linear, 246016);
  EXPECT_DOUBLE_EQ(p.score, 27648);
  EXPECT_DOUBLE_EQ(p.pag, 153600);
  EXPECT_DOUBLE_EQ(p.output, 43008);
  EXPECT_DOUBLE_EQ(p.total, 16640 + 1536 + 32768 + 246016 + 27648 + 153600 + 43008 + 60.0);
  // Estimate: ANALYTIC cta_0 at L = 1024 uses (k1 + k2) = b L with b from
  // the slides' RL/RA; 16 heads split over the op.
  const auto ab = CtaFractionsFromReductions(0.583, 0.352);
  std::vector<AttentionSeq> seqs = {{1, 1023, 0}};
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = Stage::kAttention;
  op.heads = 16;
  op.kv_heads = 16;
  op.d_head = 64;
  op.seqs = seqs;
  std::vector<Cost> costs(1);
  ASSERT_TRUE(dev->Estimate({&op, 1}, absl::MakeSpan(costs)).ok());
  const CtaCycles e = dev->SeqCycles(1, 1023, 16, 64, 1, ab[1] * 1024);
  EXPECT_DOUBLE_EQ(costs[0].cycles, e.total);
  EXPECT_DOUBLE_EQ(costs[0].time_s, e.total / 1e9);
  EXPECT_DOUBLE_EQ(costs[0].dram_bytes, e.bytes);
  EXPECT_DOUBLE_EQ(costs[0].dram_energy_pj, e.bytes * 8 * 3.9);
  // Compression reads fewer bytes and takes fewer cycles than `dense`.
  auto dense = Make(Spec("dense"));
  std::vector<Cost> dc(1);
  ASSERT_TRUE(dense->Estimate({&op, 1}, absl::MakeSpan(dc)).ok());
  EXPECT_LT(costs[0].dram_bytes, 0.7 * dc[0].dram_bytes);
  EXPECT_LT(costs[0].cycles, dc[0].cycles);
}

TEST(CtaTest, AnalyticTablesAreTheSlidesReductions) {
  for (auto [name, rl, ra] : {std::tuple<const char*, double, double>{"cta_0", 0.583, 0.352},
                              {"cta_0.5", 0.522, 0.275},
                              {"cta_1", 0.444, 0.184}}) {
    auto f = CtaAnalyticFractions(name);
    ASSERT_TRUE(f.ok());
    EXPECT_NEAR(((*f)[0] + 2 * (*f)[1]) / 3, rl, 1e-12) << name;
    EXPECT_NEAR((*f)[0] * (*f)[1], ra, 1e-12) << name;
    EXPECT_GT((*f)[0], 0);
    EXPECT_LE((*f)[0], 1);
    EXPECT_LE((*f)[1], 1);
    auto dev = Make(Spec(name));
    const DeviceDescription d = dev->Describe();
    auto param = [&](const std::string& k) {
      for (const auto& [pk, v] : d.parameters) {
        if (pk == k) return v;
      }
      return -1.0;
    };
    EXPECT_NEAR(param("rl"), rl, 1e-12);
    EXPECT_NEAR(param("ra"), ra, 1e-12);
    EXPECT_NEAR(param("kv_compression_ratio"), 1 / (*f)[1], 1e-12);
  }
  // CTA-0: b = (1.749 + sqrt(1.749^2 - 8 x 0.352)) / 4 = (1.749 + 0.492951) / 4
  // = 0.560488, a = 1.749 - 2b = 0.628024.
  const auto ab = CtaFractionsFromReductions(0.583, 0.352);
  EXPECT_NEAR(ab[1], (1.749 + std::sqrt(1.749 * 1.749 - 8 * 0.352)) / 4, 1e-12);
  EXPECT_NEAR(ab[1], 0.560488, 1e-6);
  EXPECT_NEAR(ab[0], 0.628024, 1e-6);
  EXPECT_FALSE(CtaAnalyticFractions("nope").ok());
}

double Param(const DeviceDescription& d, const std::string& k) {
  for (const auto& [pk, v] : d.parameters) {
    if (pk == k) return v;
  }
  ADD_FAILURE() << "no parameter " << k;
  return -1;
}

TEST(CtaTest, PresetsMeasuredReductionsAndError) {
  // CALIBRATED at n = 1024 (4 requests, one layer each, GPT-2 medium
  // d_model 1024): the measured RL/RA next to the slides' (CTA-0 58.3% /
  // 35.2%, CTA-0.5 52.2% / 27.5%, CTA-1 44.4% / 18.4%), and the relative
  // attention-output error of a whole layer (n = 256, 2 heads of 64,
  // non-causal as the slides) against exact attention.
  struct Want {
    const char* preset;
    double rl, ra, err;
  };
  const Want wants[] = {{"cta_0", 0.5734, 0.3269, 0.0353},
                        {"cta_0.5", 0.5251, 0.2744, 0.0387},
                        {"cta_1", 0.4541, 0.1848, 0.2740},
                        // dense: k0 = k1 = n, k2 = 1 (the zero residual):
                        // RL = (1 + 2 (1 + 1/1024)) / 3, RA = 1 + 1/1024.
                        {"dense", 1 + 2.0 / 3072, 1 + 1.0 / 1024, 0.0}};
  double last_err = -1, last_rl = 2;
  for (const Want& w : wants) {
    auto spec = Spec(w.preset, PRUNE_FIDELITY_CALIBRATED);
    spec.mutable_cta()->mutable_calibration()->add_lengths(1024);
    auto dev = Make(spec);
    ASSERT_NE(dev, nullptr);
    const DeviceDescription d = dev->Describe();
    EXPECT_NEAR(Param(d, "rl"), w.rl, 5e-5) << w.preset;
    EXPECT_NEAR(Param(d, "ra"), w.ra, 5e-5) << w.preset;
    EXPECT_NEAR(Param(d, "kv1_fraction") + Param(d, "kv2_fraction"), Param(d, "kv_fraction"),
                1e-12);
    const int64_t n = 256, D = 1024, H = 2, dh = 64;
    std::vector<double> x(n * D), wq, wk, wv, a, b, c;
    for (int64_t j = 0; j < n; ++j) dev->tokens().Token(5, 3, j, x.data() + j * D);
    for (int64_t h = 0; h < H; ++h) {
      dev->tokens().HeadWeights(3, h, dh, &a, &b, &c);
      wq.insert(wq.end(), a.begin(), a.end());
      wk.insert(wk.end(), b.begin(), b.end());
      wv.insert(wv.end(), c.begin(), c.end());
    }
    const CtaLayerResult r = CtaLayer(dev->hashes(), x, n, D, wq, wk, wv, H, dh, false);
    // The README's table comes from this line.
    std::printf("%s: RL %.4f RA %.4f kv_fraction %.4f error %.4f\n", w.preset, Param(d, "rl"),
                Param(d, "ra"), Param(d, "kv_fraction"), r.relative_error);
    EXPECT_NEAR(r.relative_error, w.err, 5e-4) << w.preset;
    if (std::string(w.preset) != "dense") {
      EXPECT_GT(r.relative_error, last_err) << w.preset;  // more compression, more error
      EXPECT_LT(Param(d, "rl"), last_rl) << w.preset;
      last_err = r.relative_error;
      last_rl = Param(d, "rl");
    }
  }
}

TEST(CtaTest, PrefillAndDecodeSpeedupsOverDense) {
  // The device's two roles on GPT-2 medium (16 heads of 64, d_model 1024),
  // CALIBRATED at n = 512: a 512-token prefill (compressed QKV projection +
  // compressed causal attention) and a decode step at L = 512 (reads k1 + k2
  // rows per head), each against `dense` on the same hardware.
  struct Want {
    const char* preset;
    double prefill, decode;
  };
  const Want wants[] = {{"cta_0", 1.550, 1.332}, {"cta_0.5", 1.702, 1.437}, {"cta_1", 1.906, 1.450}};
  auto cost = [](const CtaDevice& dev, int64_t new_tokens, int64_t past) {
    std::vector<AttentionSeq> seqs = {{new_tokens, past, -1}};
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = 16;
    op.kv_heads = 16;
    op.d_head = 64;
    op.seqs = seqs;
    std::vector<Cost> c(1);
    EXPECT_TRUE(dev.Estimate({&op, 1}, absl::MakeSpan(c)).ok());
    return c[0];
  };
  auto make = [](const char* preset) {
    auto spec = Spec(preset, PRUNE_FIDELITY_CALIBRATED);
    spec.mutable_cta()->mutable_calibration()->add_lengths(512);
    return Make(spec);
  };
  auto dense = make("dense");
  const Cost dp = cost(*dense, 512, 0), dd = cost(*dense, 1, 511);
  double last_p = 0, last_d = 0;
  for (const Want& w : wants) {
    auto dev = make(w.preset);
    const Cost p = cost(*dev, 512, 0), d = cost(*dev, 1, 511);
    std::printf("%s: prefill %.3fx (%.1f vs %.1f us, energy %.2fx), decode %.3fx (DRAM %.2fx)\n",
                w.preset, dp.time_s / p.time_s, p.time_s * 1e6, dp.time_s * 1e6,
                dp.energy_pj() / p.energy_pj(), dd.time_s / d.time_s,
                dd.dram_bytes / d.dram_bytes);
    EXPECT_NEAR(dp.time_s / p.time_s, w.prefill, 0.005) << w.preset;
    EXPECT_NEAR(dd.time_s / d.time_s, w.decode, 0.005) << w.preset;
    EXPECT_GT(dp.time_s / p.time_s, last_p) << w.preset;
    EXPECT_GT(dd.time_s / d.time_s, last_d) << w.preset;
    last_p = dp.time_s / p.time_s;
    last_d = dd.time_s / d.time_s;
  }
  EXPECT_GT(last_p, 1.5);
  EXPECT_GT(last_d, 1.2);
}

TEST(CtaTest, FidelityModes) {
  // A small model: 2 layers, d_model 64.
  auto spec = Spec("cta_0.5", PRUNE_FIDELITY_FULL);
  auto* m = spec.mutable_cta()->mutable_model();
  m->set_layers(2);
  m->set_heads(2);
  m->set_d_head(32);
  auto full = Make(spec);
  ASSERT_NE(full, nullptr);
  ASSERT_EQ(full->d_model(), 64);
  // FULL: the mean over layers of (k1 + k2) / L for the request's own
  // tokens, the same counts CtaCompress gives on them (bit for bit), at
  // growing and then smaller L (the kept projections are sliced).
  for (int64_t l : {40, 41, 90, 12}) {
    auto f = full->Fractions(7, l);
    ASSERT_TRUE(f.ok()) << f.status();
    double kk = 0, k2 = 0;
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<double> x(l * 64);
      for (int64_t j = 0; j < l; ++j) full->tokens().Token(7, layer, j, x.data() + j * 64);
      const CtaCompression c =
          CtaCompress(x.data(), l, 64, 1.0, full->hashes().kv1, &full->hashes().kv2);
      kk += static_cast<double>(c.k1 + c.k2);
      k2 += static_cast<double>(c.k2);
    }
    EXPECT_DOUBLE_EQ((*f)[1], kk / (2.0 * l)) << l;
    EXPECT_DOUBLE_EQ((*f)[2], k2 / (2.0 * l)) << l;
    EXPECT_DOUBLE_EQ((*f)[0], 1.0 / l);
    // Estimate costs exactly those counts.
    std::vector<AttentionSeq> seqs = {{1, l - 1, 7}};
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = 2;
    op.kv_heads = 2;
    op.d_head = 32;
    op.seqs = seqs;
    std::vector<Cost> costs(1);
    ASSERT_TRUE(full->Estimate({&op, 1}, absl::MakeSpan(costs)).ok());
    EXPECT_DOUBLE_EQ(costs[0].cycles,
                     full->SeqCycles(1, l - 1, 2, 32, 1, std::max(1.0, (*f)[1] * l)).total);
  }
  // A cap of 1 byte keeps only the request just used: the others are
  // rebuilt when asked again, with the same fractions.
  auto capped_spec = spec;
  capped_spec.mutable_cta()->set_full_cache_bytes(1);
  auto capped = Make(capped_spec);
  for (auto [r, l] : {std::pair<int64_t, int64_t>{7, 30}, {7, 31}, {8, 30}, {7, 32}}) {
    EXPECT_EQ(*capped->Fractions(r, l), *full->Fractions(r, l)) << r << " " << l;
  }
  EXPECT_EQ(capped->full_builds(), 3);  // 7, 8, 7 again
  // Request 7 alone, rebuilt to 32 tokens in one step: 2 layers x 32 tokens
  // x 8 hashes x (8-byte key + 8-byte projection).
  EXPECT_EQ(capped->full_bytes(), 2 * 32 * 8 * (8 + 8));
  EXPECT_EQ(full->full_builds(), 2);  // requests 7 and 8, never dropped
  // Different requests have different tokens.
  EXPECT_NE((*full->Fractions(8, 90))[1], (*full->Fractions(7, 90))[1]);
  // FULL's Describe reports the mean over the steps run.
  EXPECT_GT(Param(full->Describe(), "kv_compression_ratio"), 1.0);
  // CALIBRATED: fewer distinct tokens per token in longer contexts (Heaps'
  // law of the Zipf-distributed types).
  auto cal = Make(Spec("cta_0", PRUNE_FIDELITY_CALIBRATED));
  ASSERT_NE(cal, nullptr);
  const auto& p = cal->profile();
  ASSERT_EQ(p.lengths, (std::vector<double>{128, 256, 512, 1024, 2048}));
  for (size_t i = 1; i < p.rows.size(); ++i) {
    EXPECT_LT(p.rows[i][1], p.rows[i - 1][1]) << p.lengths[i];
    EXPECT_LT(p.rows[i][0], p.rows[i - 1][0]) << p.lengths[i];
  }
  // A sequence without a request id is costed from the profile in FULL.
  auto f = full->Fractions(-1, 100);
  ASSERT_TRUE(f.ok());
  EXPECT_DOUBLE_EQ((*f)[1], full->profile().Eval(100)[1]);
  // ANALYTIC is constant in n.
  auto an = Make(Spec("cta_1"));
  EXPECT_DOUBLE_EQ((*an->Fractions(3, 100))[1], (*an->Fractions(3, 3000))[1]);
}

// FULL builds its CALIBRATED profile only when a prefill chunk needs it:
// decode steps and the description before them do not, and the profile
// then built is the one a CALIBRATED device builds at creation.
TEST(CtaTest, FullBuildsItsProfileOnlyWhenAPrefillNeedsIt) {
  auto small = [](servesim::v1::PruneFidelity f) {
    auto spec = Spec("cta_0.5", f);
    auto* m = spec.mutable_cta()->mutable_model();
    m->set_layers(2);
    m->set_heads(2);
    m->set_d_head(32);
    spec.mutable_cta()->mutable_calibration()->add_lengths(64);
    spec.mutable_cta()->mutable_calibration()->add_lengths(256);
    return spec;
  };
  auto full = Make(small(PRUNE_FIDELITY_FULL));
  auto cal = Make(small(PRUNE_FIDELITY_CALIBRATED));
  ASSERT_TRUE(full != nullptr && cal != nullptr);
  auto has = [](const DeviceDescription& d, const std::string& k) {
    return std::any_of(d.parameters.begin(), d.parameters.end(),
                       [&](const auto& p) { return p.first == k; });
  };
  EXPECT_FALSE(has(full->Describe(), "kv_fraction"));
  EXPECT_TRUE(has(cal->Describe(), "kv_fraction"));
  EXPECT_GT(cal->calibration_s(), 0);
  auto op_of = [](std::vector<AttentionSeq>* seqs) {
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = 2;
    op.kv_heads = 2;
    op.d_head = 32;
    op.seqs = *seqs;
    return op;
  };
  std::vector<AttentionSeq> decode = {{1, 99, 7}};
  const Op step = op_of(&decode);
  std::vector<Cost> c(1);
  ASSERT_TRUE(full->Estimate({&step, 1}, absl::MakeSpan(c)).ok());
  EXPECT_EQ(full->calibration_s(), 0);                // a decode step needs no profile
  EXPECT_TRUE(has(full->Describe(), "kv_fraction"));  // the step's mean
  std::vector<AttentionSeq> prefill = {{40, 0, 8}};
  const Op chunk = op_of(&prefill);
  Cost want;
  ASSERT_TRUE(cal->Estimate({&chunk, 1}, absl::MakeSpan(&want, 1)).ok());
  ASSERT_TRUE(full->Estimate({&chunk, 1}, absl::MakeSpan(c)).ok());
  EXPECT_GT(full->calibration_s(), 0);
  EXPECT_EQ(c[0].cycles, want.cycles);
  EXPECT_EQ(c[0].compute_energy_pj, want.compute_energy_pj);
  EXPECT_EQ(full->profile().rows, cal->profile().rows);
}

TEST(CtaTest, BadSpecsAndRegistry) {
  auto spec = Spec();
  spec.mutable_cta()->mutable_cta()->clear_kv1_width();
  EXPECT_FALSE(CtaDevice::Create(spec).ok());
  spec = Spec();
  spec.mutable_cta()->mutable_cta()->set_kv2_width(0);
  EXPECT_FALSE(CtaDevice::Create(spec).ok());
  spec = Spec();
  spec.mutable_cta()->mutable_cta()->set_sa_rows(0);
  EXPECT_FALSE(CtaDevice::Create(spec).ok());
  spec = Spec("cta_0", PRUNE_FIDELITY_FULL);
  spec.mutable_cta()->mutable_model()->clear_layers();
  EXPECT_FALSE(CtaDevice::Create(spec).ok());
  spec = Spec();
  spec.mutable_cta()->mutable_tokens()->set_class_weight(1.5);
  EXPECT_FALSE(CtaDevice::Create(spec).ok());
  spec = Spec();
  spec.mutable_cta()->mutable_cta()->set_preset("custom");
  EXPECT_FALSE(CtaDevice::Create(spec).ok());  // no ANALYTIC table
  spec.mutable_cta()->set_fidelity(PRUNE_FIDELITY_CALIBRATED);
  spec.mutable_cta()->mutable_calibration()->add_lengths(64);
  EXPECT_TRUE(CtaDevice::Create(spec).ok());
  auto dev = CreateDevice(Spec());
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ((*dev)->Describe().kind, "cta");
  EXPECT_EQ(CtaPresetNames(), (std::vector<std::string>{"cta_0", "cta_0.5", "cta_1", "dense"}));
  // Only attention ops; decode shapes checked.
  Op gemm;
  std::vector<Cost> costs(1);
  EXPECT_FALSE((*dev)->Estimate({&gemm, 1}, absl::MakeSpan(costs)).ok());
}

}  // namespace
}  // namespace servesim::devices
