// A replica's power: the xPUs' power cap and board limit applied to each
// iteration, and its static power charged over the run (docs/energy.md).
//
// Contract:
//  - Plain arithmetic on one replica's figures: no SimGrid, no state shared
//    with other replicas. Figures in W, J, s; energies inside costs in pJ.
//  - ApplyCap and LimitToTdp change an iteration's cost before the engine
//    schedules the next one (the cap lengthens the iteration; the board
//    limit keeps its time and removes energy); each counts the iterations
//    it changed.
//  - Static power (the xPUs' idle power, the host's share, the attention
//    device's) is constant, so it is charged once, over the run's span,
//    when the run ends (ChargeStatic), not per iteration and idle gap.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_POWER_H_
#define SERVESIM_CLUSTER_POWER_H_

#include <cstdint>

#include "devices/device.h"
#include "metrics/collector.h"
#include "scenario/scenario.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

class PowerModel {
 public:
  // `pool`: the replica's resolved pool (borrowed); `attention`: its
  // attention device, or null.
  PowerModel(const scenario::ResolvedScenario* pool, const devices::Device* attention);

  // The xPU power cap (cluster.power.xpu_cap_w; none when 0). Over their
  // busy time the xPUs draw their idle and active power plus their ops'
  // energy / busy time on average; above the cap the clocks drop until the
  // average equals it: the busy time stretches to E / (n x (cap - idle -
  // active)), the ops' energy unchanged, and the iteration by as much.
  void ApplyCap(scheduler::IterationCost* c);

  // The xPUs' active power over their busy time but collectives
  // (cluster.xpu.active_power_w), in J, for iteration cost `c`.
  double ActiveJoules(const scheduler::IterationCost& c) const;

  // The board's power limit (cluster.xpu.tdp_w; none when 0): over their
  // busy time the xPUs draw at most their TDP. The kernels' times were
  // measured at that limit (GEMMs run power-limited), so the time stays
  // and the energy above it is not drawn: it comes off the ops' compute
  // energy (the clocks and voltage drop), then off `*active_j`.
  void LimitToTdp(scheduler::IterationCost* c, double* active_j);

  // The attention device was busy `s` seconds more (for ChargeStatic).
  void AddDeviceBusy(double s) { device_busy_total_s_ += s; }

  // Charges the replica's static power over the run's `span_s` (the
  // attention device's only while idle when its ops already charge it).
  void ChargeStatic(double span_s, metrics::MetricsCollector* metrics) const;

  // The static power drawn while the replica runs, in W, and its parts.
  double static_w() const { return xpu_static_w_ + device_static_w_ + host_w_; }
  double xpu_static_w() const { return xpu_static_w_; }
  double device_static_w() const { return device_static_w_; }
  double host_w() const { return host_w_; }

 private:
  const scenario::ResolvedScenario* pool_;
  double xpu_static_w_ = 0, host_w_ = 0, device_static_w_ = 0;
  bool device_static_in_ops_ = false;
  double device_busy_total_s_ = 0;
  int64_t capped_iterations_ = 0;
  int64_t tdp_limited_iterations_ = 0;  // at the board's power limit (LimitToTdp)
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_POWER_H_
