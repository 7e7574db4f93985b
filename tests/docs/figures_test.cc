// The figures the README and docs/ publish, pinned: each table's rows are
// rerun here through the real binary and compared with the published value
// within a few percent. A model change that moves a published comparison
// fails here, and the page is updated with it (the page names this test).
//
// Runs that take long (the FULL-fidelity examples run the kernels on every
// head of every decode step: up to ~100 s) are in their own test, so ctest
// spreads them over the cores. scripts/test_sanitized.sh leaves this suite
// out: it checks figures, not memory, and would take an hour under ASan.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "studies/sweep.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

constexpr char kExamples[] = SERVESIM_SOURCE_DIR "/examples/";

// summary.json's figures of one run (nested objects as "key.field").
class Figures {
 public:
  explicit Figures(std::map<std::string, std::string> f) : f_(std::move(f)) {}
  double operator[](const std::string& key) const {
    auto it = f_.find(key);
    double v = NAN;
    EXPECT_TRUE(it != f_.end() && absl::SimpleAtod(it->second, &v)) << "no figure " << key;
    return v;
  }

 private:
  std::map<std::string, std::string> f_;
};

// Runs examples/`scenario` with `sets` (only summary.json written).
Figures RunExample(const std::string& scenario, const std::vector<std::string>& sets = {}) {
  const std::string dir = test_util::FreshDir("figures");
  std::vector<std::string> args = {"run", kExamples + scenario, "--quiet", "--out", dir};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  for (const char* off : {"output.requests_csv=false", "output.iterations_csv=false",
                          "output.timeline=false", "output.report_html=false"}) {
    args.insert(args.end(), {"--set", off});
  }
  const test_util::CommandResult r = test_util::RunServesim(args);
  EXPECT_EQ(r.code, 0) << r.out;
  auto figures = studies::ReadSummaryFigures(dir);
  EXPECT_TRUE(figures.ok()) << figures.status();
  return Figures(figures.ok() ? *figures : std::map<std::string, std::string>{});
}

// Published `want` (as printed, so rounded) within `rel` of `got`.
#define EXPECT_FIGURE(got, want, rel) EXPECT_NEAR((got), (want), (rel) * std::fabs(want))

// README: the default example's summary table.
TEST(DocFiguresTest, ReadmeDefaultExample) {
  const Figures f = RunExample("gpt3_175b_dgx_azure_conv.pbtxt");
  EXPECT_EQ(f["requests_completed"], 17754);
  EXPECT_EQ(f["requests_rejected"], 1612);
  EXPECT_FIGURE(f["throughput_tokens_per_s"], 1132.0, 0.005);
  EXPECT_FIGURE(f["ttft_s.p50"], 0.24416, 0.01);
  EXPECT_FIGURE(f["ttft_s.p99"], 0.83616, 0.01);
  EXPECT_FIGURE(f["tbt_s.p50"], 0.03071, 0.01);
  EXPECT_FIGURE(f["tbt_s.p99"], 0.32164, 0.01);
  EXPECT_FIGURE(f["tpot_s.p99"], 0.06044, 0.01);
  EXPECT_FIGURE(f["e2e_s.p50"], 6.10598, 0.01);
  EXPECT_FIGURE(f["slo_attainment"], 0.8526, 0.005);
  EXPECT_FIGURE(f["energy_per_token_j"], 1.395, 0.01);
  EXPECT_FIGURE(f["batch_size_mean"], 11.00, 0.01);
}

// docs/devices/attacc.md: the paper's three systems as scenarios, through the
// whole simulator: 383 / 496 / 738 tokens/s.
TEST(DocFiguresTest, AttAccSaturatedExamples) {
  EXPECT_FIGURE(RunExample("attacc/gpt3_175b_dgx_base_saturated.pbtxt")["throughput_tokens_per_s"], 383,
                0.02);
  EXPECT_FIGURE(RunExample("attacc/gpt3_175b_dgx_large_saturated.pbtxt")["throughput_tokens_per_s"], 496,
                0.02);
  EXPECT_FIGURE(RunExample("attacc/gpt3_175b_dgx_attacc_saturated.pbtxt")["throughput_tokens_per_s"], 738,
                0.02);
}

// A pruning device against the same run with its non-pruning preset: V
// pruning (the device's own figure), DRAM access reduction and attention
// speedup (the baseline's bytes and busy time over the device's).
struct PruneRow {
  double v_pruning, dram_reduction, speedup;
};
void ExpectPruneRow(const Figures& dev, const Figures& base, const PruneRow& want) {
  if (want.v_pruning > 0) {
    EXPECT_FIGURE(dev["attention_device_parameters.v_pruning_ratio"], want.v_pruning, 0.02);
  }
  EXPECT_FIGURE(base["attention_device_dram_bytes"] / dev["attention_device_dram_bytes"],
                want.dram_reduction, 0.02);
  EXPECT_FIGURE(base["attention_device_busy_s"] / dev["attention_device_busy_s"], want.speedup,
                0.02);
}

// docs/devices/topick.md, "Measured against the paper".
TEST(DocFiguresTest, TopickFullGpt2Medium) {
  const std::string sc = "pruning/gpt2_medium_topick_azure_full.pbtxt";
  ExpectPruneRow(RunExample(sc), RunExample(sc, {"cluster.attention_pool.topick.topick.preset=baseline"}),
                 {2.90, 1.87, 1.18});
}

// docs/devices/topick.md (the GPT-3 row) and docs/devices/pruning.md
// (serving the Azure hour).
TEST(DocFiguresTest, TopickCalibratedGpt3AzureHour) {
  const std::string sc = "pruning/gpt3_175b_topick_azure_calibrated.pbtxt";
  const Figures dev = RunExample(sc);
  const Figures base = RunExample(sc, {"cluster.attention_pool.topick.topick.preset=baseline"});
  ExpectPruneRow(dev, base, {3.75, 1.85, 1.57});
  EXPECT_FIGURE(dev["tbt_s.p50"], 0.0367, 0.02);
  EXPECT_FIGURE(dev["tpot_s.p99"], 0.0745, 0.02);
  EXPECT_FIGURE(dev["slo_attainment"], 0.582, 0.02);
  EXPECT_FIGURE(base["tbt_s.p50"], 0.0546, 0.02);
  EXPECT_FIGURE(base["tpot_s.p99"], 0.1177, 0.02);
  EXPECT_FIGURE(base["slo_attainment"], 0.092, 0.03);
}

// docs/devices/spatten.md, "Measured against the paper".
TEST(DocFiguresTest, SpattenFullGpt2Medium) {
  const std::string sc = "pruning/gpt2_medium_spatten_azure_full.pbtxt";
  const Figures dev = RunExample(sc);
  ExpectPruneRow(dev, RunExample(sc, {"cluster.attention_pool.spatten.spatten.preset=dense"}),
                 {0, 7.47, 4.10});
  EXPECT_FIGURE(dev["attention_device_parameters.v_kept_fraction"], 0.179, 0.02);
}

// docs/devices/spatten.md (the GPT-3 row) and docs/devices/pruning.md.
TEST(DocFiguresTest, SpattenCalibratedGpt3AzureHour) {
  const std::string sc = "pruning/gpt3_175b_spatten_azure_calibrated.pbtxt";
  const Figures dev = RunExample(sc);
  const Figures dense = RunExample(sc, {"cluster.attention_pool.spatten.spatten.preset=dense"});
  ExpectPruneRow(dev, dense, {0, 5.84, 5.73});
  EXPECT_FIGURE(dev["attention_device_parameters.v_kept_fraction"], 0.176, 0.02);
  EXPECT_FIGURE(dev["tbt_s.p50"], 0.0273, 0.02);
  EXPECT_FIGURE(dev["tpot_s.p99"], 0.0545, 0.02);
  EXPECT_FIGURE(dev["slo_attainment"], 0.895, 0.02);
  EXPECT_FIGURE(dense["tbt_s.p50"], 0.0504, 0.02);
  EXPECT_FIGURE(dense["tpot_s.p99"], 0.1072, 0.02);
  EXPECT_FIGURE(dense["slo_attainment"], 0.129, 0.03);
}

// docs/devices/cta.md, "Through the serving loop": FULL, 40 requests.
TEST(DocFiguresTest, CtaFullPresets) {
  const std::string sc = "cta/gpt2_medium_cta_azure_full.pbtxt";
  const Figures dense = RunExample(sc, {"cluster.attention_pool.cta.cta.preset=dense"});
  EXPECT_FIGURE(dense["tpot_s.p50"], 0.00209, 0.02);
  struct Row {
    const char* preset;
    double kv, dram, speedup, tpot_p50;
  };
  for (const Row& w : {Row{"cta_0", 0.66, 1.72, 1.42, 0.00196},
                       Row{"cta_0.5", 0.62, 1.84, 1.49, 0.00195},
                       Row{"cta_1", 0.60, 1.99, 1.55, 0.00194}}) {
    SCOPED_TRACE(w.preset);
    const Figures f = RunExample(sc, {absl::StrCat("cluster.attention_pool.cta.cta.preset=", w.preset)});
    EXPECT_FIGURE(f["attention_device_parameters.kv_fraction"], w.kv, 0.02);
    EXPECT_FIGURE(dense["attention_device_dram_bytes"] / f["attention_device_dram_bytes"], w.dram,
                  0.02);
    EXPECT_FIGURE(dense["attention_device_busy_s"] / f["attention_device_busy_s"], w.speedup,
                  0.02);
    EXPECT_FIGURE(f["tpot_s.p50"], w.tpot_p50, 0.02);
  }
}

// docs/devices/cta.md, "Through the serving loop": CALIBRATED, 400 requests.
TEST(DocFiguresTest, CtaCalibratedPresets) {
  const std::string sc = "cta/gpt2_medium_cta_azure_calibrated.pbtxt";
  const Figures dense = RunExample(sc, {"cluster.attention_pool.cta.cta.preset=dense"});
  EXPECT_FIGURE(dense["tpot_s.p50"], 0.0765, 0.02);
  struct Row {
    const char* preset;
    double kv, dram, speedup, tpot_p50;
  };
  for (const Row& w :
       {Row{"cta_1", 0.49, 2.11, 1.75, 0.0099}, Row{"cta_0", 0.58, 1.79, 1.56, 0.0223}}) {
    SCOPED_TRACE(w.preset);
    const Figures f = RunExample(sc, {absl::StrCat("cluster.attention_pool.cta.cta.preset=", w.preset)});
    EXPECT_FIGURE(f["attention_device_parameters.kv_fraction"], w.kv, 0.02);
    EXPECT_FIGURE(dense["attention_device_dram_bytes"] / f["attention_device_dram_bytes"], w.dram,
                  0.02);
    EXPECT_FIGURE(dense["attention_device_busy_s"] / f["attention_device_busy_s"], w.speedup,
                  0.02);
    EXPECT_FIGURE(f["tpot_s.p50"], w.tpot_p50, 0.03);
  }
}

// docs/devices/lad.md, "Serving 2,000 Azure conversation requests".
TEST(DocFiguresTest, LadServing) {
  const std::string sc = "lad/llama2_7b_lad_azure_calibrated.pbtxt";
  EXPECT_FIGURE(RunExample("lad/llama2_7b_a100_azure.pbtxt")["tbt_s.p50"], 0.0293, 0.02);
  const Figures ideal = RunExample(sc, {"cluster.attention_pool.lad.lad.preset=ideal"});
  EXPECT_FIGURE(ideal["tbt_s.p50"], 0.0413, 0.02);
  EXPECT_FIGURE(ideal["attention_device_busy_s"], 215, 0.02);
  struct Row {
    const char* name;
    std::vector<std::string> sets;
    double tbt_p50, busy_s, vs_ideal;
  };
  const std::vector<Row> rows = {
      {"LAD-1.5 ANALYTIC", {"cluster.attention_pool.lad.fidelity=ANALYTIC"}, 0.0147, 40, 5.3},
      {"LAD-1.5 CALIBRATED", {}, 0.0500, 280, 0.77},
      {"LAD-3.5 CALIBRATED", {"cluster.attention_pool.lad.lad.preset=lad_3.5"}, 0.0460, 249, 0.86},
      {"LAD-1.5 stable scores",
       {"cluster.attention_pool.lad.data.query_drift_rad_per_step=0.001",
        "cluster.attention_pool.lad.data.recency_logit=0"},
       0.0384, 193, 1.11}};
  for (const Row& w : rows) {
    SCOPED_TRACE(w.name);
    const Figures f = RunExample(sc, w.sets);
    EXPECT_FIGURE(f["tbt_s.p50"], w.tbt_p50, 0.02);
    EXPECT_FIGURE(f["attention_device_busy_s"], w.busy_s, 0.02);
    EXPECT_FIGURE(ideal["attention_device_busy_s"] / f["attention_device_busy_s"], w.vs_ideal,
                  0.02);
  }
}

// docs/studies.md, the max-rate study (scripts/max_rate_study.sh): one row
// of each table, both systems. `trace`: conv or code; `window_s`: the
// script's WINDOW. Returns {system: max_rate_scale} from its max_rate.csv.
std::map<std::string, double> MaxRate(const std::string& trace, int slo_ms, int window_s) {
  const std::string out = test_util::FreshDir("max_rate");
  const test_util::CommandResult r = test_util::RunCommand(absl::StrCat(
      "cd '", SERVESIM_SOURCE_DIR, "' && SERVESIM='", SERVESIM_BINARY, "' OUT='", out,
      "' MODELS=gpt3-175b TRACES=", trace, " SLOS_MS=", slo_ms, " WINDOW=", window_s,
      " JOBS=1 scripts/max_rate_study.sh"));
  EXPECT_EQ(r.code, 0) << r.out;
  std::map<std::string, double> rate;
  for (const std::string& line : test_util::Lines(test_util::ReadFile(out + "/max_rate.csv"))) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    double v = 0;
    if (f.size() == 8 && absl::SimpleAtod(f[4], &v)) rate[f[1]] = v;
  }
  return rate;
}

TEST(DocFiguresTest, MaxRateStudyConversationGpt3At50ms) {
  const auto rate = MaxRate("conv", 50, 600);
  EXPECT_FIGURE(rate.at("dgx_base"), 0.344, 0.02);
  EXPECT_FIGURE(rate.at("attacc"), 0.484, 0.02);
}

TEST(DocFiguresTest, MaxRateStudyCodeGpt3At30ms) {
  const auto rate = MaxRate("code", 30, 3600);
  EXPECT_FIGURE(rate.at("dgx_base"), 0.064, 0.03);
  EXPECT_FIGURE(rate.at("attacc"), 0.125, 0.02);
}

}  // namespace
}  // namespace servesim
