// The network a run's KV and collectives cross: the platform's links with
// the traffic they carried, and the routes between replicas over them.
//
// Contract:
//  - Built once by BuildPlatform (cluster/platform.h) before any actor
//    runs, then only read, except the per-link counters (`links[i].bytes`,
//    their flows, `kv_flows_on`), which the parts that send flows update:
//    KV hand-offs (cluster/kv_transfer.h), collectives on the fabric and a
//    cluster store's loads (cluster/fabric_flows.h).
//  - Link indices: one NIC link per replica (index = replica), then the
//    racks' uplinks, then the pods', then (share_nodes) one NVLink link per
//    replica from `nvlink_base`; with a platform file, the file's links in
//    the order its KV routes first cross them.
//  - A direction is 0 (up: out of a replica's NIC, towards the spine) or 1
//    (down: into a replica's NIC); full-duplex links use 0 only.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_FABRIC_H_
#define SERVESIM_CLUSTER_FABRIC_H_

#include <cstddef>
#include <cstdint>
#include <simgrid/s4u.hpp>
#include <utility>
#include <vector>

#include "metrics/collector.h"

namespace servesim::cluster {

struct Fabric {
  // The platform's links with the traffic they carried (summary.json,
  // links.csv), indexed as above.
  std::vector<metrics::LinkLoad> links;
  std::vector<int> rack_of, pod_of;  // per replica; -1 without racks or pods
  int racks = 0;
  // The first decode replica of a disaggregated cluster (0: colocated).
  int64_t prefill_replicas = 0;
  // With cluster.disaggregation.share_nodes: each replica's (first) node,
  // and where its NVLink link is in `links` (-1: no NVLink routes).
  std::vector<int64_t> node_of;
  int nvlink_base = -1;
  double link_bin_s = 1.0;
  // A platform file's (fabric.platform_file): each replica's host there,
  // and per prefill replica p and decode replica d the indices in `links`
  // of its route, at [p x decode replicas + d - prefill replicas].
  std::vector<simgrid::s4u::Host*> file_hosts;
  std::vector<std::vector<int>> file_routes;
  // Where each replica's KV flows leave from and land (its first xPU's
  // host, or its host in the platform file); where each decode replica's
  // receiver runs (a host of its own, which the prefill replicas' notices
  // reach at once).
  std::vector<simgrid::s4u::Host*> kv_hosts, receiver_hosts;
  // Per link, its first index in the live metrics' list (LiveSink::OnLinks).
  std::vector<int> live_link;
  // Per link, the KV flows on it now (sent, not yet landed).
  std::vector<int> kv_flows_on;

  // Collectives on the fabric (docs/disaggregation.md): per replica whose
  // xPUs span nodes (none with a platform file), the flows that carry a
  // step's bytes out of its nodes' NICs from its host: over its NIC link
  // the hops of the ring over its nodes that stay in a rack, together, and
  // each hop between racks on its own over the uplinks too.
  struct CollectiveHop {
    simgrid::s4u::Host* to = nullptr;
    double share = 0;                        // of the step's bytes
    std::vector<std::pair<int, int>> links;  // (index in `links`, direction)
  };
  struct Collectives {
    std::vector<CollectiveHop> hops;
    double nic_bw = 0, latency = 0;  // the NIC link's, the in-rack route's
    bool crosses_racks = false;
  };
  std::vector<Collectives> collectives;  // per replica; empty: none

  // Whether replica `r`'s steps send collectives as flows.
  bool HasCollectives(int r) const {
    return !collectives.empty() && !collectives[static_cast<size_t>(r)].hops.empty();
  }
  // Whether replicas a and b exchange their flows over their node's NVLink.
  bool SameNode(int a, int b) const {
    return nvlink_base >= 0 && node_of[static_cast<size_t>(a)] == node_of[static_cast<size_t>(b)];
  }
  // Calls f(link index, direction) for each link of the route from
  // replica a to replica b (BuildPlatform's routes: from a prefill replica
  // to a decode replica, and between replicas of a pool with a cluster KV
  // store; with a platform file, prefill to decode only): out of a's NIC
  // link, up and down the uplinks between their racks and pods, into b's.
  template <typename F>
  void ForRoute(int a, int b, F f) const {
    if (!file_routes.empty()) {
      const size_t decode = rack_of.size() - static_cast<size_t>(prefill_replicas);
      for (int l : file_routes[static_cast<size_t>(a) * decode +
                               static_cast<size_t>(b - prefill_replicas)]) {
        f(l, 0);
      }
      return;
    }
    if (SameNode(a, b)) {
      f(nvlink_base + a, 0);
      f(nvlink_base + b, 1);
      return;
    }
    f(a, 0);
    const int ra = rack_of[a], rb = rack_of[b];
    if (ra >= 0 && ra != rb) {
      const int nics = static_cast<int>(rack_of.size());
      f(nics + ra, 0);
      const int pa = pod_of[a], pb = pod_of[b];
      if (pa >= 0 && pa != pb) {
        f(nics + racks + pa, 0);
        f(nics + racks + pb, 1);
      }
      f(nics + rb, 1);
    }
    f(b, 1);
  }
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_FABRIC_H_
