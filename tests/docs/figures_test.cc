// The figures the README and docs/ publish, pinned: each table's rows are
// rerun here through the real binary and compared with the published value
// within a few percent. A model change that moves a published comparison
// fails here, and the page is updated with it (the page names this test).
//
// Runs that take long (the FULL-fidelity examples run the kernels on every
// head of every decode step: up to ~100 s) are in their own test, so ctest
// spreads them over the cores. scripts/test_sanitized.sh leaves this suite
// out: it checks figures, not memory, and would take an hour under ASan.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

// summary.json's lists of named objects (`kv_tiers`, `links`) as
// "list.name.field": "kv_tiers": [{"name": "ssd", "hit_rate": 0.3}] gives
// "kv_tiers.ssd.hit_rate".
void AddNamedItems(std::map<std::string, std::string>* figures) {
  std::map<std::string, std::string> items;
  for (const auto& [list, text] : *figures) {
    absl::string_view v = text;
    if (!absl::ConsumePrefix(&v, "[{") || !absl::ConsumeSuffix(&v, "}]")) continue;
    for (absl::string_view item : absl::StrSplit(v, "}, {")) {
      std::map<std::string, std::string> fields;
      for (absl::string_view field : absl::StrSplit(item, ", \"")) {
        field = absl::StripPrefix(field, "\"");
        const size_t colon = field.find("\": ");
        if (colon != absl::string_view::npos) {
          fields[std::string(field.substr(0, colon))] = std::string(field.substr(colon + 3));
        }
      }
      auto name = fields.find("name");
      if (name == fields.end()) continue;
      const std::string prefix = absl::StrCat(
          list, ".", absl::StripSuffix(absl::StripPrefix(name->second, "\""), "\""), ".");
      for (const auto& [field, value] : fields) items[prefix + field] = value;
    }
  }
  figures->insert(items.begin(), items.end());
}

// Runs the scenario at `path` with `sets` (only summary.json written).
Figures RunScenario(const std::string& path, const std::vector<std::string>& sets = {}) {
  const std::string dir = test_util::FreshDir("figures");
  std::vector<std::string> args = {"run", path, "--quiet", "--out", dir};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  for (const char* off : {"output.requests_csv=false", "output.iterations_csv=false",
                          "output.timeline=false", "output.report_html=false"}) {
    args.insert(args.end(), {"--set", off});
  }
  const test_util::CommandResult r = test_util::RunServesim(args);
  EXPECT_EQ(r.code, 0) << r.out;
  auto figures = studies::ReadSummaryFigures(dir);
  EXPECT_TRUE(figures.ok()) << figures.status();
  if (!figures.ok()) return Figures({});
  AddNamedItems(&*figures);
  return Figures(*figures);
}

// Runs examples/`scenario` with `sets`.
Figures RunExample(const std::string& scenario, const std::vector<std::string>& sets = {}) {
  return RunScenario(kExamples + scenario, sets);
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

constexpr char kKvTiersExample[] = "llama3.1_70b_kv_tiers_dgx_h100_mooncake.pbtxt";

// docs/kv_tiers.md, "Throughput under the SLO": `servesim search`'s
// largest rate scale at which the scenario meets the page's SLO (as its
// answer prints it) and the goodput there (requests/s).
struct KvTiersMaxRate {
  std::string rate_scale;
  double goodput = NAN;
};
KvTiersMaxRate SearchKvTiersMaxRate(const std::string& scenario) {
  const test_util::CommandResult r = test_util::RunServesim(
      {"search", scenario, "--vary-rate", "--slo", "ttft_p90=5s,tbt_p90=100ms", "--tolerance",
       "0.05", "-j", "1", "--out", test_util::FreshDir("kv_tiers_search")});
  EXPECT_EQ(r.code, 0) << r.out;
  KvTiersMaxRate max;
  const std::string answer = "max workload.rate_scale = ", goodput = "at it: goodput ";
  const size_t a = r.out.find(answer), g = r.out.find(goodput);
  if (a == std::string::npos || g == std::string::npos) {
    ADD_FAILURE() << r.out;
    return max;
  }
  auto word_after = [&](size_t at) { return r.out.substr(at, r.out.find(' ', at) - at); };
  max.rate_scale = word_after(a + answer.size());
  EXPECT_TRUE(absl::SimpleAtod(word_after(g + goodput.size()), &max.goodput)) << r.out;
  return max;
}

// docs/kv_tiers.md: the example's row of "What the tiers buy on the
// Mooncake trace", and its largest rate scale under the SLO.
TEST(DocFiguresTest, KvTiersMooncakeExample) {
  const std::string sc = kKvTiersExample;
  const Figures f = RunExample(sc);
  EXPECT_FIGURE(f["ttft_s.p50"], 0.192, 0.02);
  EXPECT_FIGURE(f["ttft_s.p99"], 5.584, 0.02);
  EXPECT_FIGURE(f["tpot_s.p99"], 0.1432, 0.02);
  EXPECT_FIGURE(f["slo_attainment"], 0.957, 0.01);
  EXPECT_FIGURE(f["energy_per_token_j"], 21.41, 0.02);
  EXPECT_FIGURE(f["prefix_cache_hit_rate"], 0.128 + 0.164 + 0.327, 0.02);
  const KvTiersMaxRate max = SearchKvTiersMaxRate(kExamples + sc);
  EXPECT_EQ(max.rate_scale, "0.359375");
  EXPECT_FIGURE(max.goodput, 1.297, 0.002);
}

// docs/kv_tiers.md, "What the tiers buy on the Mooncake trace"
// (bench/kv_tiers.sh): the example with other tiers and routing, written
// as `name`. `tiers`: the kv_tiers block's tier lines ("" for none: no
// kv_tiers at all).
std::string KvTiersVariant(const std::string& name, const std::string& tiers,
                           const std::string& routing = "") {
  std::string text = test_util::ReadFile(kExamples + std::string(kKvTiersExample));
  const size_t start = text.find("  kv_tiers {"), end = text.find("\n  }\n", start) + 5;
  const std::string block = text.substr(start, end - start);
  const size_t first = block.find("    tier"), policy = block.find("    write:");
  text.replace(start, end - start,
               tiers.empty() ? "" : block.substr(0, first) + tiers + block.substr(policy));
  if (!routing.empty()) {
    text = absl::StrReplaceAll(text, {{"ROUTING_POLICY_PREFIX_AFFINITY", routing}});
  }
  text = absl::StrReplaceAll(text,
                             {{"path: \"traces/", absl::StrCat("path: \"", kExamples, "traces/")}});
  const std::string path = test_util::FreshDir(name) + "/s.pbtxt";
  test_util::WriteFile(path, text);
  return path;
}

const std::string kDramTier =
    "    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 200e9 "
    "link { preset: \"pcie5\" } }\n";
const std::string kStoreTier =
    "    tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 50e9 "
    "link { preset: \"roce-400g\" } }\n";

// A row: TTFT p50 / p99 ms, TPOT p99 ms, SLO %, J/token, TB loaded, and the
// share of prompt tokens found in HBM and in each tier (%), by tier name.
struct KvTiersRow {
  double ttft_p50_ms, ttft_p99_ms, tpot_p99_ms, slo_pct, j_per_token, tb_loaded, hbm_pct;
  std::vector<std::pair<const char*, double>> tier_pct;
};

void ExpectKvTiersRow(const std::string& scenario, const std::vector<std::string>& sets,
                      const KvTiersRow& w) {
  const Figures f = RunScenario(scenario, sets);
  EXPECT_FIGURE(f["ttft_s.p50"] * 1e3, w.ttft_p50_ms, 0.01);
  EXPECT_FIGURE(f["ttft_s.p99"] * 1e3, w.ttft_p99_ms, 0.005);
  EXPECT_FIGURE(f["tpot_s.p99"] * 1e3, w.tpot_p99_ms, 0.005);
  EXPECT_FIGURE(f["slo_attainment"] * 100, w.slo_pct, 0.005);
  EXPECT_FIGURE(f["energy_per_token_j"], w.j_per_token, 0.005);
  double loaded = 0, tier_hits = 0;
  for (const auto& [tier, pct] : w.tier_pct) {
    loaded += f[absl::StrCat("kv_tiers.", tier, ".loaded_bytes")];
    tier_hits += f[absl::StrCat("kv_tiers.", tier, ".hit_tokens")];
    EXPECT_FIGURE(f[absl::StrCat("kv_tiers.", tier, ".hit_rate")] * 100, pct, 0.01) << tier;
  }
  EXPECT_FIGURE(loaded / 1e12, w.tb_loaded, 0.01);
  EXPECT_FIGURE((f["prefix_cache_hit_tokens"] - tier_hits) / f["prefix_cache_query_tokens"] * 100,
                w.hbm_pct, 0.01);
}

TEST(DocFiguresTest, KvTiersMooncakeTable) {
  const std::string dram = KvTiersVariant("dram", kDramTier);
  {
    SCOPED_TRACE("HBM only");
    ExpectKvTiersRow(KvTiersVariant("none", ""), {}, {1316, 8348, 158.7, 79.8, 28.33, 0, 13.9, {}});
  }
  {
    SCOPED_TRACE("+ host DRAM (blocking)");
    ExpectKvTiersRow(dram, {}, {426, 6663, 146.2, 90.9, 24.66, 5.03, 14.3, {{"host_dram", 25.9}}});
  }
  {
    SCOPED_TRACE("+ host DRAM (layer-wise)");
    ExpectKvTiersRow(dram, {"cluster.kv_tiers.load=LAYERWISE"},
                     {405, 6441, 145.5, 91.0, 24.62, 5.10, 14.2, {{"host_dram", 26.2}}});
  }
  {
    SCOPED_TRACE("+ host DRAM (async)");
    ExpectKvTiersRow(dram, {"cluster.kv_tiers.load=ASYNC"},
                     {400, 6564, 146.5, 90.8, 24.66, 5.05, 14.2, {{"host_dram", 26.0}}});
  }
  {
    SCOPED_TRACE("+ host DRAM (write-on-evict)");
    ExpectKvTiersRow(dram, {"cluster.kv_tiers.write=ON_EVICT"},
                     {363, 6625, 147.1, 90.8, 24.31, 5.40, 14.1, {{"host_dram", 27.8}}});
  }
  // + host DRAM + NVMe (blocking), the example: KvTiersMooncakeExample.
  {
    SCOPED_TRACE("+ host DRAM + NVMe (async)");
    ExpectKvTiersRow(
        kExamples + std::string(kKvTiersExample), {"cluster.kv_tiers.load=ASYNC"},
        {192, 5567, 140.1, 96.2, 21.01, 9.79, 12.9, {{"host_dram", 16.2}, {"ssd", 34.2}}});
  }
  {
    SCOPED_TRACE("least-outstanding, + host DRAM 250 GB");
    ExpectKvTiersRow(KvTiersVariant("lo_dram", absl::StrReplaceAll(kDramTier, {{"200e9", "250e9"}}),
                                    "ROUTING_POLICY_LEAST_OUTSTANDING"),
                     {}, {752, 7725, 149.3, 88.7, 27.75, 4.09, 8.5, {{"host_dram", 21.0}}});
  }
  {
    SCOPED_TRACE("least-outstanding, + host DRAM 200 GB + cluster store 50 GB");
    ExpectKvTiersRow(
        KvTiersVariant("lo_store", kDramTier + kStoreTier, "ROUTING_POLICY_LEAST_OUTSTANDING"), {},
        {690, 7339, 148.0, 89.9, 27.58, 4.39, 8.6, {{"host_dram", 16.4}, {"cluster_store", 6.2}}});
  }
}

// docs/kv_tiers.md, the cluster store's network with 2, 4 and 8 replicas at
// the same load per replica (bench/kv_tiers.sh's last table).
TEST(DocFiguresTest, KvTiersClusterStoreNetwork) {
  const std::string lo_store =
      KvTiersVariant("lo_store", kDramTier + kStoreTier, "ROUTING_POLICY_LEAST_OUTSTANDING");
  struct Row {
    int replicas;
    double rate, network_gb, steps, lost_ms, ttft_p50_ms, ttft_p99_ms;
  };
  for (const Row& w : {Row{2, 0.25, 449, 77, 0, 690, 7339}, Row{4, 0.5, 1581, 201, 0, 312, 6361},
                       Row{8, 1.0, 2506, 313, 120, 268, 6170}}) {
    SCOPED_TRACE(w.replicas);
    const Figures f = RunScenario(lo_store, {absl::StrCat("cluster.replicas=", w.replicas),
                                             absl::StrCat("workload.rate_scale=", w.rate)});
    EXPECT_FIGURE(f["kv_tiers.cluster_store.network_bytes"] / 1e9, w.network_gb, 0.005);
    EXPECT_EQ(f["kv_tiers.cluster_store.network_steps"], w.steps);
    if (w.lost_ms == 0) {
      EXPECT_LT(f["kv_tiers.cluster_store.contention_s"] * 1e3, 0.5);
    } else {
      EXPECT_FIGURE(f["kv_tiers.cluster_store.contention_s"] * 1e3, w.lost_ms, 0.01);
    }
    EXPECT_FIGURE(f["ttft_s.p50"] * 1e3, w.ttft_p50_ms, 0.01);
    EXPECT_FIGURE(f["ttft_s.p99"] * 1e3, w.ttft_p99_ms, 0.005);
  }
}

// docs/kv_tiers.md, "Throughput under the SLO": the other configurations'
// largest rate scale, goodput and goodput against HBM only's (the
// example's row is KvTiersMooncakeExample's).
TEST(DocFiguresTest, KvTiersMaxRateUnderTheSlo) {
  const KvTiersMaxRate hbm = SearchKvTiersMaxRate(KvTiersVariant("none", ""));
  EXPECT_EQ(hbm.rate_scale, "0.09375");
  EXPECT_FIGURE(hbm.goodput, 0.330, 0.002);
  struct Row {
    const char* name;
    std::string scenario;
    const char* rate_scale;
    double goodput, vs_hbm;
  };
  const std::vector<Row> rows = {
      {"+ host DRAM", KvTiersVariant("dram", kDramTier), "0.2578125", 0.911, 2.76},
      {"least-outstanding, + host DRAM 250 GB",
       KvTiersVariant("lo_dram", absl::StrReplaceAll(kDramTier, {{"200e9", "250e9"}}),
                      "ROUTING_POLICY_LEAST_OUTSTANDING"),
       "0.2109375", 0.750, 2.27},
      {"least-outstanding, + host DRAM 200 GB + cluster store 50 GB",
       KvTiersVariant("lo_store", kDramTier + kStoreTier, "ROUTING_POLICY_LEAST_OUTSTANDING"),
       "0.2265625", 0.800, 2.43}};
  for (const Row& w : rows) {
    SCOPED_TRACE(w.name);
    const KvTiersMaxRate max = SearchKvTiersMaxRate(w.scenario);
    EXPECT_EQ(max.rate_scale, w.rate_scale);
    EXPECT_FIGURE(max.goodput, w.goodput, 0.002);
    EXPECT_FIGURE(max.goodput / hbm.goodput, w.vs_hbm, 0.002);
  }
}

// docs/disaggregation.md, "Collectives on the fabric": DeepSeek-V3's decode
// pool over two racks (the example), one rack, and uplinks 1:1, 2:1, 4:1.
TEST(DocFiguresTest, DisaggregationCollectivesOnTheFabric) {
  struct Row {
    const char* set;
    double shared_steps, lost_s, tpot_p50_ms, tpot_p99_ms;
  };
  for (const Row& w :
       {Row{"cluster.disaggregation.fabric.nodes_per_rack=0", 37076, 0.029, 22.64, 23.80},
        Row{"cluster.disaggregation.fabric.oversubscription=1", 78568, 0.120, 22.65, 23.80},
        Row{"cluster.disaggregation.fabric.oversubscription=2", 77730, 16.2, 22.90, 24.15},
        Row{"cluster.disaggregation.fabric.oversubscription=4", 76039, 48.5, 23.42, 24.86}}) {
    SCOPED_TRACE(w.set);
    const Figures f = RunExample("deepseek_v3_pd_ep_racks_azure_conv.pbtxt", {w.set});
    EXPECT_FIGURE(f["collective_nic_bytes"] / 1e12, 12.7, 0.005);
    EXPECT_EQ(f["collective_shared_steps"], w.shared_steps);
    // Printed to 0.001 s, and to three digits.
    EXPECT_NEAR(f["collective_contention_s"], w.lost_s, std::max(0.0006, 0.005 * w.lost_s));
    EXPECT_FIGURE(f["tpot_s.p50"] * 1e3, w.tpot_p50_ms, 0.002);
    EXPECT_FIGURE(f["tpot_s.p99"] * 1e3, w.tpot_p99_ms, 0.002);
  }
}

// docs/disaggregation.md, "What disaggregation buys, and when"
// (bench/disaggregation.sh study): Llama-3.1-70B on 16 H100s, colocated
// or split into pools (the example), TTFT <= 2 s and TPOT <= 50 ms.
const std::string kPdExample =
    kExamples + std::string("llama3.1_70b_pd_2xdgx_h100_azure_conv.pbtxt");

// Each GPU's host keeps 200 GB of KV in DRAM and gives 50 GB to a store
// its pool shares over the NICs.
const std::string kPdTiers =
    "kv_tiers { tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 200e9 link { preset: "
    "\"pcie5\" } } tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 50e9 link { preset: "
    "\"infiniband-ndr\" } } }";

// The script's colocated scenario: the example without its pools, as 4
// TP4 replicas; with `tiers`, the tiers above and prefix-aware routing.
std::string PdStudyColocated(bool tiers) {
  std::string text = test_util::ReadFile(kPdExample);
  const size_t from = text.find("  disaggregation {"), to = text.find("\n  }\n", from) + 5;
  text.erase(from, to - from);
  text = absl::StrReplaceAll(text, {{"tensor_parallel: 4", "tensor_parallel: 4\n  replicas: 4"}});
  if (tiers) {
    text = absl::StrReplaceAll(
        text, {{"replicas: 4", "replicas: 4\n  " + kPdTiers},
               {"BATCHING_POLICY_VLLM_V1 }",
                "BATCHING_POLICY_VLLM_V1 routing: ROUTING_POLICY_PREFIX_AFFINITY }"}});
  }
  const std::string path =
      test_util::FreshDir(tiers ? "colocated_tiers" : "colocated") + "/s.pbtxt";
  test_util::WriteFile(path, text);
  return path;
}

// The script's 3 + 1 split with the tiers in the prefill pool.
std::string PdStudyPrefillTiers() {
  const std::string text = absl::StrReplaceAll(
      test_util::ReadFile(kPdExample),
      {{"prefill { cluster { replicas: 2 } }",
        "prefill { cluster { replicas: 3 " + kPdTiers +
            " } scheduler { routing: ROUTING_POLICY_PREFIX_AFFINITY } }"},
       {"decode { cluster { replicas: 2 } }", "decode { cluster { replicas: 1 } }"}});
  const std::string path = test_util::FreshDir("pd_tiers") + "/s.pbtxt";
  test_util::WriteFile(path, text);
  return path;
}

// A configuration: its scenario and --set overrides.
struct PdStudyConfig {
  const char* name;
  std::string scenario;
  std::vector<std::string> sets;
};

// The five configurations of every workload: colocated, 2 + 2 and 3 + 1,
// each split with AttAcc beside its decode replicas or not.
std::vector<PdStudyConfig> PdStudyConfigs() {
  const std::string attacc = "cluster.disaggregation.decode.cluster.attacc.preset=attacc_bank";
  auto pools = [&](int prefill, int decode, bool with_attacc) {
    std::vector<std::string> sets = {
        absl::StrCat("cluster.disaggregation.prefill.cluster.replicas=", prefill),
        absl::StrCat("cluster.disaggregation.decode.cluster.replicas=", decode)};
    if (with_attacc) sets.push_back(attacc);
    return sets;
  };
  return {{"colocated 4 x TP4", PdStudyColocated(false), {}},
          {"P/D 2 + 2", kPdExample, pools(2, 2, false)},
          {"P/D 2 + 2, AttAcc decode", kPdExample, pools(2, 2, true)},
          {"P/D 3 + 1", kPdExample, pools(3, 1, false)},
          {"P/D 3 + 1, AttAcc decode", kPdExample, pools(3, 1, true)}};
}

// A row's figures: tok/s, goodput req/s, SLO met %, TTFT p50 / p99 ms,
// TPOT p99 ms, the transfer's share of TTFT % (< 0: colocated, none),
// J/token.
struct PdStudyRow {
  double tput, goodput, slo_pct, ttft_p50_ms, ttft_p99_ms, tpot_p99_ms, xfer_pct, j_per_token;
};

// Runs `c` on `load` (the trace and its rate) and checks the row.
Figures ExpectPdStudyRow(const PdStudyConfig& c, const std::vector<std::string>& load,
                         const PdStudyRow& w) {
  SCOPED_TRACE(c.name);
  std::vector<std::string> sets = load;
  sets.insert(sets.end(), {"slo.ttft_s=2", "slo.tpot_s=0.05"});
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  const Figures f = RunScenario(c.scenario, sets);
  EXPECT_FIGURE(f["throughput_tokens_per_s"], w.tput, 0.005);
  EXPECT_FIGURE(f["goodput_requests_per_s"], w.goodput, 0.01);
  EXPECT_FIGURE(f["slo_attainment"] * 100, w.slo_pct, 0.002);
  EXPECT_FIGURE(f["ttft_s.p50"] * 1e3, w.ttft_p50_ms, 0.01);
  EXPECT_FIGURE(f["ttft_s.p99"] * 1e3, w.ttft_p99_ms, 0.005);
  EXPECT_FIGURE(f["tpot_s.p99"] * 1e3, w.tpot_p99_ms, 0.005);
  if (w.xfer_pct >= 0) {
    EXPECT_NEAR(f["ttft_kv_transfer_share"] * 100, w.xfer_pct, 0.05);
  }
  EXPECT_FIGURE(f["energy_per_token_j"], w.j_per_token, 0.002);
  return f;
}

// The five configurations on `load`, `rows` in their order.
void ExpectPdStudyRows(const std::vector<std::string>& load, const std::vector<PdStudyRow>& rows) {
  const std::vector<PdStudyConfig> configs = PdStudyConfigs();
  ASSERT_EQ(rows.size(), configs.size());
  for (size_t i = 0; i < rows.size(); ++i) ExpectPdStudyRow(configs[i], load, rows[i]);
}

std::vector<std::string> AzureConv(const char* rate) {
  return {absl::StrCat("workload.trace.path=", kExamples, "traces/AzureLLMInferenceTrace_conv.csv"),
          absl::StrCat("workload.rate_scale=", rate)};
}

TEST(DocFiguresTest, DisaggregationStudyAzureX2) {
  ExpectPdStudyRows(AzureConv("2"), {{2325, 11.01, 100.0, 79, 418, 36.7, -1, 3.441},
                                     {2325, 11.01, 100.0, 107, 859, 20.6, 0.0, 2.880},
                                     {2324, 11.01, 100.0, 111, 865, 25.1, 0.0, 2.745},
                                     {2325, 11.01, 100.0, 102, 489, 22.8, 0.0, 2.385},
                                     {2324, 11.01, 100.0, 106, 495, 26.3, 0.0, 2.310}});
}

TEST(DocFiguresTest, DisaggregationStudyAzureX4) {
  ExpectPdStudyRows(AzureConv("4"), {{4619, 19.11, 87.4, 89, 794, 92.9, -1, 2.017},
                                     {4622, 10.42, 47.6, 6042, 59676, 23.6, 0.0, 1.939},
                                     {4614, 10.40, 47.6, 6047, 59685, 26.4, 0.0, 1.862},
                                     {4615, 21.05, 96.3, 124, 2584, 27.6, 0.0, 1.708},
                                     {4611, 21.03, 96.3, 125, 2586, 28.4, 0.0, 1.668}});
}

TEST(DocFiguresTest, DisaggregationStudyMooncake) {
  const std::vector<std::string> load = {
      absl::StrCat("workload.trace.path=", kExamples, "traces/synthetic_trace.jsonl"),
      "workload.rate_scale=0.25"};
  ExpectPdStudyRows(load, {{145, 0.74, 75.7, 907, 6336, 145.5, -1, 45.263},
                           {145, 0.58, 59.5, 1388, 10918, 21.0, 0.0, 42.030},
                           {145, 0.53, 54.6, 1409, 10959, 88.1, 0.0, 38.647},
                           {145, 0.70, 71.5, 1068, 7455, 21.9, 0.1, 37.581},
                           {145, 0.57, 58.6, 1103, 7481, 103.3, 0.1, 34.350}});
  ExpectPdStudyRow(
      {"colocated 4 x TP4, host DRAM + cluster store, prefix-aware", PdStudyColocated(true), {}},
      load, {145, 0.77, 79.2, 109, 5727, 141.3, -1, 30.569});
  const Figures f =
      ExpectPdStudyRow({"P/D 3 + 1, prefill pool with host DRAM + cluster store, prefix-aware",
                        PdStudyPrefillTiers(),
                        {}},
                       load, {145, 0.81, 83.0, 145, 5752, 22.1, 0.2, 30.008});
  // The text's store loads: 543 GB from other nodes in 78 steps, 135 ms
  // lost to links they shared with the KV hand-offs.
  EXPECT_FIGURE(f["kv_tiers.cluster_store.network_bytes"] / 1e9, 543, 0.002);
  EXPECT_EQ(f["kv_tiers.cluster_store.network_steps"], 78);
  EXPECT_FIGURE(f["kv_tiers.cluster_store.contention_s"] * 1e3, 135, 0.005);
}

}  // namespace
}  // namespace servesim
