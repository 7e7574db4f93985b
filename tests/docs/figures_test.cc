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
#include "absl/strings/strip.h"
#include "devices/presets.h"
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
  EXPECT_FIGURE(f["energy_per_token_j"], 8.722, 0.01);
  EXPECT_FIGURE(f["energy_static_j"] / f["energy_j"], 0.26, 0.01);
  EXPECT_EQ(f["tdp_limited_iterations"], 17010);
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

// docs/moe.md, "What attention offload buys on today's models": the static
// evaluation at a 50 ms TBT limit, DGX_Base and DGX+AttAcc (head-level),
// tokens/s and J per token (scripts/offload_modern_models.sh).
TEST(DocFiguresTest, OffloadOnModernModelsAt50ms) {
  // J per token with servesim's busy GPU power; then as the paper counts
  // it (0.32 pJ per MAC, no busy power): the ops' energy, then with the
  // GPUs' idle power and the stacks' background power (docs/energy.md).
  struct Row {
    const char* model;
    double base_tput, attacc_tput, base_busy_j, attacc_busy_j, base_j, attacc_j, base_total_j,
        attacc_total_j;
  };
  for (const Row& row :
       {Row{"gpt3-175b", 383.2, 738.0, 7.36, 4.30, 1.101, 0.551, 2.77, 1.45},
        Row{"llama3.1-70b", 1763.0, 1103.0, 1.82, 2.13, 0.195, 0.234, 0.558, 0.838},
        Row{"mixtral-8x22b", 2543.6, 1942.1, 1.21, 1.27, 0.164, 0.164, 0.415, 0.507},
        Row{"qwen3-235b-a22b", 2185.5, 571.9, 1.22, 2.91, 0.200, 0.474, 0.493, 1.64}}) {
    const std::vector<std::string> sets = {absl::StrCat("model.preset=", row.model),
                                           "model.max_context_tokens=4096"};
    std::vector<std::string> paper = sets;
    paper.insert(paper.end(),
                 {"cluster.xpu.flop_energy_pj=0.16", "cluster.xpu.int8_op_energy_pj=0.08",
                  "cluster.xpu.active_power_w=0"});
    const Figures base = RunExample("attacc/gpt3_175b_dgx_base_saturated.pbtxt", sets);
    const Figures att = RunExample("attacc/gpt3_175b_dgx_attacc_saturated.pbtxt", sets);
    EXPECT_FIGURE(base["throughput_tokens_per_s"], row.base_tput, 0.005) << row.model;
    EXPECT_FIGURE(att["throughput_tokens_per_s"], row.attacc_tput, 0.005) << row.model;
    EXPECT_FIGURE(base["energy_per_token_j"], row.base_busy_j, 0.01) << row.model;
    EXPECT_FIGURE(att["energy_per_token_j"], row.attacc_busy_j, 0.01) << row.model;
    const Figures pbase = RunExample("attacc/gpt3_175b_dgx_base_saturated.pbtxt", paper);
    const Figures patt = RunExample("attacc/gpt3_175b_dgx_attacc_saturated.pbtxt", paper);
    EXPECT_EQ(pbase["throughput_tokens_per_s"], base["throughput_tokens_per_s"]) << row.model;
    EXPECT_FIGURE(pbase["energy_dynamic_j"] / pbase["output_tokens"], row.base_j, 0.01)
        << row.model;
    EXPECT_FIGURE(patt["energy_dynamic_j"] / patt["output_tokens"], row.attacc_j, 0.01)
        << row.model;
    EXPECT_FIGURE(pbase["energy_per_token_j"], row.base_total_j, 0.01) << row.model;
    EXPECT_FIGURE(patt["energy_per_token_j"], row.attacc_total_j, 0.01) << row.model;
  }
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

// docs/fidelity.md and the README: measured vLLM runs replayed, the error
// of each statistic in percent (published to 0.1).
std::map<std::string, double> ReplayErrors(const std::vector<std::string>& args) {
  const std::string out = test_util::FreshDir("replay");
  std::vector<std::string> all = {"replay"};
  all.insert(all.end(), args.begin(), args.end());
  all.insert(all.end(), {"--out", out, "--quiet"});
  const test_util::CommandResult r = test_util::RunServesim(all);
  EXPECT_EQ(r.code, 0) << r.out;
  std::map<std::string, double> error;
  for (const std::string& line : test_util::Lines(test_util::ReadFile(out + "/replay_compare.csv"))) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    double v = 0;
    if (f.size() == 5 && absl::SimpleAtod(f[4], &v)) error[f[0] + "." + f[1]] = v;
  }
  return error;
}

// The table's columns, in order.
void ExpectErrors(const std::map<std::string, double>& got, const std::vector<double>& want) {
  const char* keys[] = {"ttft_s.mean", "ttft_s.p90", "ttft_s.p99", "tpot_s.mean",
                        "tpot_s.p90",  "tpot_s.p99", "e2e_s.mean", "e2e_s.p90",
                        "e2e_s.p99",   "makespan_s.value"};
  ASSERT_EQ(want.size(), 10u);
  for (size_t i = 0; i < want.size(); ++i) {
    auto it = got.find(keys[i]);
    ASSERT_NE(it, got.end()) << keys[i];
    EXPECT_NEAR(it->second, want[i], 0.06) << keys[i];
  }
}

const std::string kVllm = std::string(SERVESIM_SOURCE_DIR) + "/examples/vllm/";

TEST(DocFiguresTest, VllmReplayTable) {
  const std::string run = kVllm + "runs/RTXPRO6000_Llama-3.1-8B_tp1";
  ExpectErrors(ReplayErrors({run, "--profiles", kVllm + "profiles"}),
               {-4.3, -4.3, -2.3, -1.0, 0.5, 0.6, -1.9, -1.8, -1.7, -2.0});
  ExpectErrors(ReplayErrors({run}),
               {-19.2, -21.1, -17.5, -7.5, -7.4, -7.4, -10.5, -11.3, -10.4, -6.9});
  // The otel runs on the H100 preset (its GEMM caps measured), and with the
  // H100 bundles of scripts/profile_gpu.py (FlashAttention-2 in PyTorch).
  const std::pair<const char*, std::vector<double>> otel[][2] = {
      {{"GPU80GB_CodeLlama-34b-Instruct-hf_tp1_mbt4096_prefillheavy-sweep",
        {-8.9, -8.2, -6.6, -6.2, -6.4, 0.7, -8.0, -6.6, -6.3, -0.1}},
       {"", {26.1, 24.6, 23.2, 30.9, 29.8, 36.8, 27.0, 22.6, 20.9, 0.2}}},
      {{"GPU80GB_CodeLlama-34b-Instruct-hf_tp1_mbt4096_train-sweep",
        {-2.5, -5.2, -1.7, 0.6, -0.5, -1.0, 0.2, -0.6, -1.0, 0.0}},
       {"", {6.9, 12.2, 5.0, 3.1, 3.2, 2.9, 3.2, 2.6, 3.7, 0.0}}},
      {{"GPU80GB_CodeLlama-34b-Instruct-hf_tp1_mbt64_prefilldominant-sweep",
        {-6.7, -5.6, -4.5, -1.5, -3.2, -3.2, -6.0, -5.5, -4.5, -0.2}},
       {"", {20.0, 10.2, 11.1, 10.0, 15.1, 17.6, 18.4, 10.3, 11.1, 1.7}}},
      {{"GPU80GB_Llama-2-7b-hf_tp1_mbt4096_train-sweep",
        {-5.2, -3.5, -9.6, -3.1, -2.4, -0.8, -3.1, -2.5, -0.2, -0.0}},
       {"", {7.0, 8.9, 5.8, 11.1, -1.1, 3.4, 10.6, -0.5, 4.4, 0.1}}},
  };
  for (const auto& [roofline, bundle] : otel) {
    SCOPED_TRACE(roofline.first);
    const std::string dir = kVllm + "runs_otel/" + roofline.first;
    ExpectErrors(ReplayErrors({dir, "--set", "cluster.xpu.preset=h100-sxm-80gb"}), roofline.second);
    ExpectErrors(ReplayErrors({dir, "--set", "cluster.xpu.preset=h100-sxm-80gb", "--profiles",
                               kExamples + std::string("gpu_profiles")}),
                 bundle.second);
  }
}

// `servesim calibrate`'s fit of a bundle (a tp<N> folder) per class:
// compute, memory, overhead us, mean error %, p90 error %.
std::map<std::string, std::vector<double>> CalibrateFits(const std::string& tp_dir) {
  const test_util::CommandResult r = test_util::RunServesim({"calibrate", tp_dir});
  EXPECT_EQ(r.code, 0) << r.out;
  std::map<std::string, std::vector<double>> rows;
  for (const std::string& line : test_util::Lines(r.out)) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 9 || f[0] == "class") continue;
    std::vector<double> v;
    for (size_t i : {2, 3, 4, 5, 6}) {
      double x = 0;
      EXPECT_TRUE(absl::SimpleAtod(absl::StripSuffix(absl::StripSuffix(f[i], "us"), "%"), &x))
          << line;
      v.push_back(x);
    }
    rows[f[0]] = v;
  }
  return rows;
}

const std::string kGpuProfiles = std::string(SERVESIM_SOURCE_DIR) + "/examples/gpu_profiles/";

// docs/profiles.md, calibrated presets: the GEMM caps of the xPU presets
// whose GPU has measured bundles are the means of `servesim calibrate`'s
// GEMM fits of those bundles (each fit printed to 3 decimals, 0.01 us).
TEST(DocFiguresTest, PresetGemmCapsAreTheMeanOfTheBundlesFits) {
  const std::pair<const char*, std::vector<std::string>> presets[] = {
      {"h100-sxm-80gb",
       {kGpuProfiles + "H100/meta-llama/Llama-2-7b-hf",
        kGpuProfiles + "H100/meta-llama/Llama-3.1-8B",
        kGpuProfiles + "H100/codellama/CodeLlama-34b-Instruct-hf",
        kGpuProfiles + "H100/Qwen/Qwen3-32B"}},
      {"rtx-pro-6000",
       {kVllm + "profiles/RTXPRO6000/meta-llama/Llama-3.1-8B",
        kVllm + "profiles/RTXPRO6000/Qwen/Qwen3-32B"}},
      {"rtx-4090", {kVllm + "profiles/RTX4090/meta-llama/Llama-3.1-8B"}},
  };
  for (const auto& [preset, bundles] : presets) {
    SCOPED_TRACE(preset);
    double compute = 0, memory = 0, overhead_us = 0;
    for (const std::string& b : bundles) {
      const std::vector<double> gemm = CalibrateFits(b + "/bf16/tp1").at("gemm");
      compute += gemm[0] / bundles.size();
      memory += gemm[1] / bundles.size();
      overhead_us += gemm[2] / bundles.size();
    }
    auto xpu = devices::XpuPreset(preset);
    ASSERT_TRUE(xpu.ok()) << xpu.status();
    ASSERT_EQ(xpu->roofline_size(), 1);
    EXPECT_EQ(xpu->roofline(0).op_class(), "gemm");
    EXPECT_NEAR(xpu->roofline(0).compute_utilization(), compute, 0.0011);
    EXPECT_NEAR(xpu->roofline(0).memory_utilization(), memory, 0.0011);
    EXPECT_NEAR(xpu->roofline(0).kernel_overhead_s() * 1e6, overhead_us, 0.011);
  }
}

// docs/profiles.md: `servesim calibrate` on the vendored and measured
// bundles (class, compute, memory, overhead us, mean error %, p90 error %),
// and what the calibrated roofline does to the shared run's mean TPOT.
TEST(DocFiguresTest, CalibrateTable) {
  auto fits = [](const std::string& bundle) {
    return CalibrateFits(kVllm + "profiles/" + bundle + "/bf16/tp1");
  };
  auto expect = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], i < 2 ? 0.0015 : 0.06) << i;
  };
  const auto llama = fits("RTXPRO6000/meta-llama/Llama-3.1-8B");
  expect(llama.at("gemm"), {0.724, 0.990, 9.04, 8.9, 18.0});
  expect(llama.at("attention"), {0.422, 0.456, 10.19, 24.2, 52.3});
  expect(llama.at("norm"), {1.0, 2.402, 3.14, 39.3, 79.5});
  expect(llama.at("activation"), {1.0, 2.358, 2.02, 31.8, 46.8});
  expect(llama.at("embedding"), {1.0, 4.0, 3.22, 8.5, 19.6});
  const auto qwen = fits("RTXPRO6000/Qwen/Qwen3-32B");
  expect(qwen.at("gemm"), {0.722, 0.924, 9.10, 7.5, 16.2});
  expect(qwen.at("attention"), {0.464, 0.276, 8.51, 21.3, 47.7});
  const auto ada = fits("RTX4090/meta-llama/Llama-3.1-8B");
  expect(ada.at("gemm"), {0.946, 0.928, 7.89, 4.8, 9.8});
  expect(ada.at("attention"), {0.644, 0.370, 11.20, 25.5, 53.6});
  // The H100 bundles of scripts/profile_gpu.py.
  const std::pair<const char*, std::vector<double>> h100[] = {
      {"meta-llama/Llama-2-7b-hf", {0.762, 0.828, 4.34, 4.3, 8.4}},
      {"meta-llama/Llama-3.1-8B", {0.750, 0.826, 4.18, 5.4, 10.4}},
      {"codellama/CodeLlama-34b-Instruct-hf", {0.722, 0.802, 1.02, 4.7, 8.8}},
      {"Qwen/Qwen3-32B", {0.730, 0.826, 5.14, 5.1, 9.5}},
  };
  for (const auto& [model, gemm] : h100) {
    SCOPED_TRACE(model);
    expect(CalibrateFits(kGpuProfiles + "H100/" + model + "/bf16/tp1").at("gemm"), gemm);
  }

  // The shared run on the roofline with all five fitted classes.
  const std::string dir = test_util::FreshDir("calibrated");
  ASSERT_EQ(test_util::RunServesim({"calibrate",
                                    kVllm + "profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1",
                                    "--out", dir + "/caps.pbtxt"})
                .code,
            0);
  ASSERT_EQ(test_util::RunServesim({"replay", kVllm + "runs/RTXPRO6000_Llama-3.1-8B_tp1",
                                    "--out", dir + "/replay", "--quiet"})
                .code,
            0);
  std::string scenario = test_util::ReadFile(dir + "/replay/scenario.pbtxt");
  const std::string caps = test_util::ReadFile(dir + "/caps.pbtxt");
  const size_t from = caps.find("  roofline {"), to = caps.rfind("}");
  const std::string anchor = "preset: \"rtx-pro-6000\"\n";
  ASSERT_NE(scenario.find(anchor), std::string::npos);
  scenario.insert(scenario.find(anchor) + anchor.size(), caps.substr(from, to - from));
  test_util::WriteFile(dir + "/calibrated.pbtxt", scenario);
  ASSERT_EQ(test_util::RunServesim({"run", dir + "/calibrated.pbtxt", "--quiet", "--out",
                                    dir + "/run"})
                .code,
            0);
  auto summary = studies::ReadSummaryFigures(dir + "/run");
  ASSERT_TRUE(summary.ok()) << summary.status();
  double tpot = 0;
  ASSERT_TRUE(absl::SimpleAtod(summary->at("tpot_s.mean"), &tpot));
  EXPECT_NEAR(100 * (tpot / 0.032458 - 1), 25.9, 0.15);  // truth.csv's mean TPOT
}

}  // namespace
}  // namespace servesim

namespace servesim {
namespace {

// docs/kv_tiers.md: the example's row of "What the tiers buy on the
// Mooncake trace", and its largest rate scale under the SLO.
TEST(DocFiguresTest, KvTiersMooncakeExample) {
  const std::string sc = "llama3.1_70b_kv_tiers_dgx_h100_mooncake.pbtxt";
  const Figures f = RunExample(sc);
  EXPECT_FIGURE(f["ttft_s.p50"], 0.192, 0.02);
  EXPECT_FIGURE(f["ttft_s.p99"], 5.584, 0.02);
  EXPECT_FIGURE(f["tpot_s.p99"], 0.1432, 0.02);
  EXPECT_FIGURE(f["slo_attainment"], 0.957, 0.01);
  EXPECT_FIGURE(f["energy_per_token_j"], 21.41, 0.02);
  EXPECT_FIGURE(f["prefix_cache_hit_rate"], 0.128 + 0.164 + 0.327, 0.02);
  const std::string out = test_util::FreshDir("kv_tiers_search");
  const test_util::CommandResult r = test_util::RunServesim(
      {"search", kExamples + sc, "--vary-rate", "--slo", "ttft_p90=5s,tbt_p90=100ms", "--tolerance",
       "0.05", "-j", "1", "--out", out});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("max workload.rate_scale = 0.359375 "), std::string::npos) << r.out;
}

}  // namespace
}  // namespace servesim
