// Resolve for a prefill/decode disaggregated cluster (cluster.disaggregation;
// docs/disaggregation.md): the fabric between the pools checked, each pool
// resolved by Resolve as a scenario of its own (its cluster and scheduler
// the pool's), the two checked against each other, and combined.
//
// Contract: ResolveDisaggregated returns the decode pool's resolution with
// the whole scenario's proto, both pools' replicas (prefill first), both
// pools attached, and the KV transfer and platform-file placement filled.
// A pool's errors name the pool's field in full
// ("cluster.disaggregation.decode.cluster.x = ..."), or the pool.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scenario/resolve_internal.h"
#include "scenario/scenario.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario::internal {

namespace {

// The fabric between the pools' nodes (racks, pods): in range.
absl::Status CheckFabric(const LoadedScenario& sc) {
  const auto& d = sc.proto.cluster().disaggregation();
  Checker ck(sc);
  const auto& f = d.fabric();
  ck.Range<int32_t>("cluster.disaggregation.fabric.nodes_per_rack", f.nodes_per_rack(), 0, 65536);
  ck.Range<double>("cluster.disaggregation.fabric.oversubscription", f.oversubscription(), 1, 64);
  ck.Range<double>("cluster.disaggregation.fabric.spine_latency_s", f.spine_latency_s(), 0, 1);
  ck.Range<int32_t>("cluster.disaggregation.fabric.racks_per_pod", f.racks_per_pod(), 0, 65536);
  ck.Range<double>("cluster.disaggregation.fabric.pod_oversubscription", f.pod_oversubscription(),
                   1, 64);
  ck.Range<double>("cluster.disaggregation.fabric.core_latency_s", f.core_latency_s(), 0, 1);
  if (f.racks_per_pod() > 0 && f.nodes_per_rack() == 0) {
    ck.Fail("cluster.disaggregation.fabric.racks_per_pod", f.racks_per_pod(),
            "pods group racks: set cluster.disaggregation.fabric.nodes_per_rack too");
  }
  return ck.status();
}

// A pool's error, with the pool named.
absl::Status PoolError(const LoadedScenario& sc, const char* role, const std::string& pool_path,
                       const absl::Status& status) {
  // "file:line: cluster.x = v: ..." names the pool's field in full.
  std::string msg(status.message());
  size_t at = std::string::npos;
  for (const char* head : {": cluster.", ": scheduler."}) {
    at = std::min(at, msg.find(head));
  }
  // Otherwise the pool is named after the file's "path:line: ".
  const size_t after_where =
      absl::StartsWith(msg, sc.path) ? msg.find(": ", sc.path.size()) : std::string::npos;
  if (at != std::string::npos && (after_where == std::string::npos || at == after_where)) {
    msg.insert(at + 2, absl::StrCat(pool_path, "."));
  } else if (after_where != std::string::npos) {
    msg.insert(after_where + 2, absl::StrCat("the ", role, " pool (", pool_path, "): "));
  } else {
    msg = absl::StrCat("the ", role, " pool (", pool_path, "): ", msg);
  }
  return absl::Status(status.code(), msg);
}

// fabric.platform_file and replica_hosts (docs/disaggregation.md,
// "A platform file"): the file exists, the built-in fabric is left unset,
// and each replica has a host, no prefill replica sharing one with a decode
// replica. What the file holds is checked as SimGrid loads it
// (cluster::LoadPlatformFile).
absl::Status ResolvePlatformFile(const LoadedScenario& sc, ResolvedScenario* out) {
  namespace fs = std::filesystem;
  const auto& f = sc.proto.cluster().disaggregation().fabric();
  const std::string field = "cluster.disaggregation.fabric.platform_file";
  Checker ck(sc);
  if (f.platform_file().empty()) {
    if (f.replica_hosts_size() > 0) {
      ck.Fail("cluster.disaggregation.fabric.replica_hosts", f.replica_hosts(0),
              "names hosts of a platform file: set " + field);
    }
    return ck.status();
  }
  if (f.nodes_per_rack() > 0 || f.racks_per_pod() > 0) {
    ck.Fail(field, absl::StrCat("\"", f.platform_file(), "\""),
            "the file's routes replace fabric.nodes_per_rack and racks_per_pod: leave them unset");
    return ck.status();
  }
  fs::path path(f.platform_file());
  if (path.is_relative()) path = fs::path(sc.base_dir) / path;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    ck.Fail(field, absl::StrCat("\"", f.platform_file(), "\""),
            absl::StrCat("no such file (looked for ", path.string(), ")"));
    return ck.status();
  }
  out->platform_file = path.string();
  const int64_t prefill = out->prefill_pool->replicas;
  if (f.replica_hosts_size() > 0 && f.replica_hosts_size() != out->replicas) {
    ck.Fail("cluster.disaggregation.fabric.replica_hosts", f.replica_hosts_size(),
            absl::StrCat("names ", f.replica_hosts_size(),
                         " hosts; expected one per replica: ", out->replicas, " (", prefill,
                         " prefill, then ", out->replicas - prefill, " decode)"));
    return ck.status();
  }
  for (int64_t r = 0; r < out->replicas; ++r) {
    out->replica_hosts.push_back(
        f.replica_hosts_size() > 0
            ? f.replica_hosts(static_cast<int>(r))
            : (r < prefill ? absl::StrCat("prefill", r) : absl::StrCat("decode", r - prefill)));
  }
  for (int64_t p = 0; p < prefill; ++p) {
    for (int64_t d = prefill; d < out->replicas; ++d) {
      if (out->replica_hosts[p] == out->replica_hosts[d]) {
        ck.Fail(absl::StrCat("cluster.disaggregation.fabric.replica_hosts[", d, "]"),
                absl::StrCat("\"", out->replica_hosts[d], "\""),
                absl::StrCat("also prefill replica ", p,
                             "'s host: a prefill and a decode replica on one host are not "
                             "modelled"));
        return ck.status();
      }
    }
  }
  return ck.status();
}

// cluster.disaggregation.share_nodes: one node holds xPUs of both pools:
// they must be the same machine.
absl::Status CheckSharedNodes(const LoadedScenario& sc, const ResolvedScenario& out) {
  const auto& d = sc.proto.cluster().disaggregation();
  const auto& pc = out.prefill_pool->proto.cluster();
  const auto& dc = out.decode_pool->proto.cluster();
  auto node_size = [](const ResolvedScenario& p) {
    const auto& c = p.proto.cluster();
    return c.xpus_per_node() > 0 ? c.xpus_per_node()
                                 : p.tensor_parallel * p.ranks();  // one node per replica
  };
  std::string why;
  if (!d.fabric().platform_file().empty()) {
    why = "a platform file places the replicas by fabric.replica_hosts";
  } else if (pc.xpu().preset() != dc.xpu().preset()) {
    why = absl::StrCat("the pools' xPUs differ (", pc.xpu().preset(), " and ", dc.xpu().preset(),
                       "), so they cannot share a node");
  } else if (node_size(*out.prefill_pool) != node_size(*out.decode_pool)) {
    why = absl::StrCat("the pools' nodes differ in size (", node_size(*out.prefill_pool), " and ",
                       node_size(*out.decode_pool), " xPUs: set cluster.xpus_per_node alike)");
  }
  if (!why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(sc.Where("cluster.disaggregation.share_nodes"),
                     ": cluster.disaggregation.share_nodes = true: ", why));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedScenario> ResolveDisaggregated(const LoadedScenario& sc) {
  const auto& d = sc.proto.cluster().disaggregation();
  RETURN_IF_ERROR(CheckFabric(sc));
  std::shared_ptr<ResolvedScenario> pools[2];
  for (const bool prefill : {true, false}) {
    const char* role = prefill ? "prefill" : "decode";
    const servesim::v1::PoolSpec& pool = prefill ? d.prefill() : d.decode();
    LoadedScenario sub = sc;
    sub.pool_path = absl::StrCat("cluster.disaggregation.", role);
    *sub.proto.mutable_cluster() = pool.cluster();
    *sub.proto.mutable_scheduler() = pool.scheduler();
    // A per-token latency target caps decode batches; prefill steps emit
    // no tokens users wait on between two others.
    if (prefill) sub.proto.mutable_slo()->clear_tbt_s();
    absl::StatusOr<ResolvedScenario> r = Resolve(sub);
    if (!r.ok()) return PoolError(sc, role, sub.pool_path, r.status());
    // Its KV leaves through the NICs: a link of no bandwidth would never
    // deliver it.
    const auto& nic = pool.cluster().internode();
    if (!(nic.bandwidth_bytes_per_s() > 0)) {
      const std::string field = absl::StrCat(sub.pool_path, ".cluster.internode");
      return absl::InvalidArgumentError(
          absl::StrCat(sub.Where("cluster.internode"), ": ", field,
                       ".bandwidth_bytes_per_s = ", nic.bandwidth_bytes_per_s(),
                       ": the KV transfer between the pools could never "
                       "complete; expected > 0"));
    }
    pools[prefill ? 0 : 1] = std::make_shared<ResolvedScenario>(std::move(*r));
  }
  // Prompts are hashed once, at one block size, for both pools' caches.
  if (pools[0]->batching.prefix_caching && pools[1]->batching.prefix_caching &&
      pools[0]->batching.kv_block_tokens != pools[1]->batching.kv_block_tokens) {
    LoadedScenario decode = sc;
    decode.pool_path = "cluster.disaggregation.decode";
    return absl::InvalidArgumentError(
        absl::StrCat(decode.Where("scheduler.kv_block_tokens"),
                     ": cluster.disaggregation.decode.scheduler.kv_block_tokens = ",
                     pools[1]->batching.kv_block_tokens,
                     ": both pools cache prefixes, so their blocks must be "
                     "the prefill pool's size, ",
                     pools[0]->batching.kv_block_tokens));
  }
  ResolvedScenario out = *pools[1];
  out.proto = sc.proto;
  out.replicas = pools[0]->replicas + pools[1]->replicas;
  for (const std::string& f : pools[0]->fallbacks) {
    out.fallbacks.push_back(absl::StrCat("prefill pool: ", f));
  }
  out.remote_devices.insert(out.remote_devices.end(), pools[0]->remote_devices.begin(),
                            pools[0]->remote_devices.end());
  out.prefill_pool = std::move(pools[0]);
  out.decode_pool = std::move(pools[1]);
  out.kv_layerwise = d.kv_transfer() != servesim::v1::KV_TRANSFER_POLICY_AFTER_PREFILL;
  out.kv_bytes_per_token = static_cast<double>(out.model.KvBytesPerToken());
  RETURN_IF_ERROR(ResolvePlatformFile(sc, &out));
  if (d.share_nodes()) RETURN_IF_ERROR(CheckSharedNodes(sc, out));
  return out;
}

}  // namespace servesim::scenario::internal
