// The AttAcc study (§7) reproduces the paper's qualitative results: the
// system ordering, the effect of sequence length, and SLO-limited batches.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "studies/attacc_study.h"
#include "gtest/gtest.h"

namespace servesim::studies {
namespace {

using Key = std::tuple<std::string, std::string, std::string, int64_t, int64_t, double>;

std::map<Key, StudyPoint> RunStudy() {
  auto points = RunAttAccStudy(StudyOptions{});
  EXPECT_TRUE(points.ok()) << points.status();
  std::map<Key, StudyPoint> m;
  for (const StudyPoint& p : *points) {
    m[{p.model, p.system, p.policy, p.lin, p.lout, p.slo_ms}] = p;
  }
  return m;
}

class StudyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { points_ = new std::map<Key, StudyPoint>(RunStudy()); }
  static void TearDownTestSuite() { delete points_; }
  static const StudyPoint& At(const std::string& model, const std::string& system,
                              const std::string& policy, int64_t lout, double slo = 0) {
    return points_->at({model, system, policy, 2048, lout, slo});
  }
  static std::map<Key, StudyPoint>* points_;
};
std::map<Key, StudyPoint>* StudyTest::points_ = nullptr;

const char* kModels[] = {"llama-65b", "gpt3-175b", "mt-nlg-530b"};

TEST_F(StudyTest, HasEveryPoint) {
  // 3 models x 5 system/policy pairs x 3 lengths x 4 SLO settings.
  EXPECT_EQ(points_->size(), 3u * 5 * 3 * 4);
}

TEST_F(StudyTest, AttAccBeatsLargeBeatsBaseWithoutSlo) {
  for (const char* m : kModels) {
    for (int64_t lout : {128, 512, 2048}) {
      const double base = At(m, "dgx_base", "serial", lout).throughput_tokens_per_s;
      const double large = At(m, "dgx_large", "serial", lout).throughput_tokens_per_s;
      const double attacc = At(m, "dgx_attacc", "hl_pipe_ff", lout).throughput_tokens_per_s;
      EXPECT_GT(large, base) << m << " " << lout;
      EXPECT_GT(attacc, large) << m << " " << lout;
      // §7.2: DGX+AttAccs holds the batch DGX_Large holds (same 1,280 GB).
      EXPECT_NEAR(double(At(m, "dgx_attacc", "hl_pipe", lout).max_batch),
                  double(At(m, "dgx_large", "serial", lout).max_batch),
                  0.05 * At(m, "dgx_large", "serial", lout).max_batch)
          << m << " " << lout;
    }
  }
}

TEST_F(StudyTest, HeadLevelPipeliningHelpsAndStaysWithinThePapersRange) {
  for (const char* m : kModels) {
    for (int64_t lout : {128, 512, 2048}) {
      const double serial = At(m, "dgx_attacc", "serial", lout).throughput_tokens_per_s;
      const double hl = At(m, "dgx_attacc", "hl_pipe", lout).throughput_tokens_per_s;
      EXPECT_GT(hl, serial) << m;
      EXPECT_LT(hl / serial, 1.25) << m;  // the paper: up to 1.15x
    }
  }
}

TEST_F(StudyTest, GainsOverDgxBaseGrowWithSequenceLengthForLlama) {
  // §7.2: longer sequences shrink the batch, so AttAcc's gain grows.
  auto gain = [](int64_t lout) {
    return At("llama-65b", "dgx_attacc", "hl_pipe_ff", lout).throughput_tokens_per_s /
           At("llama-65b", "dgx_base", "serial", lout).throughput_tokens_per_s;
  };
  EXPECT_LT(gain(128), gain(2048));
}

TEST_F(StudyTest, EndToEndGainsGrowWithOutputLengthForEveryModelAndPolicy) {
  // §7.2 / Figure 13 time whole requests (prefill + decode): the prompt's
  // prefill runs on the xPUs in every system, so the longer the output, the
  // larger the share AttAcc accelerates, and the larger the gain, over both
  // baselines. (Decode-only gains stay roughly flat for GPT-3: the
  // capacity-bound batch ratio is the same at every length; see README.)
  for (const char* m : kModels) {
    for (const char* policy : {"serial", "hl_pipe", "hl_pipe_ff"}) {
      double last_base = 0, last_large = 0;
      for (int64_t lout : {128, 512, 2048}) {
        const double attacc = At(m, "dgx_attacc", policy, lout).e2e_throughput_tokens_per_s;
        const double over_base =
            attacc / At(m, "dgx_base", "serial", lout).e2e_throughput_tokens_per_s;
        const double over_large =
            attacc / At(m, "dgx_large", "serial", lout).e2e_throughput_tokens_per_s;
        EXPECT_GT(over_base, last_base) << m << " " << policy << " " << lout;
        EXPECT_GT(over_large, last_large) << m << " " << policy << " " << lout;
        EXPECT_GT(over_large, 1.0) << m << " " << policy << " " << lout;
        last_base = over_base;
        last_large = over_large;
      }
    }
  }
}

TEST_F(StudyTest, TightSloBindsTheGpuBatchAndMultipliesTheGain) {
  // §7.3: tight SLOs bind the GPU systems' batches, so the gain of
  // DGX+AttAccs grows. At 30 ms DGX_Large holds no batch of GPT-3 at all:
  // one request's step takes 31.0 (L_out 128) to 32.9 ms (2048) in the
  // authors' simulator too (SM occupancy leaves most SMs idle at batch 1).
  for (int64_t lout : {128, 512, 2048}) {
    const StudyPoint& large30 = At("gpt3-175b", "dgx_large", "serial", lout, 30);
    EXPECT_EQ(large30.batch_bound, "slo");
    EXPECT_EQ(large30.max_batch, 0);
    EXPECT_EQ(large30.throughput_tokens_per_s, 0);
  }
  const StudyPoint& attacc30 = At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 2048, 30);
  EXPECT_GE(attacc30.max_batch, 1);
  EXPECT_LE(attacc30.tbt_ms, 30.0);
  // At 50 ms DGX_Large's batch is SLO-bound, about half its capacity.
  const StudyPoint& large50 = At("gpt3-175b", "dgx_large", "serial", 2048, 50);
  EXPECT_EQ(large50.batch_bound, "slo");
  EXPECT_LT(2 * large50.max_batch, large50.capacity_batch + 4);
  EXPECT_LE(large50.tbt_ms, 50.0);
  const double gain50 =
      At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 2048, 50).throughput_tokens_per_s /
      large50.throughput_tokens_per_s;
  const double gain_none =
      At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 2048).throughput_tokens_per_s /
      At("gpt3-175b", "dgx_large", "serial", 2048).throughput_tokens_per_s;
  EXPECT_GT(gain50, 1.3 * gain_none);
}

TEST_F(StudyTest, AttAccCutsEnergyPerToken) {
  // §7.4: up to 66.7% / 65.9% / 66.8% less energy than DGX_Base.
  for (const char* m : kModels) {
    const double base = At(m, "dgx_base", "serial", 2048).energy_j_per_token;
    const double attacc = At(m, "dgx_attacc", "hl_pipe", 2048).energy_j_per_token;
    EXPECT_LT(attacc, 0.5 * base) << m;
  }
}

TEST_F(StudyTest, FfCoProcessingEnergyAsTheAuthorsCountItAndWithTheRereads) {
  // The authors charge co-processed FF layers as the GPUs' (energy taken
  // before the split): the point's energy is within 5% of hl_pipe's, whose
  // batch is 0-3 requests larger. servesim's count adds
  // the stacks re-reading their FF slice once per request: 12-27% more
  // (docs/energy.md), least for LLaMA-65B at 128 tokens, most for GPT-3 at
  // 2048 tokens under the 30 ms SLO.
  double least = 2, most = 0;
  for (const auto& [key, p] : *points_) {
    SCOPED_TRACE(p.model + " " + p.system + " " + p.policy + " " + std::to_string(p.lout) + " " +
                 std::to_string(p.slo_ms));
    if (p.policy != "hl_pipe_ff") {
      EXPECT_EQ(p.energy_j_per_token_ff_rereads, p.energy_j_per_token);
      continue;
    }
    if (p.max_batch < 1) continue;
    least = std::min(least, p.energy_j_per_token_ff_rereads / p.energy_j_per_token);
    most = std::max(most, p.energy_j_per_token_ff_rereads / p.energy_j_per_token);
    if (p.slo_ms == 0) {
      const double hl = At(p.model, "dgx_attacc", "hl_pipe", p.lout).energy_j_per_token;
      EXPECT_NEAR(p.energy_j_per_token, hl, 0.05 * hl);
    }
  }
  EXPECT_NEAR(least, 1.122, 0.003);
  EXPECT_NEAR(most, 1.267, 0.003);
}

// docs/devices/attacc.md's headline table, pinned: a model change that moves
// a figure fails here, and the table is updated with it. Each is the best
// over the three lengths, as the table says.
TEST_F(StudyTest, HeadlineTableOfTheDocs) {
  auto best = [](const char* m, auto figure) {
    double b = 0;
    for (int64_t lout : {128, 512, 2048}) b = std::max(b, figure(m, lout));
    return b;
  };
  auto tput = [](const char* m, const char* system, const char* policy, int64_t lout,
                 double slo = 0) { return At(m, system, policy, lout, slo).throughput_tokens_per_s; };
  const double kRel = 0.02;  // the table prints 3 significant digits
  const double over_base[] = {3.87, 4.73, 6.21};
  const double over_large[] = {3.03, 2.43, 1.96};
  const double hl_over_serial[] = {1.145, 1.134, 1.145};
  const double ff_over_hl[] = {1.060, 1.029, 1.030};
  const double energy_saving[] = {0.657, 0.658, 0.688};  // hl_pipe vs DGX_Base
  for (int i = 0; i < 3; ++i) {
    const char* m = kModels[i];
    SCOPED_TRACE(m);
    EXPECT_NEAR(best(m, [&](const char* m, int64_t l) {
                  return tput(m, "dgx_attacc", "hl_pipe_ff", l) / tput(m, "dgx_base", "serial", l);
                }),
                over_base[i], kRel * over_base[i]);
    EXPECT_NEAR(best(m, [&](const char* m, int64_t l) {
                  return tput(m, "dgx_attacc", "hl_pipe_ff", l) / tput(m, "dgx_large", "serial", l);
                }),
                over_large[i], kRel * over_large[i]);
    EXPECT_NEAR(best(m, [&](const char* m, int64_t l) {
                  return tput(m, "dgx_attacc", "hl_pipe", l) / tput(m, "dgx_attacc", "serial", l);
                }),
                hl_over_serial[i], 0.005 + kRel * 0.1);
    EXPECT_NEAR(best(m, [&](const char* m, int64_t l) {
                  return tput(m, "dgx_attacc", "hl_pipe_ff", l) / tput(m, "dgx_attacc", "hl_pipe", l);
                }),
                ff_over_hl[i], 0.006);
    EXPECT_NEAR(best(m, [&](const char* m, int64_t l) {
                  return 1 - At(m, "dgx_attacc", "hl_pipe", l).energy_j_per_token /
                                 At(m, "dgx_base", "serial", l).energy_j_per_token;
                }),
                energy_saving[i], 0.006);
  }
  // GPT-3 at a 30 ms SLO: DGX+AttAccs runs batch 82 / 81 / 48 at L_out
  // 128 / 512 / 2048 (the paper: 48), DGX_Large none (the paper: 1).
  EXPECT_EQ(At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 128, 30).max_batch, 82);
  EXPECT_EQ(At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 512, 30).max_batch, 81);
  EXPECT_EQ(At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 2048, 30).max_batch, 48);
  EXPECT_EQ(At("gpt3-175b", "dgx_large", "serial", 2048, 30).max_batch, 0);
}

// The authors' count by hand, GPT-3 175B in fp16 at (2048, 128) on
// DGX_Base: weights 96 x 12,288 x (4 + 8) x 12,288 x 2 = 347,892,350,976 B;
// per request (l = 2,175) KV 96 x 2 x 2,175 x 12,288 x 2 = 10,262,937,600 B
// and temporaries (12,288 + 2,175 x 96) x 2 + 2,175 x 96 = 650,976 B; out of
// 640 GiB = 687,194,767,360 B: 339,302,416,384 / 10,263,588,576 = 33.06.
// servesim counts the embedding table, the activations' reserve and
// 2,176 tokens, and holds 32.
TEST_F(StudyTest, AuthorsCapacityBatchByHand) {
  EXPECT_EQ(AuthorsCapacityBatch("gpt3-175b", "dgx_base", 2048, 128), 33);
  // DGX_Large: (1,374,389,534,720 - 347,892,350,976) / 10,263,588,576 = 100.01.
  EXPECT_EQ(AuthorsCapacityBatch("gpt3-175b", "dgx_large", 2048, 128), 100);
  auto points = RunAttAccStudy(StudyOptions{{"gpt3-175b"}, {{2048, 128}}, {0}});
  ASSERT_TRUE(points.ok()) << points.status();
  for (const StudyPoint& p : *points) {
    EXPECT_EQ(p.capacity_batch_authors, AuthorsCapacityBatch("gpt3-175b", p.system, 2048, 128));
    EXPECT_GE(p.capacity_batch_authors, p.capacity_batch) << p.system;
    // FF co-processing's partitions take KV capacity in servesim only.
    if (p.policy != "hl_pipe_ff") {
      EXPECT_LE(p.capacity_batch_authors, p.capacity_batch + 1) << p.system << " " << p.policy;
    }
  }
}

// --rules: the authors' rules (the default) run the batch their simulator
// counts and time head-level pipelining by their `_pipeline` rule;
// servesim's run the batch its memory plan holds (FF partitions included)
// and its list schedule. GPT-3 at (2048, 512), no SLO.
TEST_F(StudyTest, RulesChooseTheBatchCountAndThePipeliningRule) {
  StudyOptions servesim_rules{{"gpt3-175b"}, {{2048, 512}}, {0}};
  servesim_rules.authors_rules = false;
  auto own = RunAttAccStudy(servesim_rules);
  ASSERT_TRUE(own.ok()) << own.status();
  std::map<std::string, StudyPoint> by;
  for (const StudyPoint& p : *own) by[p.system + "/" + p.policy] = p;
  for (const auto& [name, p] : by) {
    SCOPED_TRACE(name);
    const StudyPoint& a = At("gpt3-175b", p.system, p.policy, 512);
    EXPECT_EQ(a.max_batch, a.capacity_batch_authors);
    EXPECT_EQ(p.max_batch, p.capacity_batch);
    EXPECT_EQ(p.capacity_batch_authors, a.capacity_batch_authors);
  }
  // 28 vs 27 on DGX_Base, 85 vs 84 on DGX_Large and DGX+AttAccs (82 with
  // the FF partitions).
  EXPECT_EQ(At("gpt3-175b", "dgx_base", "serial", 512).max_batch, 28);
  EXPECT_EQ(by["dgx_base/serial"].max_batch, 27);
  EXPECT_EQ(At("gpt3-175b", "dgx_attacc", "hl_pipe_ff", 512).max_batch, 85);
  EXPECT_EQ(by["dgx_attacc/hl_pipe_ff"].max_batch, 82);
  // The authors' rule overlaps more than the list schedule here: 1.134x
  // over serial against 1.036x.
  auto gain = [](const StudyPoint& hl, const StudyPoint& serial) {
    return hl.throughput_tokens_per_s / serial.throughput_tokens_per_s;
  };
  EXPECT_NEAR(gain(At("gpt3-175b", "dgx_attacc", "hl_pipe", 512),
                   At("gpt3-175b", "dgx_attacc", "serial", 512)),
              1.134, 0.002);
  EXPECT_NEAR(gain(by["dgx_attacc/hl_pipe"], by["dgx_attacc/serial"]), 1.036, 0.002);
}

TEST_F(StudyTest, CsvHasTheDocumentedColumns) {
  auto points = RunAttAccStudy(StudyOptions{{"llama-65b"}, {{2048, 128}}, {0, 30}});
  ASSERT_TRUE(points.ok());
  const std::string csv = StudyCsv(*points);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "model,system,policy,lin,lout,slo_ms,max_batch,batch_bound,"
            "throughput_tokens_per_s,tbt_ms,energy_j_per_token,capacity_batch,prefill_s,"
            "e2e_throughput_tokens_per_s,capacity_batch_authors,energy_j_per_token_ff_rereads");
  // slo_ms is empty without an SLO.
  EXPECT_NE(csv.find("llama-65b,dgx_base,serial,2048,128,,"), std::string::npos);
  EXPECT_NE(csv.find("llama-65b,dgx_base,serial,2048,128,30,"), std::string::npos);
}

}  // namespace
}  // namespace servesim::studies
