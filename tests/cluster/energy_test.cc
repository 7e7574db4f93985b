// Static power, energy by part and the xPU power cap, end to end (the
// servesim binary: SimGrid allows one engine per process). Every expected
// value is worked out from the scenario's figures by hand.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"
#include "studies/sweep.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;

// Llama-3.1-8B on A100 80GB replicas; `cluster` and `workload` fill in the
// rest.
std::string Scenario(const std::string& cluster, const std::string& workload) {
  return absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  )",
                      cluster, R"(
}
workload { )",
                      workload, R"( }
)");
}

// Runs `scenario`; summary.json's figures (nested keys joined by '.').
std::map<std::string, double> RunScenario(const std::string& scenario, const std::string& dir,
                                          std::vector<std::string> extra = {}) {
  WriteFile(dir + "/s.pbtxt", scenario);
  std::vector<std::string> args = {"run", dir + "/s.pbtxt", "--quiet", "--out", dir + "/out"};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = RunServesim(args);
  EXPECT_EQ(r.code, 0) << r.out;
  std::map<std::string, double> out;
  auto figures = studies::ReadSummaryFigures(dir + "/out");
  EXPECT_TRUE(figures.ok()) << figures.status();
  if (!figures.ok()) return out;
  for (const auto& [k, v] : *figures) {
    double d = 0;
    if (absl::SimpleAtod(v, &d)) out[k] = d;
  }
  return out;
}

// iterations.csv's duration_s and energy_j columns, row by row.
std::vector<std::pair<double, double>> Iterations(const std::string& dir) {
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/out/iterations.csv"));
  std::vector<std::pair<double, double>> rows;
  if (lines.empty()) return rows;
  const std::vector<std::string> head = absl::StrSplit(lines[0], ',');
  const auto col = [&](const char* name) {
    return std::find(head.begin(), head.end(), name) - head.begin();
  };
  const size_t dur = col("duration_s"), energy = col("energy_j");
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> c = absl::StrSplit(lines[i], ',');
    double d = 0, e = 0;
    EXPECT_TRUE(absl::SimpleAtod(c.at(dur), &d) && absl::SimpleAtod(c.at(energy), &e)) << lines[i];
    rows.push_back({d, e});
  }
  return rows;
}

// Static energy = (xPUs x idle power + host share + device background) x
// makespan; energy = static + dynamic, the parts add up, and dynamic is the
// iterations' sum.
TEST(EnergyTest, StaticPowerOverTheMakespanPlusTheIterationsEnergy) {
  const std::string dir = FreshDir("energy");
  // Two replicas of TP=2 on 8-xPU nodes: each draws 2 x 80 W (A100 idle
  // with a context) + 2/8 of a 1,000 W host = 160 + 250 = 410 W.
  auto f =
      RunScenario(Scenario("replicas: 2 tensor_parallel: 2 xpus_per_node: 8 "
                           "power { host_w_per_node: 1000 }",
                           "saturated { num_requests: 4 input_tokens: 300 output_tokens: 20 }"),
                  dir);
  const double t = f["makespan_s"];
  ASSERT_GT(t, 0);
  EXPECT_NEAR(f["energy_parts_j.xpu_idle"], 2 * 2 * 80.0 * t, 1e-6 * 320 * t);
  EXPECT_NEAR(f["energy_parts_j.host"], 2 * 250.0 * t, 1e-6 * 500 * t);
  EXPECT_EQ(f["energy_parts_j.device_static"], 0);
  EXPECT_NEAR(f["energy_static_j"], 820.0 * t, 1e-6 * 820 * t);
  double dynamic = 0;
  for (const auto& [d, e] : Iterations(dir)) dynamic += e;
  EXPECT_NEAR(f["energy_dynamic_j"], dynamic, 1e-5 * dynamic);
  const double parts = f["energy_parts_j.xpu_compute"] + f["energy_parts_j.xpu_memory"] +
                       f["energy_parts_j.xpu_active"] + f["energy_parts_j.links"];
  EXPECT_GT(f["energy_parts_j.xpu_active"], 0);  // the A100 preset's 156 W while computing
  EXPECT_NEAR(parts, f["energy_dynamic_j"], 1e-6 * parts);
  EXPECT_NEAR(f["energy_j"], f["energy_static_j"] + f["energy_dynamic_j"], 1e-6 * f["energy_j"]);
  EXPECT_NEAR(f["power_mean_w"], f["energy_j"] / t, 1e-6 * f["power_mean_w"]);
  EXPECT_NEAR(f["energy_per_token_j"], f["energy_j"] / 80, 1e-6 * f["energy_per_token_j"]);
  EXPECT_NEAR(f["energy_per_request_j"], f["energy_j"] / 4, 1e-6 * f["energy_per_request_j"]);
  // The busiest iteration's power: a replica's 410 W plus its ops' energy
  // over the iteration. Each replica's prefill (two 300-token prompts)
  // would draw more than the A100s' 400 W TDP, so it is charged the TDP
  // over its whole step (two such steps): 2 x 400 W + the host's 250 W =
  // 1,050 W.
  EXPECT_EQ(f["tdp_limited_iterations"], 2);
  EXPECT_NEAR(f["power_peak_replica_w"], 2 * 400 + 250, 1e-6 * 1050);
}

// A replica waiting for work still draws its idle power: two requests 100 s
// apart cost the same dynamic energy as two 1 s apart, and 160 W more for
// every second more of makespan.
TEST(EnergyTest, IdlePowerAccruesWhileAReplicaWaits) {
  const std::string workload =
      "constant { rate_rps: %R } num_requests: 2 lengths { fixed { input_tokens: 300 "
      "output_tokens: 20 } }";
  auto run = [&](const char* rate, const char* name) {
    std::string w = workload;
    w.replace(w.find("%R"), 2, rate);
    return RunScenario(Scenario("tensor_parallel: 2", w), FreshDir(name));
  };
  auto near = run("1", "near");
  auto far = run("0.01", "far");
  ASSERT_GT(far["makespan_s"], near["makespan_s"] + 90);
  EXPECT_NEAR(far["energy_dynamic_j"], near["energy_dynamic_j"], 1e-9 * near["energy_dynamic_j"]);
  EXPECT_NEAR(far["energy_static_j"] - near["energy_static_j"],
              160.0 * (far["makespan_s"] - near["makespan_s"]), 1e-6 * far["energy_static_j"]);
}

// AttAcc's 40 stacks draw 0.653 W each beside the xPUs; a scenario's
// figure replaces the model's.
TEST(EnergyTest, AttentionDeviceBackgroundPower) {
  const std::string workload = "saturated { num_requests: 2 input_tokens: 300 output_tokens: 10 }";
  auto model =
      RunScenario(Scenario("tensor_parallel: 2 attacc { preset: \"attacc_bank\" }", workload),
                  FreshDir("attacc"));
  const double t = model["makespan_s"];
  EXPECT_NEAR(model["energy_parts_j.device_static"], 40 * 0.653 * t, 1e-6 * 26.12 * t);
  auto given = RunScenario(Scenario("tensor_parallel: 2 attacc { preset: \"attacc_bank\" } "
                                    "power { attention_device_static_w: 100 }",
                                    workload),
                           FreshDir("given"));
  EXPECT_NEAR(given["energy_parts_j.device_static"], 100 * given["makespan_s"],
              1e-6 * 100 * given["makespan_s"]);
}

// The cap's rule (docs/energy.md): an iteration whose xPUs would average
// more than the cap over their busy time t (idle power + E / (n t)) takes
// E / (n (cap - idle)) instead, its energy unchanged.
TEST(EnergyTest, PowerCapStretchesAnIterationAsTheRuleSays) {
  // One prefill of 2,000 tokens on one A100 with the multiplier's energy
  // alone and no active power: its ops draw about 46 W above idle (5.7 J in
  // 0.124 s), over a cap of 100 W (20 W above idle).
  const std::string workload = "saturated { num_requests: 1 input_tokens: 2000 output_tokens: 2 }";
  const std::string free_dir = FreshDir("free"), capped_dir = FreshDir("capped");
  const std::vector<std::string> ops_only = {"--set", "cluster.xpu.active_power_w=0", "--set",
                                             "cluster.xpu.flop_energy_pj=0.16"};
  auto free = RunScenario(Scenario("", workload), free_dir, ops_only);
  auto capped = RunScenario(Scenario("power { xpu_cap_w: 100 }", workload), capped_dir, ops_only);
  const auto a = Iterations(free_dir), b = Iterations(capped_dir);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  // The first iteration is the prefill: the same ops, the same energy.
  const double overhead = 0;  // scheduler.step_overhead_s defaults to 0
  const double e = a[0].second, t = a[0].first - overhead;
  EXPECT_DOUBLE_EQ(b[0].second, e);
  const double want = std::max(t, e / (1 * (100.0 - 80.0))) + overhead;
  ASSERT_GT(e / (100.0 - 80.0), t) << "the prefill must be over the cap for this test";
  EXPECT_NEAR(b[0].first, want, 1e-6 * want);
  EXPECT_GT(capped["power_capped_iterations"], 0);
  EXPECT_LT(capped["throughput_tokens_per_s"], free["throughput_tokens_per_s"]);
  // At the cap: the prefill iteration's power is 80 W + E / t' = 100 W.
  EXPECT_NEAR(80.0 + e / b[0].first, 100.0, 1e-6 * 100);
}

// The planner's cost of the one iteration of a run of one request of
// `input` tokens (its prefill, which emits its only token), in process.
scheduler::IterationCost PrefillCost(const std::string& scenario, int64_t input,
                                     const std::vector<std::string>& sets) {
  auto loaded = scenario::ParseScenarioText(scenario, "energy-test");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  for (size_t i = 1; i < sets.size(); i += 2) {
    EXPECT_TRUE(scenario::ApplyOverride(&*loaded, sets[i]).ok()) << sets[i];
  }
  EXPECT_TRUE(scenario::Normalize(&*loaded).ok());
  auto sc = scenario::Resolve(*loaded);
  EXPECT_TRUE(sc.ok()) << sc.status();
  auto xpu = devices::CreateDevice(sc->xpu_device);
  EXPECT_TRUE(xpu.ok()) << xpu.status();
  scheduler::IterationPlanner planner(sc->model, sc->tensor_parallel, xpu->get());
  auto cost = planner.Plan(scheduler::UniformBatch(1, input, 0));
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *cost;
}

// cluster.xpu.active_power_w is drawn over the xPUs' busy time but their
// collectives (a GPU-only replica's xPUs are busy for the whole
// iteration; during its all-reduces they wait on NVLink), and the cap
// leaves the ops cap - idle - active while they compute.
TEST(EnergyTest, ActivePowerOverTheBusyTimeButCollectivesAndUnderTheCap) {
  const std::string workload = "saturated { num_requests: 2 input_tokens: 2000 output_tokens: 4 }";
  // The multiplier's energy alone, so that no iteration reaches the TDP.
  const std::vector<std::string> active = {"--set", "cluster.xpu.active_power_w=100", "--set",
                                           "cluster.xpu.flop_energy_pj=0.16"};
  // One xPU: no collectives, the whole busy time.
  const std::string one_dir = FreshDir("active_one");
  auto one = RunScenario(Scenario("", workload), one_dir, active);
  double busy = 0;
  for (const auto& [d, e] : Iterations(one_dir)) busy += d;
  EXPECT_NEAR(one["energy_parts_j.xpu_active"], 100.0 * busy, 1e-6 * 100 * busy);
  // Two: one prefill of 2000 tokens, whose all-reduces take c of its t.
  const std::string prefill = "saturated { num_requests: 1 input_tokens: 2000 output_tokens: 1 }";
  const std::string free_dir = FreshDir("active"), capped_dir = FreshDir("active_capped");
  auto f = RunScenario(Scenario("tensor_parallel: 2", prefill), free_dir, active);
  const scheduler::IterationCost plan =
      PrefillCost(Scenario("tensor_parallel: 2", prefill), 2000, active);
  const double c = plan.xpu_collective_s;
  EXPECT_GT(c, 0);
  EXPECT_DOUBLE_EQ(c, plan.stages[static_cast<int>(devices::Stage::kAllReduce)].time_s);
  const auto a = Iterations(free_dir);
  ASSERT_EQ(a.size(), 1u);
  const double t = a[0].first;
  EXPECT_NEAR(t, plan.xpu_busy_s, 1e-5 * t);  // (iterations.csv: 6 significant digits)
  EXPECT_NEAR(f["energy_parts_j.xpu_active"], 2 * 100.0 * (t - c), 1e-5 * 200 * t);
  // Capped at 200 W: while computing, the ops get 200 - 80 - 100 = 20 W
  // per xPU; over the stretched busy time t' the xPUs draw 80 + 100 (t' -
  // c) / t' + E / (2 t') = 200 on average.
  RunScenario(Scenario("tensor_parallel: 2 power { xpu_cap_w: 200 }", prefill), capped_dir,
              active);
  const auto b = Iterations(capped_dir);
  ASSERT_EQ(b.size(), 1u);
  const double ops = a[0].second - 2 * 100.0 * (t - c);
  const double want = (ops / 2 - 100.0 * c) / 20.0;
  ASSERT_GT(want, t);
  EXPECT_NEAR(b[0].first, want, 1e-5 * want);
}

// The H100 preset's busy power (devices/presets.cc [BUSY], docs/energy.md):
// one prefill of 16 tokens, memory-bound, costs 282 W over its time plus
// 1.22 pJ per FLOP and 28.72 pJ per DRAM byte, over the 121.7 W idle.
TEST(EnergyTest, H100BusyPowerByHand) {
  const std::string scenario = R"(
model { preset: "llama3.1-8b" }
cluster { xpu { preset: "h100-sxm-80gb" } }
workload { saturated { num_requests: 1 input_tokens: 16 output_tokens: 1 } }
)";
  const std::string dir = FreshDir("h100");
  auto f = RunScenario(scenario, dir);
  const scheduler::IterationCost plan = PrefillCost(scenario, 16, {});
  const auto it = Iterations(dir);
  ASSERT_EQ(it.size(), 1u);
  const double t = it[0].first;
  EXPECT_NEAR(t, plan.xpu_busy_s, 1e-5 * t);
  const double want = 282.0 * t + 1.22e-12 * plan.total.flops + 28.72e-12 * plan.total.dram_bytes;
  EXPECT_NEAR(it[0].second, want, 1e-5 * want);
  EXPECT_NEAR(f["energy_parts_j.xpu_active"], 282.0 * t, 1e-5 * 282 * t);
  EXPECT_NEAR(f["energy_parts_j.xpu_compute"], 1.22e-12 * plan.total.flops,
              1e-9 * f["energy_parts_j.xpu_compute"]);
  const double watts = 121.7 + it[0].second / t;
  EXPECT_GT(watts, 121.7 + 282);
  EXPECT_LT(watts, 700);
  EXPECT_EQ(f.count("tdp_limited_iterations"), 0u);
}

// The board's power limit: over their busy time the xPUs draw at most
// their TDP (400 W for the A100). A prefill whose active power and op
// energy would draw more keeps its time and is charged (400 - 80) W per
// xPU over it, the excess taken off the ops' compute energy.
TEST(EnergyTest, XpusDrawAtMostTheirTdpAndKeepTheirTime) {
  const std::string prefill = "saturated { num_requests: 1 input_tokens: 2000 output_tokens: 1 }";
  const std::vector<std::string> hot = {"--set", "cluster.xpu.active_power_w=300", "--set",
                                        "cluster.xpu.flop_energy_pj=2"};
  std::vector<std::string> unlimited = hot;
  unlimited.insert(unlimited.end(), {"--set", "cluster.xpu.tdp_w=100000"});
  const std::string lim_dir = FreshDir("tdp"), free_dir = FreshDir("tdp_free");
  auto lim = RunScenario(Scenario("", prefill), lim_dir, hot);
  auto free = RunScenario(Scenario("", prefill), free_dir, unlimited);
  const auto a = Iterations(free_dir), b = Iterations(lim_dir);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].first, b[0].first);
  const double t = a[0].first;
  ASSERT_GT(a[0].second, 320.0 * t);  // it would draw more than 400 W
  EXPECT_NEAR(b[0].second, 320.0 * t, 1e-5 * 320 * t);
  EXPECT_EQ(lim["tdp_limited_iterations"], 1);
  EXPECT_EQ(free.count("tdp_limited_iterations"), 0u);
  EXPECT_NEAR(free["energy_parts_j.xpu_compute"] - lim["energy_parts_j.xpu_compute"],
              a[0].second - b[0].second, 1e-4 * a[0].second);
  EXPECT_EQ(lim["energy_parts_j.xpu_active"], free["energy_parts_j.xpu_active"]);
}

TEST(EnergyTest, BadPowerFiguresAreRefusedNamingTheField) {
  const std::string dir = FreshDir("bad");
  const std::string workload = "saturated { num_requests: 1 input_tokens: 10 output_tokens: 2 }";
  for (const auto& [cluster, field] :
       {std::pair<std::string, std::string>{"power { xpu_cap_w: 50 }", "cluster.power.xpu_cap_w"},
        {"power { host_w_per_node: -1 }", "cluster.power.host_w_per_node"},
        {"power { attention_device_static_w: -2 }", "cluster.power.attention_device_static_w"}}) {
    WriteFile(dir + "/s.pbtxt", Scenario(cluster, workload));
    const auto r = RunServesim({"validate", dir + "/s.pbtxt"});
    EXPECT_NE(r.code, 0) << cluster;
    EXPECT_TRUE(absl::StrContains(r.out, field)) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "s.pbtxt:")) << r.out;
  }
  // Idle power above the board's TDP (400 W).
  WriteFile(dir + "/s.pbtxt", Scenario("", workload));
  const auto r =
      RunServesim({"validate", dir + "/s.pbtxt", "--set", "cluster.xpu.idle_power_w=500"});
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "cluster.xpu.idle_power_w = 500")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "400")) << r.out;
}

}  // namespace
}  // namespace servesim
