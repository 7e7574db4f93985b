// cluster::PowerModel on its own (cluster/power.h): the xPU power cap, the
// board's power limit and the static power, worked by hand. The same rules
// through whole runs are EnergyTest.* (tests/cluster/energy_test.cc).
#include "cluster/power.h"

#include "gtest/gtest.h"
#include "metrics/collector.h"

namespace servesim::cluster {
namespace {

// A replica of 2 xPUs (TP2, one rank): idle 50 W and active 100 W each.
scenario::ResolvedScenario Pool() {
  scenario::ResolvedScenario pool;
  pool.tensor_parallel = 2;
  pool.xpu_idle_power_w = 50;
  pool.xpu_active_power_w = 100;
  pool.host_power_w = 30;
  return pool;
}

// An iteration whose xPU ops drew 600 J (compute) over 1 s busy, 0.2 s of
// it collectives.
scheduler::IterationCost Iteration() {
  scheduler::IterationCost c;
  c.time_s = 1.2;
  c.total.time_s = 1.2;
  c.total.compute_energy_pj = 600e12;
  c.xpu_busy_s = 1.0;
  c.xpu_collective_s = 0.2;
  return c;
}

// An attention device that says what it draws whenever powered.
class StaticDevice : public devices::Device {
 public:
  StaticDevice(double static_w, bool in_ops) : static_w_(static_w), in_ops_(in_ops) {}
  devices::DeviceDescription Describe() const override {
    devices::DeviceDescription d;
    d.kind = "static";
    d.static_power_w = static_w_;
    d.static_in_op_energy = in_ops_;
    return d;
  }
  absl::Status Estimate(absl::Span<const devices::Op>, absl::Span<devices::Cost>) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<devices::AttentionResult> Execute(const devices::AttentionCall&) const override {
    return absl::FailedPreconditionError("costs only");
  }

 private:
  double static_w_;
  bool in_ops_;
};

TEST(PowerModelTest, ACapAboveTheDrawChangesNothing) {
  scenario::ResolvedScenario pool = Pool();
  pool.xpu_power_cap_w = 1000;  // the iteration draws 50 + 100 x 0.8 + 300 = 430 W per xPU
  PowerModel power(&pool, nullptr);
  scheduler::IterationCost c = Iteration();
  power.ApplyCap(&c);
  EXPECT_DOUBLE_EQ(c.xpu_busy_s, 1.0);
  EXPECT_DOUBLE_EQ(c.time_s, 1.2);
}

TEST(PowerModelTest, ACapStretchesTheBusyTimeByHand) {
  scenario::ResolvedScenario pool = Pool();
  pool.xpu_power_cap_w = 300;
  PowerModel power(&pool, nullptr);
  scheduler::IterationCost c = Iteration();
  power.ApplyCap(&c);
  // idle + active (t - 0.2) / t + 300 J / t = 300 W per xPU:
  // t = (300 - 100 x 0.2) / (300 - 50 - 100) = 280 / 150 s.
  const double t = 280.0 / 150.0;
  EXPECT_DOUBLE_EQ(c.xpu_busy_s, t);
  EXPECT_DOUBLE_EQ(c.time_s, 1.2 + (t - 1.0));
  EXPECT_DOUBLE_EQ(c.total.time_s, 1.2 + (t - 1.0));
  EXPECT_DOUBLE_EQ(c.total.compute_energy_pj, 600e12);  // the ops' energy is unchanged
  // Active power over the new busy time but collectives: 2 x 100 W x (t - 0.2).
  EXPECT_DOUBLE_EQ(power.ActiveJoules(c), 2 * 100 * (t - 0.2));
}

TEST(PowerModelTest, TheBoardLimitCutsComputeEnergyFirst) {
  scenario::ResolvedScenario pool = Pool();
  pool.xpu_tdp_w = 400;  // at most (400 - 50) x 2 x 1 s = 700 J above idle
  PowerModel power(&pool, nullptr);
  scheduler::IterationCost c = Iteration();
  double active_j = power.ActiveJoules(c);  // 2 x 100 x 0.8 = 160 J
  EXPECT_DOUBLE_EQ(active_j, 160);
  power.LimitToTdp(&c, &active_j);
  // 600 + 160 = 760 J drawn: 60 J come off the compute energy (to within
  // the pJ <-> J conversions' rounding).
  EXPECT_NEAR(c.total.compute_energy_pj, 540e12, 1e3);
  EXPECT_DOUBLE_EQ(active_j, 160);
  EXPECT_DOUBLE_EQ(c.time_s, 1.2);  // the kernels' times were measured at the limit
}

TEST(PowerModelTest, TheBoardLimitThenCutsActivePower) {
  scenario::ResolvedScenario pool = Pool();
  pool.xpu_tdp_w = 400;
  PowerModel power(&pool, nullptr);
  scheduler::IterationCost c = Iteration();
  c.total.compute_energy_pj = 20e12;
  c.total.dram_energy_pj = 600e12;
  double active_j = 160;
  power.LimitToTdp(&c, &active_j);
  // 620 + 160 = 780 J: 80 J over, 20 J of compute, then 60 J of active power.
  EXPECT_DOUBLE_EQ(c.total.compute_energy_pj, 0);
  EXPECT_DOUBLE_EQ(c.total.dram_energy_pj, 600e12);
  EXPECT_NEAR(active_j, 100, 1e-9);
}

TEST(PowerModelTest, StaticPowerOverTheSpanAndTheDevicesOnlyWhileIdle) {
  scenario::ResolvedScenario pool = Pool();
  pool.xpu_power_cap_w = 300;
  // Capped to 280 / 150 s busy, the xPUs draw 600 J + 2 x 100 W x (t - 0.2
  // s) = 933 J above idle, over the (250 - 50) x 2 x t = 747 J the limit
  // allows.
  pool.xpu_tdp_w = 250;
  const StaticDevice in_ops(20, /*in_ops=*/true);
  PowerModel power(&pool, &in_ops);
  EXPECT_DOUBLE_EQ(power.static_w(), 2 * 50 + 20 + 30);
  scheduler::IterationCost c = Iteration();
  power.ApplyCap(&c);  // capped: one iteration
  double active_j = power.ActiveJoules(c);
  power.LimitToTdp(&c, &active_j);
  power.AddDeviceBusy(4);
  metrics::MetricsCollector metrics(metrics::MetricsOptions{});
  power.ChargeStatic(10, &metrics);
  metrics.Finish();
  const metrics::Summary s = metrics::ComputeSummary(metrics);
  EXPECT_DOUBLE_EQ(s.energy_parts.xpu_idle, 2 * 50 * 10);
  EXPECT_DOUBLE_EQ(s.energy_parts.device_static, 20 * (10 - 4));  // its ops charge it while busy
  EXPECT_DOUBLE_EQ(s.energy_parts.host, 30 * 10);
  EXPECT_EQ(s.power_capped_iterations, 1);
  EXPECT_EQ(s.tdp_limited_iterations, 1);
}

TEST(PowerModelTest, AScenariosStaticFigureOverridesTheDevices) {
  scenario::ResolvedScenario pool = Pool();
  pool.attention_static_w = 7;
  const StaticDevice device(20, /*in_ops=*/false);
  PowerModel power(&pool, &device);
  EXPECT_DOUBLE_EQ(power.device_static_w(), 7);
  power.AddDeviceBusy(4);
  metrics::MetricsCollector metrics(metrics::MetricsOptions{});
  power.ChargeStatic(10, &metrics);
  metrics.Finish();
  EXPECT_DOUBLE_EQ(metrics::ComputeSummary(metrics).energy_parts.device_static, 7 * 10);
}

}  // namespace
}  // namespace servesim::cluster
