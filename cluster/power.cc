#include "cluster/power.h"

#include <algorithm>

namespace servesim::cluster {

PowerModel::PowerModel(const scenario::ResolvedScenario* pool, const devices::Device* attention)
    : pool_(pool) {
  // The xPUs' idle power, the host's share, and the attention device's
  // (the scenario's figure, else the device model's).
  xpu_static_w_ = pool->xpu_idle_power_w * static_cast<double>(pool->xpus_per_replica());
  host_w_ = pool->host_power_w;
  if (attention != nullptr) {
    const devices::DeviceDescription d = attention->Describe();
    device_static_w_ = pool->attention_static_w >= 0 ? pool->attention_static_w : d.static_power_w;
    device_static_in_ops_ = d.static_in_op_energy;
  }
}

void PowerModel::ApplyCap(scheduler::IterationCost* c) {
  if (!(pool_->xpu_power_cap_w > 0)) return;
  const double n = static_cast<double>(pool_->xpus_per_replica());
  const double e_j = (c->total.energy_pj() - c->device_total.energy_pj()) * 1e-12;
  if (!(c->xpu_busy_s > 0) || !(e_j > 0)) return;
  // Active power is not drawn during collectives, which the clocks do
  // not lengthen: idle + active (t - c) / t + E / (n t) = cap.
  const double need_s =
      (e_j / n - pool_->xpu_active_power_w * c->xpu_collective_s) /
      (pool_->xpu_power_cap_w - pool_->xpu_idle_power_w - pool_->xpu_active_power_w);
  if (!(need_s > c->xpu_busy_s)) return;
  const double stretch = need_s - c->xpu_busy_s;
  c->xpu_busy_s = need_s;
  c->time_s += stretch;
  c->total.time_s += stretch;
  ++capped_iterations_;
}

double PowerModel::ActiveJoules(const scheduler::IterationCost& c) const {
  return pool_->xpu_active_power_w * static_cast<double>(pool_->xpus_per_replica()) *
         std::max(0.0, c.xpu_busy_s - c.xpu_collective_s);
}

void PowerModel::LimitToTdp(scheduler::IterationCost* c, double* active_j) {
  if (!(pool_->xpu_tdp_w > 0)) return;
  const double n = static_cast<double>(pool_->xpus_per_replica());
  const double limit_j = (pool_->xpu_tdp_w - pool_->xpu_idle_power_w) * n * c->xpu_busy_s;
  const double xpu_j = (c->total.energy_pj() - c->device_total.energy_pj()) * 1e-12 + *active_j;
  if (!(xpu_j > limit_j)) return;
  double excess_pj = (xpu_j - limit_j) * 1e12;
  const double xpu_compute_pj = c->total.compute_energy_pj - c->device_total.compute_energy_pj;
  const double cut_pj = std::min(excess_pj, std::max(0.0, xpu_compute_pj));
  c->total.compute_energy_pj -= cut_pj;
  excess_pj -= cut_pj;
  *active_j = std::max(0.0, *active_j - excess_pj * 1e-12);
  ++tdp_limited_iterations_;
}

void PowerModel::ChargeStatic(double span_s, metrics::MetricsCollector* metrics) const {
  const double device_s =
      device_static_in_ops_ ? std::max(0.0, span_s - device_busy_total_s_) : span_s;
  metrics->AddStaticEnergy(xpu_static_w_ * span_s, device_static_w_ * device_s, host_w_ * span_s,
                           capped_iterations_, tdp_limited_iterations_);
}

}  // namespace servesim::cluster
