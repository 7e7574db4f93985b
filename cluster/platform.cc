#include "cluster/platform.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/run_state.h"
#include "cluster/simulation.h"
#include "common/status_macros.h"

namespace servesim::cluster {

namespace sg4 = simgrid::s4u;
using scenario::ResolvedScenario;

namespace {

// Names servesim's own hosts and links take beside a platform file's.
constexpr const char* kOwnPrefix = "servesim.";

// A replica's host named by the scenario, looked up in the loaded file.
absl::StatusOr<sg4::Host*> ReplicaHost(const ResolvedScenario& sc, const sg4::Engine& engine,
                                       int64_t r, std::vector<std::string> names) {
  const std::string field = "cluster.disaggregation.fabric.platform_file";
  const bool named = sc.proto.cluster().disaggregation().fabric().replica_hosts_size() > 0;
  const std::string& name = sc.replica_hosts[r];
  sg4::Host* h = engine.host_by_name_or_null(name);
  if (h != nullptr) return h;
  if (names.size() > 12) {
    names.resize(12);
    names.push_back("...");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      named ? absl::StrCat("cluster.disaggregation.fabric.replica_hosts[", r, "] = \"", name, "\"")
            : absl::StrCat(field, ": replica ", r, "'s host \"", name,
                           "\" (the default; cluster.disaggregation.fabric.replica_hosts "
                           "names others)"),
      ": no such host in ", sc.platform_file, " (its hosts: ", absl::StrJoin(names, ", "), ")"));
}

// The routes from every prefill replica's host to every decode replica's,
// their links indexed in the order they are first crossed.
absl::Status AddFileRoutes(const ResolvedScenario& sc, FilePlatform* out) {
  const std::string field = "cluster.disaggregation.fabric.platform_file";
  const std::string& file = sc.platform_file;
  absl::flat_hash_map<const sg4::Link*, int> index;
  const int64_t prefill = sc.prefill_pool->replicas;
  for (int64_t p = 0; p < prefill; ++p) {
    for (int64_t d = prefill; d < sc.replicas; ++d) {
      std::vector<sg4::Link*> links;
      double latency = 0;
      const std::string where = absl::StrCat(
          "the route from host \"", sc.replica_hosts[p], "\" (prefill replica ", p, ") to host \"",
          sc.replica_hosts[d], "\" (decode replica ", d, ") in ", file);
      try {
        out->hosts[p]->route_to(out->hosts[d], links, &latency);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", where, ": ", e.what()));
      }
      if (links.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", where, " is missing: the KV transfer needs one"));
      }
      std::vector<int>& route = out->routes.emplace_back();
      for (sg4::Link* l : links) {
        if (!(l->get_bandwidth() > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": link \"", l->get_name(), "\" on ", where, " has bandwidth ",
              l->get_bandwidth(), ": a KV transfer over it could never complete; expected > 0"));
        }
        auto [it, added] = index.emplace(l, static_cast<int>(out->links.size()));
        if (added) out->links.push_back(l);
        route.push_back(it->second);
      }
    }
  }
  return absl::OkStatus();
}

metrics::LinkLoad LinkLoadOf(std::string name, double bandwidth, bool split_duplex) {
  metrics::LinkLoad load;
  load.name = std::move(name);
  load.bandwidth_bytes_per_s = bandwidth;
  load.split_duplex = split_duplex;
  return load;
}

// Builds servesim's hosts and links into one zone and fills the Fabric.
class PlatformBuilder {
 public:
  PlatformBuilder(const ResolvedScenario& sc, const FilePlatform* file, Fabric* fabric)
      : sc_(sc), file_(file), fabric_(*fabric), own_(file != nullptr ? kOwnPrefix : "") {}

  PlatformHosts Build() {
    // Beside a platform file, servesim's hosts and links sit in a zone of
    // their own under the file's root, their names prefixed.
    zone_ = sg4::create_full_zone(own_ + "cluster");
    if (file_ != nullptr) zone_->set_parent(sg4::Engine::get_instance()->get_netzone_root());
    BuildReplicas();
    if (sc_.disaggregated()) BuildReceivers();
    if (file_ != nullptr) {
      UseFileRoutes();
    } else if (sc_.disaggregated()) {
      BuildNics();
      BuildUplinks();
      BuildNvlinks();
      BuildCollectiveRings();
      BuildKvRoutes();
    } else if (HasClusterStore(sc_)) {
      BuildStoreLinks();
    }
    fabric_.kv_flows_on.assign(fabric_.links.size(), 0);
    zone_->seal();
    return hosts_;
  }

 private:
  sg4::Link* MakeLink(const std::string& name, const servesim::v1::LinkSpec& l) {
    return zone_->create_link(own_ + name, l.bandwidth_bytes_per_s())
        ->set_latency(l.latency_s())
        ->seal();
  }
  void Route(sg4::Host* a, sg4::Host* b, const std::vector<sg4::LinkInRoute>& links,
             bool symmetrical) {
    zone_->add_route(a->get_netpoint(), b->get_netpoint(), nullptr, nullptr, links, symmetrical);
  }

  // The clients and the router, each replica's xPUs with their links to
  // the replica's switch, and the front-end links.
  void BuildReplicas() {
    hosts_.clients = zone_->create_host(own_ + "clients", 1e9);
    hosts_.router = zone_->create_host(own_ + "router", 1e9);
    const auto& front = PoolOf(sc_, 0).proto.cluster();
    auto* in = MakeLink("frontend.in", front.frontend());
    Route(hosts_.clients, hosts_.router, {sg4::LinkInRoute(in)}, true);
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      const ResolvedScenario& pool = PoolOf(sc_, r);
      const auto& c = pool.proto.cluster();
      std::vector<sg4::Host*> xpus;
      std::vector<sg4::Link*> links;
      for (int64_t j = 0; j < pool.tensor_parallel; ++j) {
        xpus.push_back(
            zone_->create_host(absl::StrCat(own_, "r", r, ".xpu", j), c.xpu().peak_flops_fp16()));
        links.push_back(MakeLink(absl::StrCat("r", r, ".xpu", j, ".link"), c.interconnect()));
      }
      auto* fe = MakeLink(absl::StrCat("r", r, ".frontend"), c.frontend());
      Route(hosts_.router, xpus[0], {sg4::LinkInRoute(fe)}, true);
      for (int64_t j = 1; j < pool.tensor_parallel; ++j) {
        Route(xpus[0], xpus[j], {sg4::LinkInRoute(links[0]), sg4::LinkInRoute(links[j])}, true);
      }
      hosts_.engines.push_back(xpus[0]);
    }
  }

  // Each decode replica's receiver sits on a host of its own; the prefill
  // replicas' notices of KV flows (and of their streams' end) reach it
  // over a link that takes no time.
  void BuildReceivers() {
    auto* notices = zone_->create_link(own_ + "kv.notices", 1e30)->set_latency(0)->seal();
    fabric_.receiver_hosts.assign(static_cast<size_t>(sc_.replicas), nullptr);
    for (int64_t d = sc_.prefill_pool->replicas; d < sc_.replicas; ++d) {
      fabric_.receiver_hosts[d] = zone_->create_host(absl::StrCat(own_, "r", d, ".kv"), 1e9);
      for (int64_t p = 0; p < sc_.prefill_pool->replicas; ++p) {
        Route(hosts_.engines[p], fabric_.receiver_hosts[d], {sg4::LinkInRoute(notices)}, false);
      }
    }
    fabric_.kv_hosts = file_ != nullptr ? file_->hosts : hosts_.engines;
  }

  // KV flows over the file's routes.
  void UseFileRoutes() {
    for (const sg4::Link* l : file_->links) {
      fabric_.links.push_back(LinkLoadOf(l->get_name(), l->get_bandwidth(), false));
    }
    fabric_.file_hosts = file_->hosts;
    fabric_.file_routes = file_->routes;
    fabric_.rack_of.assign(static_cast<size_t>(sc_.replicas), -1);
    fabric_.pod_of.assign(static_cast<size_t>(sc_.replicas), -1);
  }

  // Each replica's NICs as one link of their summed bandwidth; nodes in
  // racks, each pool from a fresh node (docs/disaggregation.md,
  // "Platform").
  void BuildNics() {
    node_of_.assign(static_cast<size_t>(sc_.replicas), 0);
    nodes_of_.assign(static_cast<size_t>(sc_.replicas), 1);
    int64_t used = 0, per_node = 0;  // xPUs used on the current node, its size
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      const ResolvedScenario& pool = PoolOf(sc_, r);
      const auto& c = pool.proto.cluster();
      const int64_t xpus = pool.tensor_parallel * pool.ranks();
      const int64_t size = c.xpus_per_node() > 0 ? c.xpus_per_node() : xpus;
      const bool share = sc_.proto.cluster().disaggregation().share_nodes();
      const bool pool_start = r == 0 || (r == sc_.prefill_pool->replicas && !share);
      if (pool_start || used + std::min(xpus, size) > per_node) {
        node_nic_bw_.push_back(static_cast<double>(size) * c.internode().bandwidth_bytes_per_s());
        used = 0;
        per_node = size;
      }
      node_of_[r] = static_cast<int64_t>(node_nic_bw_.size()) - 1;
      // A replica larger than a node takes whole nodes.
      const int64_t extra = (xpus + size - 1) / size - 1;
      nodes_of_[r] = extra + 1;
      for (int64_t k = 0; k < extra; ++k) node_nic_bw_.push_back(node_nic_bw_.back());
      used = xpus > size ? size : used + xpus;
      const double bw = static_cast<double>(xpus) * c.internode().bandwidth_bytes_per_s();
      nics_.push_back(zone_->create_split_duplex_link(absl::StrCat("r", r, ".nic"), bw)
                          ->set_latency(c.internode().latency_s())
                          ->seal());
      fabric_.links.push_back(LinkLoadOf(absl::StrCat("r", r, ".nic"), bw, true));
    }
  }

  // One uplink per group of `per` members (racks of nodes, pods of racks),
  // the members' bandwidths `member_bw`: each carries its group's most
  // member bandwidth x `per` / `oversubscription` each way, with half of
  // `latency` (docs/disaggregation.md, "Platform"). Returns the uplinks'
  // bandwidths.
  std::vector<double> MakeUplinks(const char* kind, const std::vector<double>& member_bw,
                                  int64_t per, double oversubscription, double latency,
                                  std::vector<sg4::Link*>* ups) {
    std::vector<double> bws;
    const int64_t members = static_cast<int64_t>(member_bw.size());
    for (int64_t k = 0; k * per < members; ++k) {
      double most = 0;
      for (int64_t n = k * per; n < std::min((k + 1) * per, members); ++n) {
        most = std::max(most, member_bw[n]);
      }
      const double bw = static_cast<double>(per) * most / oversubscription;
      const std::string name = absl::StrCat(kind, k, ".uplink");
      auto* up = zone_->create_split_duplex_link(name, bw);
      up->set_latency(latency / 2)->seal();
      ups->push_back(up);
      bws.push_back(bw);
      fabric_.links.push_back(LinkLoadOf(name, bw, true));
    }
    return bws;
  }

  // Racks joined through a spine, pods through a core, over split-duplex
  // uplinks; each replica's rack and pod.
  void BuildUplinks() {
    const auto& fabric = sc_.proto.cluster().disaggregation().fabric();
    per_rack_ = fabric.nodes_per_rack();
    if (per_rack_ > 0) {
      const std::vector<double> bws =
          MakeUplinks("rack", node_nic_bw_, per_rack_, fabric.oversubscription(),
                      fabric.spine_latency_s(), &uplinks_);
      fabric_.racks = static_cast<int>(uplinks_.size());
      if (fabric.racks_per_pod() > 0) {
        MakeUplinks("pod", bws, fabric.racks_per_pod(), fabric.pod_oversubscription(),
                    fabric.core_latency_s(), &pod_uplinks_);
      }
    }
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      const int rack = per_rack_ > 0 ? static_cast<int>(node_of_[r] / per_rack_) : -1;
      fabric_.rack_of.push_back(rack);
      fabric_.pod_of.push_back(pod_uplinks_.empty() ? -1 : rack / fabric.racks_per_pod());
    }
  }

  // Replicas sharing nodes reach each other over NVLink: each replica's
  // xPUs' links to the node's switch, summed per direction.
  void BuildNvlinks() {
    if (!sc_.proto.cluster().disaggregation().share_nodes()) return;
    fabric_.node_of = node_of_;
    fabric_.nvlink_base = static_cast<int>(fabric_.links.size());
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      const ResolvedScenario& pool = PoolOf(sc_, r);
      const auto& link = pool.proto.cluster().interconnect();
      const double bw =
          static_cast<double>(pool.tensor_parallel * pool.ranks()) * link.bandwidth_bytes_per_s();
      const std::string name = absl::StrCat("r", r, ".nvlink");
      nvlinks_.push_back(
          zone_->create_split_duplex_link(name, bw)->set_latency(link.latency_s())->seal());
      fabric_.links.push_back(LinkLoadOf(name, bw, true));
    }
  }

  // Fabric::links' index -> the SimGrid link.
  sg4::LinkInRoute LinkOf(int l, int dir) const {
    const int nics_n = static_cast<int>(sc_.replicas);
    const int pods_end = nics_n + fabric_.racks + static_cast<int>(pod_uplinks_.size());
    sg4::Link* link = l < nics_n                   ? nics_[l]
                      : l < nics_n + fabric_.racks ? uplinks_[l - nics_n]
                      : l < pods_end               ? pod_uplinks_[l - nics_n - fabric_.racks]
                                                   : nvlinks_[l - pods_end];
    return sg4::LinkInRoute(
        link, dir == 0 ? sg4::LinkInRoute::Direction::UP : sg4::LinkInRoute::Direction::DOWN);
  }

  // Collectives of replicas across nodes (FabricFlows::Collectives): a
  // ring over the replica's nodes. Its flows leave the replica's host out
  // of its NIC link and come back into it (the ring's next node is the
  // replica's too): the route latency of a KV flow between two replicas of
  // a rack, as CM02 shares a link in inverse proportion to its flows'
  // route latencies, as TCP does.
  void BuildCollectiveRings() {
    fabric_.collectives.assign(static_cast<size_t>(sc_.replicas), {});
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      if (nodes_of_[r] < 2) continue;
      const auto& net = PoolOf(sc_, r).proto.cluster().internode();
      Fabric::Collectives& c = fabric_.collectives[r];
      c.nic_bw = fabric_.links[r].bandwidth_bytes_per_s;
      c.latency = 2 * net.latency_s();
      BuildRing(r, &c);
    }
  }

  // Node k of replica r sends 1/n of the bytes to node k + 1 (mod n): the
  // hops that stay in a rack together, each hop between racks on its own.
  void BuildRing(int64_t r, Fabric::Collectives* c) {
    const int64_t n = nodes_of_[r];
    const int nics_n = static_cast<int>(sc_.replicas);
    const auto& fabric = sc_.proto.cluster().disaggregation().fabric();
    auto add_hop = [&](const std::string& name, double share,
                       std::vector<std::pair<int, int>> links) {
      Fabric::CollectiveHop hop;
      hop.to = zone_->create_host(own_ + name, 1e9);
      hop.share = share;
      hop.links = std::move(links);
      hop.links.emplace_back(static_cast<int>(r), 1);  // into the next node's NIC
      std::vector<sg4::LinkInRoute> route;
      for (const auto& [l, dir] : hop.links) route.push_back(LinkOf(l, dir));
      Route(hosts_.engines[r], hop.to, route, false);
      c->hops.push_back(std::move(hop));
    };
    int64_t in_rack = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t a = node_of_[r] + k, b = node_of_[r] + (k + 1) % n;
      const int ra = per_rack_ > 0 ? static_cast<int>(a / per_rack_) : -1;
      const int rb = per_rack_ > 0 ? static_cast<int>(b / per_rack_) : -1;
      if (ra == rb) {
        ++in_rack;
        continue;
      }
      std::vector<std::pair<int, int>> links = {{static_cast<int>(r), 0}, {nics_n + ra, 0}};
      if (!pod_uplinks_.empty()) {
        const int pa = ra / fabric.racks_per_pod(), pb = rb / fabric.racks_per_pod();
        if (pa != pb) {
          links.emplace_back(nics_n + fabric_.racks + pa, 0);
          links.emplace_back(nics_n + fabric_.racks + pb, 1);
        }
      }
      links.emplace_back(nics_n + rb, 1);
      add_hop(absl::StrCat("r", r, ".ring", k), 1.0 / static_cast<double>(n), std::move(links));
      c->crosses_racks = true;
    }
    if (in_rack > 0) {
      add_hop(absl::StrCat("r", r, ".ring"), static_cast<double>(in_rack) / static_cast<double>(n),
              {{static_cast<int>(r), 0}});
    }
  }

  // The KV routes from every prefill replica to every decode replica, and
  // between the replicas of a pool with a cluster KV store
  // (FabricFlows::StoreFlows).
  void BuildKvRoutes() {
    auto add_route = [&](int64_t a, int64_t b) {
      std::vector<sg4::LinkInRoute> route;
      fabric_.ForRoute(static_cast<int>(a), static_cast<int>(b),
                       [&](int l, int dir) { route.push_back(LinkOf(l, dir)); });
      Route(hosts_.engines[a], hosts_.engines[b], route, false);
    };
    const int64_t prefill = sc_.prefill_pool->replicas;
    for (int64_t p = 0; p < prefill; ++p) {
      for (int64_t d = prefill; d < sc_.replicas; ++d) add_route(p, d);
    }
    for (const auto& [begin, end] :
         {std::pair<int64_t, int64_t>{0, prefill}, {prefill, sc_.replicas}}) {
      if (!HasClusterStore(PoolOf(sc_, begin))) continue;
      for (int64_t a = begin; a < end; ++a) {
        for (int64_t b = begin; b < end; ++b) {
          if (a != b) add_route(a, b);
        }
      }
    }
  }

  // A colocated cluster's store (FabricFlows::StoreFlows): each replica's
  // NICs to the store as one full-duplex link of the tier link's bandwidth
  // per xPU each way (its latency is in the load's time already); a block
  // goes out of its home's link and into the loading replica's.
  void BuildStoreLinks() {
    const scheduler::KvTierConfig& t = sc_.batching.kv_tiers.back();
    const double bw = t.bytes_per_block / t.seconds_per_block;
    std::vector<sg4::Link*> nics;
    for (int64_t r = 0; r < sc_.replicas; ++r) {
      const std::string name = absl::StrCat("r", r, ".nic");
      nics.push_back(zone_->create_split_duplex_link(name, bw)->set_latency(0)->seal());
      fabric_.links.push_back(LinkLoadOf(name, bw, true));
    }
    for (int64_t a = 0; a < sc_.replicas; ++a) {
      for (int64_t b = 0; b < sc_.replicas; ++b) {
        if (a == b) continue;
        Route(hosts_.engines[a], hosts_.engines[b],
              {sg4::LinkInRoute(nics[a], sg4::LinkInRoute::Direction::UP),
               sg4::LinkInRoute(nics[b], sg4::LinkInRoute::Direction::DOWN)},
              false);
      }
    }
    fabric_.kv_hosts = hosts_.engines;
    fabric_.rack_of.assign(static_cast<size_t>(sc_.replicas), -1);  // one switch (ForRoute)
    fabric_.pod_of.assign(static_cast<size_t>(sc_.replicas), -1);
  }

  const ResolvedScenario& sc_;
  const FilePlatform* file_;
  Fabric& fabric_;
  const std::string own_;
  sg4::NetZone* zone_ = nullptr;
  PlatformHosts hosts_;
  // The disaggregated fabric under construction: per replica its NIC
  // link, its first node and its node count; per node its NICs'
  // bandwidth; the racks' and pods' uplinks; per replica its NVLink link.
  std::vector<sg4::Link*> nics_;
  std::vector<int64_t> node_of_, nodes_of_;
  std::vector<double> node_nic_bw_;
  int64_t per_rack_ = 0;
  std::vector<sg4::Link*> uplinks_, pod_uplinks_, nvlinks_;
};

// SimGrid ends the process (xbt_die: SIGABRT and a backtrace) on some
// well-formed but inconsistent platforms (a fat tree whose parameters need
// more hosts than it has, say). The file is therefore loaded first in a
// child process: whatever SimGrid does there, this one reports it as an
// error naming the field, with SimGrid's own words. The child loads it
// into its copy of the caller's engine (SimGrid allows one per process).
absl::Status ProbePlatformFile(const sg4::Engine& engine, const std::string& file,
                               const std::string& field) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::OkStatus();  // no probe; load as before
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::OkStatus();
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    // The caller's engine, in this process's copy of memory: the parent's
    // stays as it was.
    int rc = 0;
    try {
      engine.load_platform(file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      rc = 2;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(fds[1]);
  std::string said;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (said.size() < (size_t{64} << 10)) said.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 2)) {
    // 0: loads; 2: an exception, which the load in this process reports.
    return absl::OkStatus();
  }
  // SimGrid's message: its first line at a critical or error level, without
  // the "[time] [category/LEVEL]" prefix; the backtrace left out.
  std::string why;
  for (absl::string_view line : absl::StrSplit(said, '\n', absl::SkipWhitespace())) {
    if (absl::StrContains(line, "CRITICAL]") || absl::StrContains(line, "ERROR]")) {
      const size_t at = line.rfind("] ");
      why = std::string(
          absl::StripAsciiWhitespace(at == absl::string_view::npos ? line : line.substr(at + 2)));
      break;
    }
  }
  if (why.empty()) {
    why = WIFSIGNALED(st) ? absl::StrCat("SimGrid stopped with signal ", WTERMSIG(st))
                          : absl::StrCat("SimGrid exited with status ", WEXITSTATUS(st));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", file, ": SimGrid cannot build this platform: ", why));
}

}  // namespace

absl::StatusOr<FilePlatform> LoadPlatformFile(const ResolvedScenario& sc,
                                              const sg4::Engine& engine) {
  const std::string field = "cluster.disaggregation.fabric.platform_file";
  const std::string& file = sc.platform_file;
  RETURN_IF_ERROR(ProbePlatformFile(engine, file, field));
  try {
    engine.load_platform(file);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", e.what()));
  }
  std::vector<std::string> names;
  for (const sg4::Host* h : engine.get_all_hosts()) names.push_back(h->get_name());
  std::sort(names.begin(), names.end());
  auto own = [&](const std::string& name) -> absl::Status {
    if (absl::StartsWith(name, kOwnPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", file, " names a host or link \"",
                                                     name, "\": names starting \"", kOwnPrefix,
                                                     "\" are servesim's own; rename it"));
    }
    return absl::OkStatus();
  };
  for (const std::string& n : names) RETURN_IF_ERROR(own(n));
  for (const sg4::Link* l : engine.get_all_links()) RETURN_IF_ERROR(own(l->get_name()));
  FilePlatform out;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    ASSIGN_OR_RETURN(sg4::Host * h, ReplicaHost(sc, engine, r, names));
    out.hosts.push_back(h);
  }
  RETURN_IF_ERROR(AddFileRoutes(sc, &out));
  return out;
}

bool HasClusterStore(const ResolvedScenario& pool) {
  return !pool.batching.kv_tiers.empty() && pool.batching.kv_tiers.back().cluster_store;
}

PlatformHosts BuildPlatform(const ResolvedScenario& sc, const FilePlatform* file, Fabric* fabric) {
  return PlatformBuilder(sc, file, fabric).Build();
}

absl::StatusOr<std::string> CheckPlatformFile(const ResolvedScenario& sc) {
  if (sc.platform_file.empty()) return std::string();
  std::string name = "servesim";
  char* argv[] = {name.data(), nullptr};
  int argc = 1;
  struct sigaction caller_sigint;
  ::sigaction(SIGINT, nullptr, &caller_sigint);
  sg4::Engine engine(&argc, argv);
  ::sigaction(SIGINT, &caller_sigint, nullptr);
  ASSIGN_OR_RETURN(FilePlatform file, LoadPlatformFile(sc, engine));
  const sg4::Link* slowest = file.links.front();
  for (const sg4::Link* l : file.links) {
    if (l->get_bandwidth() < slowest->get_bandwidth()) slowest = l;
  }
  return absl::StrCat("# platform file ", sc.platform_file, ": ", engine.get_host_count(),
                      " hosts; the KV routes cross ", file.links.size(), " links, the slowest \"",
                      slowest->get_name(), "\" at ", slowest->get_bandwidth() / 1e9, " GB/s\n");
}

}  // namespace servesim::cluster
