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
#include "gtest/gtest.h"
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
  const double parts =
      f["energy_parts_j.xpu_compute"] + f["energy_parts_j.xpu_memory"] + f["energy_parts_j.links"];
  EXPECT_NEAR(parts, f["energy_dynamic_j"], 1e-6 * parts);
  EXPECT_NEAR(f["energy_j"], f["energy_static_j"] + f["energy_dynamic_j"], 1e-6 * f["energy_j"]);
  EXPECT_NEAR(f["power_mean_w"], f["energy_j"] / t, 1e-6 * f["power_mean_w"]);
  EXPECT_NEAR(f["energy_per_token_j"], f["energy_j"] / 80, 1e-6 * f["energy_per_token_j"]);
  EXPECT_NEAR(f["energy_per_request_j"], f["energy_j"] / 4, 1e-6 * f["energy_per_request_j"]);
  // The busiest iteration's power: a replica's 410 W plus its ops' energy
  // over the iteration, never above the 2 x 400 W TDP plus the host share.
  EXPECT_GT(f["power_peak_replica_w"], 410);
  EXPECT_LT(f["power_peak_replica_w"], 2 * 400 + 250);
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
  // One prefill of 2,000 tokens on one A100: its ops draw about 46 W above
  // idle (5.7 J in 0.124 s), over a cap of 100 W (20 W above idle).
  const std::string workload = "saturated { num_requests: 1 input_tokens: 2000 output_tokens: 2 }";
  const std::string free_dir = FreshDir("free"), capped_dir = FreshDir("capped");
  auto free = RunScenario(Scenario("", workload), free_dir);
  auto capped = RunScenario(Scenario("power { xpu_cap_w: 100 }", workload), capped_dir);
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

// cluster.xpu.active_power_w is drawn over the xPUs' busy time (a
// GPU-only replica's xPUs are busy for the whole iteration), and the cap
// leaves the ops cap - idle - active.
TEST(EnergyTest, ActivePowerOverTheBusyTimeAndUnderTheCap) {
  const std::string workload = "saturated { num_requests: 2 input_tokens: 2000 output_tokens: 4 }";
  const std::string free_dir = FreshDir("active"), capped_dir = FreshDir("active_capped");
  const std::vector<std::string> active = {"--set", "cluster.xpu.active_power_w=100"};
  auto f = RunScenario(Scenario("tensor_parallel: 2", workload), free_dir, active);
  double busy = 0;
  for (const auto& [d, e] : Iterations(free_dir)) busy += d;
  EXPECT_NEAR(f["energy_parts_j.xpu_active"], 2 * 100.0 * busy, 1e-6 * 200 * busy);
  // Capped at 200 W: the ops get 200 - 80 - 100 = 20 W per xPU.
  RunScenario(Scenario("tensor_parallel: 2 power { xpu_cap_w: 200 }", workload), capped_dir,
              active);
  const auto a = Iterations(free_dir), b = Iterations(capped_dir);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  const double t = a[0].first, ops = a[0].second - 2 * 100.0 * t;
  ASSERT_GT(ops / (2 * 20.0), t);
  // (iterations.csv prints 6 significant digits.)
  EXPECT_NEAR(b[0].first, ops / (2 * 20.0), 1e-5 * b[0].first);
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
