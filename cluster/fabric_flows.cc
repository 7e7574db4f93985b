#include "cluster/fabric_flows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace servesim::cluster {

namespace sg4 = simgrid::s4u;

void FabricFlows::SleepUntil(double t) {
  ++sh_->engine_waits;
  sg4::this_actor::sleep_until(t);
}

double FabricFlows::Collectives(double start, double duration, double bytes) {
  Fabric& fabric = sh_->fabric;
  const Fabric::Collectives& c = fabric.collectives[static_cast<size_t>(replica_)];
  const double alone = c.latency + bytes / c.nic_bw;
  const bool shared = c.crosses_racks || fabric.kv_flows_on[replica_] > 0 ||
                      (role_ == Role::kDecode && !(start + duration < sh_->HandoffFloor()));
  double end = start + alone, extra = 0;
  if (shared) {
    if (sg4::Engine::get_clock() < start) SleepUntil(start);
    flows_.clear();
    for (const Fabric::CollectiveHop& hop : c.hops) {
      flows_.push_back(sg4::Comm::sendto_async(
          fabric.kv_hosts[replica_], hop.to, static_cast<uint64_t>(std::ceil(bytes * hop.share))));
    }
    sg4::Comm::wait_all(flows_);
    end = sg4::Engine::get_clock();
    // Below SimGrid's timing precision (1 ns), or bytes rounded up to
    // whole ones, the flows were alone.
    extra = end - start - alone;
    if (extra < 1e-9) extra = 0;
  }
  for (const Fabric::CollectiveHop& hop : c.hops) {
    for (const auto& [l, dir] : hop.links) {
      metrics::LinkLoad& link = fabric.links[l];
      link.bytes += bytes * hop.share;
      link.AddFlow(dir, bytes * hop.share, start, end, fabric.link_bin_s);
      if (sh_->live != nullptr) {
        sh_->live->OnLinkBytes(fabric.live_link[l] + dir, bytes * hop.share);
      }
    }
  }
  sh_->metrics->AddCollectives(bytes, shared, extra);
  return extra;
}

double FabricFlows::StoreFlows(const Ranks& ranks, double start) {
  Fabric& fabric = sh_->fabric;
  const double bytes_per_block = pool_->batching.kv_tiers.back().bytes_per_block;
  flows_.clear();
  store_flows_of_step_.clear();
  double total = 0, latency = std::numeric_limits<double>::infinity();
  for (const auto& r : ranks) {
    if (r->batch == nullptr) continue;
    for (const auto& [home, blocks] : r->batch->kv_store_from) {
      if (home == replica_) continue;
      StoreFlow f;
      f.home = home;
      f.bytes = static_cast<double>(blocks) * bytes_per_block;
      fabric.ForRoute(home, replica_, [&](int l, int dir) {
        f.links.emplace_back(l, dir);
        ++fabric.kv_flows_on[l];
      });
      std::vector<sg4::Link*> route;
      double route_latency = 0;
      fabric.kv_hosts[home]->route_to(fabric.kv_hosts[replica_], route, &route_latency);
      latency = std::min(latency, route_latency);
      total += f.bytes;
      store_flows_of_step_.push_back(std::move(f));
    }
  }
  if (store_flows_of_step_.empty()) return 0;
  if (sg4::Engine::get_clock() < start) SleepUntil(start);
  for (const StoreFlow& f : store_flows_of_step_) {
    flows_.push_back(sg4::Comm::sendto_async(fabric.kv_hosts[f.home], fabric.kv_hosts[replica_],
                                             static_cast<uint64_t>(std::ceil(f.bytes))));
  }
  sg4::Comm::wait_all(flows_);
  const double end = sg4::Engine::get_clock();
  const double alone = latency + total / fabric.links[replica_].bandwidth_bytes_per_s;
  // Below SimGrid's timing precision (1 ns), or bytes rounded up to
  // whole ones, the flows were alone.
  double extra = end - start - alone;
  if (extra < 1e-9) extra = 0;
  for (const StoreFlow& f : store_flows_of_step_) {
    for (const auto& [l, dir] : f.links) {
      --fabric.kv_flows_on[l];
      metrics::LinkLoad& link = fabric.links[l];
      link.bytes += f.bytes;
      link.AddFlow(dir, f.bytes, start, end, fabric.link_bin_s);
      if (sh_->live != nullptr) sh_->live->OnLinkBytes(fabric.live_link[l] + dir, f.bytes);
    }
  }
  sh_->metrics->AddStoreFlows(total, extra);
  return extra;
}

}  // namespace servesim::cluster
