// The SimGrid platform of a run, built from the scenario: hosts for the
// clients, the router and every xPU, the front-end links, and for a
// disaggregated cluster or a cluster KV store the fabric between replicas
// (docs/disaggregation.md, "Platform"), or the user's platform file.
//
// Contract:
//  - Called once per run, before any actor, inside the run's SimGrid
//    engine. Hosts and links are created in a fixed order (replicas in
//    index order), so the same scenario gives the same platform.
//  - Fills the run's Fabric (cluster/fabric.h): links with their
//    bandwidths, routes, racks and pods, the collectives' rings.
//  - A platform file's problems (it does not parse, a replica's host or a
//    KV route is missing, a link without bandwidth) are INVALID_ARGUMENT
//    naming cluster.disaggregation.fabric.platform_file or the replica's
//    host field.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_PLATFORM_H_
#define SERVESIM_CLUSTER_PLATFORM_H_

#include <simgrid/s4u.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/fabric.h"
#include "scenario/scenario.h"

namespace servesim::cluster {

// The user's platform (fabric.platform_file), loaded into the engine:
// each replica's host, and the links of the routes from prefill replicas'
// hosts to decode replicas' (Fabric::file_routes).
struct FilePlatform {
  std::vector<simgrid::s4u::Host*> hosts;
  std::vector<simgrid::s4u::Link*> links;  // in the order the routes first cross them
  std::vector<std::vector<int>> routes;
};
absl::StatusOr<FilePlatform> LoadPlatformFile(const scenario::ResolvedScenario& sc,
                                              const simgrid::s4u::Engine& engine);

// Whether the pool's last KV tier is a cluster store.
bool HasClusterStore(const scenario::ResolvedScenario& pool);

// The hosts the actors run on.
struct PlatformHosts {
  std::vector<simgrid::s4u::Host*> engines;  // per replica: its first xPU
  simgrid::s4u::Host* clients = nullptr;
  simgrid::s4u::Host* router = nullptr;
};
// Builds servesim's own hosts and links (beside a platform file's, when
// `file` is not null) and fills `fabric`, whose prefill_replicas is set.
PlatformHosts BuildPlatform(const scenario::ResolvedScenario& sc, const FilePlatform* file,
                            Fabric* fabric);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_PLATFORM_H_
