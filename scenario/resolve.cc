// Resolving a scenario: every value checked against its allowed range and
// the configuration as a whole, then what the run needs derived (model
// dimensions, KV capacity, devices, agents).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agents/remote_device.h"
#include "common/status_macros.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/gpu/profile.h"
#include "devices/lad/lad_device.h"
#include "devices/pool.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "scenario/scenario.h"
#include "scheduler/planner.h"

namespace servesim::scenario {

namespace {

// Accumulates the first range error with its location.
class Checker {
 public:
  explicit Checker(const LoadedScenario& sc) : sc_(sc) {}

  template <typename T>
  void Range(absl::string_view path, T v, T lo, T hi) {
    if (!status_.ok()) return;
    if (!(v >= lo && v <= hi)) {
      Fail(path, v, absl::StrCat("allowed range [", lo, ", ", hi, "]"));
    }
  }
  void Positive(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v > 0) || !std::isfinite(v)) Fail(path, v, "expected > 0");
  }
  // (0, hi]: a positive figure with an upper limit (e.g. a memory size
  // whose block count must fit an integer).
  void PositiveAtMost(absl::string_view path, double v, double hi) {
    if (!status_.ok()) return;
    if (!(v > 0 && v <= hi)) Fail(path, v, absl::StrCat("allowed range (0, ", hi, "]"));
  }
  void NonNegative(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v >= 0) || !std::isfinite(v)) Fail(path, v, "expected >= 0");
  }
  void Fraction(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v > 0 && v <= 1)) Fail(path, v, "allowed range (0, 1]");
  }
  template <typename T>
  void Fail(absl::string_view path, T v, absl::string_view what) {
    if (!status_.ok()) return;
    status_ = absl::InvalidArgumentError(
        absl::StrCat(sc_.Where(path), ": ", path, " = ", v, ": ", what));
  }
  void Require(bool has, absl::string_view path, absl::string_view why) {
    if (!status_.ok() || has) return;
    status_ = absl::InvalidArgumentError(
        absl::StrCat(sc_.Where(path), ": ", path, " is not set: ", why));
  }
  const absl::Status& status() const { return status_; }

 private:
  const LoadedScenario& sc_;
  absl::Status status_;
};

// The largest memory an xPU or an attention unit may have: 1 PB, 10^4
// times today's largest accelerator memories. It keeps KV block counts
// (bytes / block bytes) far inside an integer.
constexpr double kMaxMemoryBytes = 1e15;

std::string Gb(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

}  // namespace

namespace {

// --agent KIND=... replaces the scenario's list for devices of that kind.
std::vector<std::string> AgentEndpoints(
    const LoadedScenario& sc, const std::string& kind,
    const google::protobuf::RepeatedPtrField<std::string>& from_scenario) {
  auto it = sc.agent_endpoints.find(kind);
  if (it != sc.agent_endpoints.end()) return it->second;
  return {from_scenario.begin(), from_scenario.end()};
}

// Device agents: remote devices behind the same interface (agents/).
// cluster.profile: the bundle folder <root>/<gpu>/<model>/<variant>/tp<TP>,
// loaded (once per process) and referenced from the xPU's device spec. A
// missing bundle is an error when cluster.profile.required is set, else a
// fallback to the roofline that run_info.json lists.
absl::Status ResolveProfile(const LoadedScenario& sc, const servesim::v1::ModelSpec& m,
                            const servesim::v1::XpuSpec& x, int64_t tp, ResolvedScenario* out) {
  namespace fs = std::filesystem;
  const servesim::v1::ProfileSpec& ps = sc.proto.cluster().profile();
  if (ps.root().empty()) return absl::OkStatus();
  const std::string where = sc.Where("cluster.profile.root");
  fs::path root(ps.root());
  if (root.is_relative()) root = fs::path(sc.base_dir) / root;
  const std::string gpu = !ps.gpu().empty() ? ps.gpu() : x.profile_name();
  const std::string model = !ps.model().empty() ? ps.model() : m.hf_name();
  const std::string variant = !ps.variant().empty() ? ps.variant() : devices::DTypeName(m.dtype());
  auto missing = [&](const std::string& what) -> absl::Status {
    if (ps.required()) {
      return absl::NotFoundError(absl::StrCat(where, ": cluster.profile: ", what));
    }
    out->fallbacks.push_back(absl::StrCat("profile: ", what, "; GPU costs from the roofline"));
    return absl::OkStatus();
  };
  if (m.kv_lora_rank() > 0) {
    return missing(absl::StrCat("model ", m.name(),
                                " uses multi-head latent attention, whose layers the bundle "
                                "format does not measure"));
  }
  if (gpu.empty()) {
    return missing(absl::StrCat("the xPU", x.preset().empty() ? "" : " preset " + x.preset(),
                                " names no profile (set cluster.profile.gpu)"));
  }
  if (model.empty()) {
    return missing(absl::StrCat("model ", m.name(),
                                " has no hf_name (set cluster.profile.model, e.g. "
                                "meta-llama/Llama-3.1-8B)"));
  }
  const fs::path variant_dir = root / gpu / model / variant;
  std::error_code ec;
  if (!fs::is_directory(variant_dir, ec)) {
    return missing(absl::StrCat("no bundle folder ", variant_dir.string()));
  }
  const fs::path dir = variant_dir / absl::StrCat("tp", tp);
  if (!fs::is_directory(dir, ec)) {
    std::vector<std::string> tps;
    for (const auto& e : fs::directory_iterator(variant_dir, ec)) {
      if (e.is_directory() && absl::StartsWith(e.path().filename().string(), "tp")) {
        tps.push_back(e.path().filename().string());
      }
    }
    std::sort(tps.begin(), tps.end());
    return missing(absl::StrCat("no ", dir.filename().string(), " folder in ", variant_dir.string(),
                                " for cluster.tensor_parallel = ", tp, " (it has: ",
                                tps.empty() ? "none" : absl::StrJoin(tps, ", "), ")"));
  }
  auto profile = devices::GpuProfile::Get(fs::absolute(dir).lexically_normal().string());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat(where, ": cluster.profile: ", profile.status().message()));
  }
  out->profile = *profile;
  auto* ref = out->xpu_device.mutable_gpu()->mutable_profile();
  ref->set_dir((*profile)->dir());
  ref->set_fingerprint((*profile)->fingerprint());
  const devices::ModelDims& d = out->model;
  const int64_t heads = d.num_heads / tp, kv = std::max<int64_t>(1, d.num_kv_heads / tp);
  ref->set_d_model(d.d_model);
  ref->set_qkv_n((heads + 2 * kv) * d.d_head);
  ref->set_attn_out_k(heads * d.d_head);
  ref->set_ff1_n(d.FfInputMatrices() * (d.d_ff / tp));
  ref->set_ff2_k(d.d_ff / tp);
  ref->set_lm_head_n((d.vocab_size + tp - 1) / tp);
  ref->set_expert_d_ff(d.expert_d_ff);
  return absl::OkStatus();
}

absl::Status ConnectAgents(const LoadedScenario& sc, ResolvedScenario* out) {
  const auto& c = sc.proto.cluster();
  for (const auto& [kind, endpoints] : sc.agent_endpoints) {
    if (kind != "gpu" && kind != out->attention_kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--agent ", kind, "=...: the scenario has no ", kind, " device (its devices: gpu",
          out->has_attention_device ? absl::StrCat(", ", out->attention_kind) : "", ")"));
    }
  }
  if (!out->has_attention_device && c.attention_endpoints_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        sc.Where("cluster.attention_endpoints"),
        ": cluster.attention_endpoints is set but the cluster has no attention device "
        "(cluster.attacc or cluster.attention_pool)"));
  }
  out->xpu_endpoints = AgentEndpoints(sc, "gpu", c.xpu_endpoints());
  if (out->has_attention_device) {
    out->attention_endpoints = AgentEndpoints(sc, out->attention_kind, c.attention_endpoints());
  }
  if (!out->xpu_endpoints.empty()) {
    auto remote = agents::RemoteDevice::Create(out->xpu_device, out->xpu_endpoints,
                                               sc.agent_client, "xPU device (gpu)");
    if (!remote.ok()) return AnnotateFieldError(sc, remote.status());
    out->remote_devices.push_back(remote->get());
    out->xpu_agent = std::shared_ptr<devices::Device>(std::move(*remote));
  }
  if (!out->attention_endpoints.empty()) {
    auto remote = agents::RemoteDevice::Create(
        out->attention_device, out->attention_endpoints, sc.agent_client,
        absl::StrCat("attention device (", out->attention_kind, ")"));
    if (!remote.ok()) return AnnotateFieldError(sc, remote.status());
    out->remote_devices.push_back(remote->get());
    if (out->attention_units > 0) {
      out->attention_shared = std::make_shared<devices::PooledDevice>(
          std::move(*remote), out->attention_units, out->attention_memory_per_unit);
    } else {
      out->attention_agent = std::shared_ptr<devices::Device>(std::move(*remote));
    }
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<ResolvedScenario> ResolveDisaggregated(const LoadedScenario& sc) {
  const auto& d = sc.proto.cluster().disaggregation();
  {
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
    RETURN_IF_ERROR(ck.status());
  }
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
    if (!r.ok()) {
      // "file:line: cluster.x = v: ..." names the pool's field in full.
      std::string msg(r.status().message());
      size_t at = std::string::npos;
      for (const char* head : {": cluster.", ": scheduler."}) {
        at = std::min(at, msg.find(head));
      }
      // Otherwise the pool is named after the file's "path:line: ".
      const size_t after_where =
          absl::StartsWith(msg, sc.path) ? msg.find(": ", sc.path.size()) : std::string::npos;
      if (at != std::string::npos && (after_where == std::string::npos || at == after_where)) {
        msg.insert(at + 2, absl::StrCat(sub.pool_path, "."));
      } else if (after_where != std::string::npos) {
        msg.insert(after_where + 2, absl::StrCat("the ", role, " pool (", sub.pool_path, "): "));
      } else {
        msg = absl::StrCat("the ", role, " pool (", sub.pool_path, "): ", msg);
      }
      return absl::Status(r.status().code(), msg);
    }
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
  if (d.share_nodes()) {
    // One node holds xPUs of both pools: they must be the same machine.
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
  }
  return out;
}

namespace {

// cluster.kv_tiers (docs/kv_tiers.md): checks each tier and sizes it in
// blocks of `kv_bytes_per_token_per_xpu` x block tokens per xPU.
absl::Status ResolveKvTiers(const LoadedScenario& sc, double kv_bytes_per_token_per_xpu,
                            ResolvedScenario* out) {
  const auto& c = sc.proto.cluster();
  const auto& kt = c.kv_tiers();
  auto fail = [&](absl::string_view path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(sc.Where(path), ": ", path, ": ", what));
  };
  if (!out->batching.prefix_caching) {
    return fail("cluster.kv_tiers",
                "lower KV tiers keep prefix-cached blocks; set scheduler.prefix_caching: true");
  }
  if (out->has_attention_device) {
    return fail("cluster.kv_tiers",
                "not modelled with an attention device (its memory holds the KV cache, and "
                "the path from its stacks to a host tier is not described)");
  }
  if (kt.tier_size() < 1 || kt.tier_size() > scheduler::kMaxKvTiers) {
    return fail("cluster.kv_tiers.tier",
                absl::StrCat(kt.tier_size(), " tiers; allowed 1..", scheduler::kMaxKvTiers));
  }
  const double block_bytes =
      static_cast<double>(out->batching.kv_block_tokens) * kv_bytes_per_token_per_xpu;
  const double xpus = static_cast<double>(out->tensor_parallel);
  std::set<int> kinds;
  double host_per_xpu = 0;  // bytes of host DRAM the tiers take per xPU
  Checker ck(sc);
  for (int i = 0; i < kt.tier_size(); ++i) {
    const auto& t = kt.tier(i);
    const std::string base = absl::StrCat("cluster.kv_tiers.tier[", i, "]");
    if (t.kind() == servesim::v1::KV_TIER_KIND_UNSPECIFIED) {
      return fail(base + ".kind",
                  "not set; one of KV_TIER_HOST_DRAM, KV_TIER_CXL, KV_TIER_SSD, "
                  "KV_TIER_CLUSTER_STORE");
    }
    if (!kinds.insert(t.kind()).second) {
      return fail(base + ".kind",
                  absl::StrCat(servesim::v1::KvTierKind_Name(t.kind()), " appears twice"));
    }
    if (!t.link().has_bandwidth_bytes_per_s()) {
      return fail(base + ".link",
                  "not set: give a preset (\"pcie5\", ...) or bandwidth_bytes_per_s");
    }
    ck.PositiveAtMost(base + ".capacity_bytes_per_xpu", t.capacity_bytes_per_xpu(), 1e15);
    ck.Positive(base + ".link.bandwidth_bytes_per_s", t.link().bandwidth_bytes_per_s());
    ck.Range<double>(base + ".link.latency_s", t.link().latency_s(), 0, 1);
    ck.Range<double>(base + ".link.energy_pj_per_byte", t.link().energy_pj_per_byte(), 0, 1e6);
    RETURN_IF_ERROR(ck.status());
    const bool store = t.kind() == servesim::v1::KV_TIER_CLUSTER_STORE;
    if (store && i + 1 != kt.tier_size()) {
      return fail(base + ".kind", "KV_TIER_CLUSTER_STORE must be the last tier");
    }
    // Host DRAM holds a HOST_DRAM tier and the xPU's share of a cluster
    // store.
    const int64_t per_node = c.xpus_per_node();
    const double host = c.node().host_memory_bytes();
    if (t.kind() == servesim::v1::KV_TIER_HOST_DRAM || store) {
      host_per_xpu += t.capacity_bytes_per_xpu();
      if (host > 0 && per_node > 0 && host_per_xpu * static_cast<double>(per_node) > host) {
        return fail(
            base + ".capacity_bytes_per_xpu",
            absl::StrCat(host_per_xpu, " of host DRAM per xPU (the tiers in host memory) x ",
                         per_node, " xPUs per node = ", host_per_xpu * per_node,
                         " bytes exceeds the node's host memory (cluster.node."
                         "host_memory_bytes = ",
                         host, "); allowed at most ", host / per_node, " per xPU"));
      }
    }
    scheduler::KvTierConfig tc;
    tc.name = absl::AsciiStrToLower(
        absl::StripPrefix(servesim::v1::KvTierKind_Name(t.kind()), "KV_TIER_"));
    // Pipeline stages: the in-flight batches' schedulers share the xPUs'
    // tiers as they share HBM, a 1/S share each.
    const int64_t pp = std::max<int64_t>(1, out->pipeline_parallel);
    tc.capacity_blocks = scheduler::KvBlocksIn(t.capacity_bytes_per_xpu(), block_bytes) / pp;
    if (tc.capacity_blocks < 1) {
      return fail(
          base + ".capacity_bytes_per_xpu",
          absl::StrCat(
              t.capacity_bytes_per_xpu(), " holds no KV block of ", block_bytes, " bytes per xPU",
              pp > 1 ? absl::StrCat(" for each of ", pp, " in-flight batches") : std::string()));
    }
    tc.seconds_per_block = block_bytes / t.link().bandwidth_bytes_per_s();
    tc.latency_s = t.link().latency_s();
    tc.bytes_per_block = block_bytes * xpus;
    tc.energy_pj_per_block = tc.bytes_per_block * t.link().energy_pj_per_byte();
    tc.cluster_store = store;
    out->batching.kv_tiers.push_back(std::move(tc));
  }
  out->batching.kv_tier_write_through = kt.write() != servesim::v1::KV_TIER_WRITE_ON_EVICT;
  out->kv_tier_layerwise = kt.load() == servesim::v1::KV_TIER_LOAD_LAYERWISE;
  out->batching.kv_tier_async = kt.load() == servesim::v1::KV_TIER_LOAD_ASYNC;
  if (out->batching.kv_tier_async && out->batching.policy != scheduler::BatchingPolicy::kVllmV1) {
    return fail("cluster.kv_tiers.load",
                "KV_TIER_LOAD_ASYNC is vLLM v1's WAITING_FOR_REMOTE_KVS; set scheduler.batching: "
                "BATCHING_POLICY_VLLM_V1, or load BLOCKING or LAYERWISE");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedScenario> Resolve(const LoadedScenario& sc) {
  if (sc.proto.cluster().has_disaggregation()) return ResolveDisaggregated(sc);
  const auto& p = sc.proto;
  Checker ck(sc);
  const auto& m = p.model();
  const char* kDims = "set model.preset or every model dimension";
  ck.Require(m.has_num_layers(), "model.num_layers", kDims);
  ck.Require(m.has_d_model(), "model.d_model", kDims);
  ck.Require(m.has_num_heads(), "model.num_heads", kDims);
  ck.Require(m.has_d_head(), "model.d_head", kDims);
  ck.Require(m.has_d_ff(), "model.d_ff", kDims);
  ck.Require(m.has_vocab_size(), "model.vocab_size", kDims);
  ck.Require(m.has_max_context_tokens(), "model.max_context_tokens", kDims);
  ck.Range<int64_t>("model.num_layers", m.num_layers(), 1, 1024);
  ck.Range<int64_t>("model.d_model", m.d_model(), 1, 1 << 20);
  ck.Range<int64_t>("model.num_heads", m.num_heads(), 1, 4096);
  ck.Range<int64_t>("model.num_kv_heads", m.num_kv_heads(), 1, m.num_heads());
  ck.Range<int64_t>("model.d_head", m.d_head(), 1, 4096);
  {
    const auto& o = p.output();
    ck.Range<int32_t>("output.timeline_every", o.timeline_every(), 1, 1 << 30);
    ck.Range<int32_t>("output.timeline_max_iterations", o.timeline_max_iterations(), 0,
                      1000000);
    ck.Range<int32_t>("output.timeline_layers", o.timeline_layers(), 0, 1024);
    ck.Range<double>("output.link_bin_s", o.link_bin_s(), 1e-6, 86400);
    if (o.has_exact_percentile_max_samples()) {
      ck.Range<int64_t>("output.exact_percentile_max_samples", o.exact_percentile_max_samples(),
                        0, 1'000'000'000);
    }
    ck.NonNegative("output.timeline_start_s", o.timeline_start_s());
    if (!(o.timeline_end_s() > o.timeline_start_s())) {
      ck.Fail("output.timeline_end_s", o.timeline_end_s(),
              absl::StrCat("expected > output.timeline_start_s (", o.timeline_start_s(), ")"));
    }
  }
  ck.Range<int64_t>("model.d_ff", m.d_ff(), 1, 1 << 22);
  ck.Range<int64_t>("model.vocab_size", m.vocab_size(), 1, 1 << 24);
  ck.Range<int64_t>("model.max_context_tokens", m.max_context_tokens(), 2, 1 << 24);
  if (ck.status().ok() && m.num_heads() % m.num_kv_heads() != 0) {
    ck.Fail("model.num_kv_heads", m.num_kv_heads(),
            absl::StrCat("must divide num_heads (", m.num_heads(), ")"));
  }

  const bool moe = m.num_experts() > 0;
  if (m.has_num_experts() && m.num_experts() != 0) {
    ck.Range<int64_t>("model.num_experts", m.num_experts(), 2, 4096);
    ck.Require(m.has_experts_per_token(), "model.experts_per_token",
               "an MoE model (model.num_experts > 0) needs its top-k");
    ck.Require(m.has_expert_d_ff(), "model.expert_d_ff",
               "an MoE model (model.num_experts > 0) needs its experts' width");
    ck.Range<int64_t>("model.experts_per_token", m.experts_per_token(), 1, m.num_experts());
    ck.Range<int64_t>("model.expert_d_ff", m.expert_d_ff(), 1, 1 << 22);
    ck.Range<int64_t>("model.shared_experts", m.shared_experts(), 0, 64);
    ck.Range<int64_t>("model.dense_layers", m.dense_layers(), 0, m.num_layers() - 1);
    ck.Range<double>("model.routing_skew", m.routing_skew(), 0, 16);
  } else {
    for (auto [set, field] : {std::pair{m.has_experts_per_token(), "model.experts_per_token"},
                              {m.has_expert_d_ff(), "model.expert_d_ff"},
                              {m.has_shared_experts(), "model.shared_experts"},
                              {m.has_dense_layers(), "model.dense_layers"},
                              {m.has_routing_skew(), "model.routing_skew"}}) {
      if (set) ck.Fail(field, "set", "only for MoE models (set model.num_experts > 0)");
    }
  }

  const bool mla = m.kv_lora_rank() > 0;
  if (m.has_kv_lora_rank() && m.kv_lora_rank() != 0) {
    ck.Range<int64_t>("model.kv_lora_rank", m.kv_lora_rank(), 1, 65536);
    ck.Range<int64_t>("model.q_lora_rank", m.q_lora_rank(), 0, 65536);
    ck.Range<int64_t>("model.rope_head_dim", m.rope_head_dim(), 0, 1024);
    if (m.has_v_head_dim()) ck.Range<int64_t>("model.v_head_dim", m.v_head_dim(), 1, 4096);
    if (ck.status().ok() && m.num_kv_heads() != m.num_heads()) {
      ck.Fail("model.num_kv_heads", m.num_kv_heads(),
              absl::StrCat("multi-head latent attention (model.kv_lora_rank > 0) up-projects "
                           "keys and values for every head: set it to model.num_heads (",
                           m.num_heads(), ")"));
    }
  } else {
    for (auto [set, field] : {std::pair{m.has_q_lora_rank(), "model.q_lora_rank"},
                              {m.has_rope_head_dim(), "model.rope_head_dim"},
                              {m.has_v_head_dim(), "model.v_head_dim"}}) {
      if (set) {
        ck.Fail(field, "set", "only for multi-head latent attention (set model.kv_lora_rank > 0)");
      }
    }
  }

  if (m.has_sliding_window()) {
    ck.Range<int64_t>("model.sliding_window", m.sliding_window(), 1, 1 << 24);
    ck.Range<int64_t>("model.full_attention_interval", m.full_attention_interval(), 0, 1024);
    if (ck.status().ok() && mla) {
      ck.Fail("model.sliding_window", m.sliding_window(),
              "sliding windows over multi-head latent attention are not modelled");
    }
  } else if (m.has_full_attention_interval()) {
    ck.Fail("model.full_attention_interval", m.full_attention_interval(),
            "only with sliding-window layers (set model.sliding_window)");
  }
  for (auto [dtype, field] :
       {std::pair{m.dtype(), "model.dtype"}, {m.kv_dtype(), "model.kv_dtype"}}) {
    if (dtype == servesim::v1::DTYPE_MXFP4) {
      ck.Fail(field, "DTYPE_MXFP4",
              "MXFP4 is for an MoE model's routed experts (model.expert_dtype); expected "
              "DTYPE_FP16, DTYPE_BF16, DTYPE_INT8 or DTYPE_FP8");
    }
  }
  if (m.expert_dtype() != servesim::v1::DTYPE_UNSPECIFIED && !moe) {
    ck.Fail("model.expert_dtype", servesim::v1::DType_Name(m.expert_dtype()),
            "only for MoE models (set model.num_experts > 0)");
  }

  const auto& c = p.cluster();
  ck.Range<int32_t>("cluster.replicas", c.replicas(), 1, 4096);
  const int64_t dp = c.has_data_parallel() ? c.data_parallel() : 1;
  ck.Range<int32_t>("cluster.data_parallel", static_cast<int32_t>(dp), 1, 1024);
  if (ck.status().ok() && dp > 1 && !moe) {
    ck.Fail("cluster.data_parallel", dp,
            "data-parallel ranks in lockstep are for MoE models; a dense model's data-parallel "
            "engines are independent replicas (cluster.replicas)");
  }
  if (ck.status().ok() && c.expert_parallel() && !moe) {
    ck.Fail("cluster.expert_parallel", "true", "only for MoE models (model.num_experts > 0)");
  }
  if (ck.status().ok() && m.sliding_window() > 0 && (c.has_attacc() || c.has_attention_pool())) {
    ck.Fail(c.has_attacc() ? "cluster.attacc" : "cluster.attention_pool", "set",
            "sliding-window layers are not modelled on the attention devices (the papers' "
            "mappings keep a sequence's whole cache); serve this model on the xPUs");
  }
  if (ck.status().ok() && mla && (c.has_attacc() || c.has_attention_pool())) {
    ck.Fail(c.has_attacc() ? "cluster.attacc" : "cluster.attention_pool", "set",
            "multi-head latent attention has no mapping on the attention devices: AttAcc's "
            "GEMV units and the pruning accelerators read each KV head's keys and values "
            "separately (AttAcc §4.3), while MLA's heads share one latent that serves as both; "
            "serve this model on the xPUs (docs/models.md)");
  }
  if (ck.status().ok() && moe && (c.has_attacc() || c.has_attention_pool())) {
    // An attention device beside an MoE model's xPUs: one TP group whose
    // layers are attention and routed experts only (docs/moe.md).
    const char* device = c.has_attacc() ? "cluster.attacc" : "cluster.attention_pool";
    if (dp > 1) {
      ck.Fail(device, "set",
              "attention devices are modelled beside one data-parallel rank; set "
              "cluster.data_parallel to 1 (experts split over the tensor-parallel group)");
    } else if (m.shared_experts() > 0 || m.dense_layers() > 0) {
      ck.Fail(device, "set",
              "attention devices are modelled beside MoE models whose every layer has routed "
              "experts only (model.shared_experts and model.dense_layers 0)");
    } else if (c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL_FF) {
      ck.Fail("cluster.overlap", "HEAD_LEVEL_FF",
              "feed-forward co-processing splits a dense FF; an MoE model's experts stay on the "
              "xPUs (use SERIAL, HEAD_LEVEL or BATCH_LEVEL)");
    }
  }
  const int64_t pp = c.has_pipeline_parallel() ? c.pipeline_parallel() : 1;
  ck.Range<int32_t>("cluster.pipeline_parallel", static_cast<int32_t>(pp), 1, 64);
  if (ck.status().ok() && pp > m.num_layers()) {
    ck.Fail("cluster.pipeline_parallel", pp,
            absl::StrCat("a stage holds at least one layer: at most model.num_layers (",
                         m.num_layers(), ")"));
  }
  if (ck.status().ok() && pp > 1 && dp > 1) {
    ck.Fail("cluster.pipeline_parallel", pp,
            "pipeline stages and data-parallel ranks together are not modelled; set one of "
            "cluster.pipeline_parallel and cluster.data_parallel to 1");
  }
  if (ck.status().ok() && pp > 1 && (c.has_attacc() || c.has_attention_pool())) {
    ck.Fail("cluster.pipeline_parallel", pp,
            "attention devices are modelled beside one pipeline stage; set it to 1");
  }
  ck.Range<int32_t>("cluster.tensor_parallel", c.tensor_parallel(), 1, 64);
  const int64_t tp = c.tensor_parallel();
  if (ck.status().ok() && m.num_heads() % tp != 0) {
    ck.Fail("cluster.tensor_parallel", tp,
            absl::StrCat("must divide model.num_heads (", m.num_heads(), ")"));
  }
  if (ck.status().ok() && m.d_ff() % tp != 0) {
    ck.Fail("cluster.tensor_parallel", tp,
            absl::StrCat("must divide model.d_ff (", m.d_ff(), ")"));
  }
  if (ck.status().ok() && moe) {
    // The MoE layers are split over data_parallel x tensor_parallel xPUs.
    const int64_t group = dp * tp;
    if (c.expert_parallel() && m.num_experts() % group != 0) {
      ck.Fail(c.has_data_parallel() ? "cluster.data_parallel" : "cluster.tensor_parallel",
              c.has_data_parallel() ? dp : tp,
              absl::StrCat("expert parallelism splits model.num_experts (", m.num_experts(),
                           ") over data_parallel x tensor_parallel = ", group,
                           " xPUs: it must divide evenly"));
    } else if (!c.expert_parallel() && m.expert_d_ff() % group != 0) {
      ck.Fail(
          c.has_data_parallel() ? "cluster.data_parallel" : "cluster.tensor_parallel",
          c.has_data_parallel() ? dp : tp,
          absl::StrCat("without expert parallelism each expert's width model.expert_d_ff (",
                       m.expert_d_ff(), ") is split over data_parallel x tensor_parallel = ", group,
                       " xPUs: it must divide evenly (or set "
                       "cluster.expert_parallel)"));
    }
    if (m.shared_experts() > 0 && (m.shared_experts() * m.expert_d_ff()) % tp != 0) {
      ck.Fail("cluster.tensor_parallel", tp,
              absl::StrCat("must divide the shared experts' width (",
                           m.shared_experts() * m.expert_d_ff(), ")"));
    }
  }
  if (ck.status().ok() && m.num_kv_heads() % tp != 0 && tp % m.num_kv_heads() != 0) {
    ck.Fail("cluster.tensor_parallel", tp,
            absl::StrCat("must divide model.num_kv_heads (", m.num_kv_heads(),
                         ") or be a multiple of it"));
  }
  const auto& x = c.xpu();
  const char* kXpu = "set cluster.xpu.preset or every xPU figure";
  ck.Require(x.has_peak_flops_fp16(), "cluster.xpu.peak_flops_fp16", kXpu);
  ck.Require(x.has_memory_bytes(), "cluster.xpu.memory_bytes", kXpu);
  ck.Require(x.has_memory_bw_bytes_per_s(), "cluster.xpu.memory_bw_bytes_per_s", kXpu);
  ck.Positive("cluster.xpu.peak_flops_fp16", x.peak_flops_fp16());
  ck.Positive("cluster.xpu.peak_flops_int8", x.peak_flops_int8());
  ck.PositiveAtMost("cluster.xpu.memory_bytes", x.memory_bytes(), kMaxMemoryBytes);
  ck.Positive("cluster.xpu.memory_bw_bytes_per_s", x.memory_bw_bytes_per_s());
  ck.Fraction("cluster.xpu.compute_utilization", x.compute_utilization());
  ck.Fraction("cluster.xpu.memory_utilization", x.memory_utilization());
  ck.NonNegative("cluster.xpu.kernel_overhead_s", x.kernel_overhead_s());
  ck.NonNegative("cluster.xpu.dram_energy_pj_per_byte", x.dram_energy_pj_per_byte());
  ck.NonNegative("cluster.xpu.flop_energy_pj", x.flop_energy_pj());
  ck.NonNegative("cluster.xpu.int8_op_energy_pj", x.int8_op_energy_pj());
  if (x.has_on_die()) {
    const auto& e = x.on_die();
    ck.NonNegative("cluster.xpu.on_die.l2_pj_per_byte", e.l2_pj_per_byte());
    ck.NonNegative("cluster.xpu.on_die.l1_pj_per_byte", e.l1_pj_per_byte());
    ck.NonNegative("cluster.xpu.on_die.register_pj_per_access", e.register_pj_per_access());
    ck.Range<int64_t>("cluster.xpu.on_die.cores", e.cores(), 1, 100000);
    ck.Range<double>("cluster.xpu.on_die.l1_bytes_per_core", e.l1_bytes_per_core(), 1024,
                     1073741824.0);
  }
  ck.Range<double>("cluster.xpu.idle_power_w", x.idle_power_w(), 0,
                   x.tdp_w() > 0 ? x.tdp_w() : 100000.0);
  if (x.tdp_w() > 0) {
    ck.Range<double>("cluster.xpu.active_power_w", x.active_power_w(), 0,
                     std::max(0.0, x.tdp_w() - x.idle_power_w()));
  } else {
    ck.Range<double>("cluster.xpu.active_power_w", x.active_power_w(), 0, 100000);
  }
  {
    const auto& pw = c.power();
    ck.Range<double>("cluster.power.host_w_per_node", pw.host_w_per_node(), 0, 100000);
    const double floor_w = x.idle_power_w() + x.active_power_w();
    if (pw.xpu_cap_w() != 0 && !(pw.xpu_cap_w() > floor_w && pw.xpu_cap_w() <= 100000)) {
      ck.Fail("cluster.power.xpu_cap_w", pw.xpu_cap_w(),
              absl::StrCat("allowed 0 (no cap) or (", floor_w,
                           " (cluster.xpu.idle_power_w + active_power_w), 100000]"));
    }
    if (pw.has_attention_device_static_w()) {
      ck.Range<double>("cluster.power.attention_device_static_w", pw.attention_device_static_w(), 0,
                       1000000);
    }
  }
  ck.Range<int32_t>("cluster.xpus_per_node", c.xpus_per_node(), 0, 1024);
  for (const char* name : {"interconnect", "frontend", "internode"}) {
    if (std::string(name) == "internode" && c.xpus_per_node() == 0) continue;
    const auto& l = std::string(name) == "interconnect" ? c.interconnect()
                    : std::string(name) == "frontend"   ? c.frontend()
                                                        : c.internode();
    const std::string base = absl::StrCat("cluster.", name);
    ck.Positive(absl::StrCat(base, ".bandwidth_bytes_per_s"), l.bandwidth_bytes_per_s());
    ck.NonNegative(absl::StrCat(base, ".latency_s"), l.latency_s());
    ck.NonNegative(absl::StrCat(base, ".energy_pj_per_byte"), l.energy_pj_per_byte());
  }
  ck.Fraction("cluster.memory_utilization", c.memory_utilization());

  const auto& s = p.scheduler();
  ck.Range<int64_t>("scheduler.max_batch_size", s.max_batch_size(), 1, 1 << 16);
  ck.Range<int64_t>("scheduler.max_tokens_per_iteration", s.max_tokens_per_iteration(), 1, 1 << 22);
  ck.Range<int64_t>("scheduler.kv_block_tokens", s.kv_block_tokens(), 1, 1024);
  if (ck.status().ok() && !(s.kv_watermark() >= 0 && s.kv_watermark() < 0.5)) {
    ck.Fail("scheduler.kv_watermark", s.kv_watermark(), "allowed range [0, 0.5)");
  }
  ck.Range<int64_t>("scheduler.num_kv_blocks", s.num_kv_blocks(), 0, scheduler::kMaxKvBlocks);
  ck.Range<int64_t>("scheduler.long_prefill_token_threshold", s.long_prefill_token_threshold(), 0,
                    1 << 22);
  ck.Range<double>("scheduler.step_overhead_s", s.step_overhead_s(), 0, 1);
  ck.Range<int64_t>("scheduler.cuda_graph_max_tokens", s.cuda_graph_max_tokens(), 0, 1000000);
  ck.Range<double>("scheduler.runtime_reserve_bytes", s.runtime_reserve_bytes(), 0, 1e15);
  ck.Positive("slo.ttft_s", p.slo().ttft_s());
  ck.Positive("slo.tpot_s", p.slo().tpot_s());
  if (p.slo().has_tbt_s()) ck.Positive("slo.tbt_s", p.slo().tbt_s());
  if (c.has_attacc()) {
    ck.Range<int32_t>("cluster.attacc.stacks", c.attacc().stacks(), 1, 4096);
    ck.Range<int32_t>("cluster.head_groups", c.head_groups(), 1,
                      static_cast<int32_t>(std::max<int64_t>(1, m.num_heads())));
    ck.Positive("cluster.attacc.link.bandwidth_bytes_per_s",
                c.attacc().link().bandwidth_bytes_per_s());
    ck.NonNegative("cluster.attacc.link.latency_s", c.attacc().link().latency_s());
    ck.Range<int64_t>("cluster.ff_min_batch", c.ff_min_batch(), 1, 1 << 16);
    if (c.has_ff_max_batch()) {
      ck.Range<int64_t>("cluster.ff_max_batch", c.ff_max_batch(), c.ff_min_batch(), 1 << 16);
    }
  } else if (c.has_attention_pool()) {
    const auto& pool = c.attention_pool();
    ck.Range<int32_t>("cluster.attention_pool.units", pool.units(), 1, 1024);
    ck.PositiveAtMost("cluster.attention_pool.memory_bytes_per_unit",
                      pool.memory_bytes_per_unit(), kMaxMemoryBytes);
    ck.Positive("cluster.attention_pool.link.bandwidth_bytes_per_s",
                pool.link().bandwidth_bytes_per_s());
    ck.NonNegative("cluster.attention_pool.link.latency_s", pool.link().latency_s());
    ck.Range<int32_t>("cluster.head_groups", c.head_groups(), 1,
                      static_cast<int32_t>(std::max<int64_t>(1, m.num_heads())));
    if (c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL_FF) {
      ck.Fail("cluster.overlap", "HEAD_LEVEL_FF",
              "feed-forward co-processing needs cluster.attacc's GEMV units; use SERIAL, "
              "HEAD_LEVEL or BATCH_LEVEL with cluster.attention_pool");
    }
  } else if (c.overlap() != servesim::v1::OVERLAP_POLICY_UNSPECIFIED &&
             c.overlap() != servesim::v1::OVERLAP_POLICY_SERIAL) {
    ck.Fail("cluster.overlap", servesim::v1::OverlapPolicy_Name(c.overlap()),
            "overlap policies other than SERIAL need cluster.attacc or "
            "cluster.attention_pool (an attention device)");
  }
  if (c.has_attacc() && c.has_attention_pool()) {
    ck.Fail("cluster.attention_pool", "set",
            "at most one of cluster.attacc and cluster.attention_pool");
  }
  if (c.overlap_rule() == servesim::v1::OVERLAP_RULE_ATTACC_SIMULATOR) {
    if (!c.has_attacc() && !c.has_attention_pool()) {
      ck.Fail("cluster.overlap_rule", "ATTACC_SIMULATOR",
              "the AttAcc simulator's overlap rule needs cluster.attacc or "
              "cluster.attention_pool (an attention device)");
    } else if (c.overlap() == servesim::v1::OVERLAP_POLICY_BATCH_LEVEL) {
      ck.Fail("cluster.overlap_rule", "ATTACC_SIMULATOR",
              "the AttAcc simulator times serial and head-level overlap only; use "
              "LIST_SCHEDULE with BATCH_LEVEL");
    }
  }
  RETURN_IF_ERROR(ck.status());

  ResolvedScenario out;
  out.proto = p;
  out.base_dir = sc.base_dir;
  out.model = devices::ModelDimsFromSpec(m);
  out.replicas = c.replicas();
  out.tensor_parallel = tp;
  out.seed = p.seed();
  out.ttft_slo_s = p.slo().ttft_s();
  out.tpot_slo_s = p.slo().tpot_s();
  out.tbt_slo_s = p.slo().has_tbt_s() ? p.slo().tbt_s() : 0.0;
  auto* gpu = out.xpu_device.mutable_gpu();
  *gpu->mutable_xpu() = x;
  *gpu->mutable_interconnect() = c.interconnect();
  gpu->set_dtype(m.dtype());
  gpu->set_kv_dtype(out.model.kv_dtype);
  if (m.expert_dtype() != servesim::v1::DTYPE_UNSPECIFIED) gpu->set_expert_dtype(m.expert_dtype());
  if (c.xpus_per_node() > 0) {
    gpu->set_xpus_per_node(c.xpus_per_node());
    *gpu->mutable_internode() = c.internode();
  }
  if (m.dtype() == servesim::v1::DTYPE_FP8 && !(x.peak_flops_fp8() > 0)) {
    out.fallbacks.push_back(absl::StrCat(
        "model.dtype FP8 on ", x.preset().empty() ? "an xPU" : x.preset(),
        " without FP8 tensor cores (cluster.xpu.peak_flops_fp8 0): weight-only FP8, GEMMs at "
        "the 16-bit rate"));
  }
  RETURN_IF_ERROR(ResolveProfile(sc, m, x, tp, &out));
  if (!x.roofline().empty()) {
    // Per-class caps are checked by the device; report them here, located.
    if (auto d = devices::CreateDevice(out.xpu_device); !d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(sc.Where("cluster.xpu.roofline"), ": ", d.status().message()));
    }
  }

  out.data_parallel = dp;
  out.cuda_graph_max_tokens = s.cuda_graph_max_tokens();
  out.planner.data_parallel = dp;
  out.planner.expert_parallel = c.expert_parallel();
  if (moe) {
    auto routing =
        devices::ExpertRouting::Create(m.num_experts(), m.experts_per_token(), m.routing_skew(),
                                       p.seed(), c.expert_parallel() ? dp * tp : 1);
    if (!routing.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(sc.Where("model.num_experts"), ": ", routing.status().message()));
    }
    out.planner.routing = std::make_shared<const devices::ExpertRouting>(*std::move(routing));
  }

  // Memory: weights and the activation workspace must leave room for KV.
  scheduler::PlannerConfig size_config;
  size_config.tensor_parallel = tp;
  size_config.data_parallel = dp;
  size_config.expert_parallel = c.expert_parallel();
  scheduler::IterationPlanner sizes(out.model, size_config);
  out.weight_bytes_per_xpu = sizes.WeightBytesPerXpu();
  out.activation_bytes_per_xpu = sizes.ActivationBytesPerXpu(s.max_tokens_per_iteration());
  if (s.batching() == servesim::v1::BATCHING_POLICY_VLLM_V1) {
    // vLLM sizes the KV cache after a profiling forward pass of a full token
    // budget and a sampler pass of max_num_seqs dummy requests: the peak
    // holds the layer's activations and the logits in fp32 (vocab per
    // sequence, plus the softmax copy).
    out.activation_bytes_per_xpu +=
        2.0 * 4.0 * static_cast<double>(s.max_batch_size()) *
        static_cast<double>((m.vocab_size() + tp - 1) / tp);
  }
  out.runtime_reserve_bytes_per_xpu = s.runtime_reserve_bytes();
  scheduler::KvCapacityInputs kin;
  kin.memory_bytes_per_xpu = x.memory_bytes();
  kin.xpus = tp;
  kin.memory_utilization = c.memory_utilization();
  kin.weight_bytes =
      moe || mla ? out.weight_bytes_per_xpu * static_cast<double>(tp) : out.model.WeightBytes();
  kin.activation_bytes_per_xpu = out.activation_bytes_per_xpu + out.runtime_reserve_bytes_per_xpu;
  kin.kv_bytes_per_token_per_xpu = sizes.KvBytesPerTokenPerXpu();
  out.pipeline_parallel = pp;
  if (pp > 1) {
    // Each stage's xPUs hold its layers' weights and KV; the first the
    // embedding, the last the LM head (tied: each end its copy). The
    // fullest stage bounds the memory plan.
    const std::vector<int64_t> layers = scheduler::PipelineLayers(m.num_layers(), pp);
    const int64_t most = *std::max_element(layers.begin(), layers.end());
    const devices::ModelDims& d = out.model;
    const double matrix = static_cast<double>(d.vocab_size * d.d_model) *
                          (d.dtype == servesim::v1::DTYPE_FP8 ? 2.0 : double(d.bytes_per_element)) /
                          static_cast<double>(tp);
    const double in_layers = out.weight_bytes_per_xpu - (d.tied_embeddings ? 1.0 : 2.0) * matrix;
    double fullest = 0;
    for (size_t j = 0; j < layers.size(); ++j) {
      const double w = in_layers * static_cast<double>(layers[j]) / double(d.num_layers) +
                       (j == 0 ? matrix : 0.0) + (j + 1 == layers.size() ? matrix : 0.0);
      fullest = std::max(fullest, w);
    }
    out.weight_bytes_per_xpu = fullest;
    kin.weight_bytes = fullest * static_cast<double>(tp);
    kin.kv_bytes_per_token_per_xpu = sizes.KvBytesPerTokenPerXpu() / d.num_layers * most;
    auto& pc = out.pipeline;
    pc.layers = layers;
    pc.num_layers = d.num_layers;
    pc.tensor_parallel = tp;
    pc.d_model = static_cast<double>(d.d_model);
    pc.act_bytes = static_cast<double>(d.act_bytes_per_element);
    const bool across_nodes = c.xpus_per_node() > 0 && tp * pp > c.xpus_per_node();
    const auto& link = across_nodes ? c.internode() : c.interconnect();
    pc.link_bytes_per_s = link.bandwidth_bytes_per_s();
    pc.link_latency_s = link.latency_s();
    pc.link_energy_pj_per_byte = link.energy_pj_per_byte();
    pc.across_nodes = across_nodes;
  }
  kin.block_tokens = s.kv_block_tokens();
  out.planner.tensor_parallel = tp;
  // Only with an attention device (checked above); the list schedule otherwise.
  out.planner.overlap_rule = c.overlap_rule() == servesim::v1::OVERLAP_RULE_ATTACC_SIMULATOR
                                 ? scheduler::OverlapRule::kAttAccSimulator
                                 : scheduler::OverlapRule::kListSchedule;
  if (c.has_attacc()) {
    // DGX+AttAccs (§4, §7.1): the xPUs hold the weights, the device pool the
    // KV cache (and the FF slices of §6.2 co-processing).
    out.has_attention_device = true;
    auto* spec = out.attention_device.mutable_attacc();
    *spec->mutable_attacc() = c.attacc();
    spec->set_dtype(out.model.kv_dtype);
    out.attention_kind = "attacc";
    out.attention_label = absl::StrCat(c.attacc().preset(), " x ", c.attacc().stacks(), " stacks");
    out.attention_link = c.attacc().link();
    auto device = devices::CreateDevice(out.attention_device);
    if (!device.ok()) {
      return absl::Status(device.status().code(),
                          absl::StrCat(sc.Where("cluster.attacc"), ": ",
                                       device.status().message()));
    }
    const devices::DeviceDescription desc = (*device)->Describe();
    auto param = [&](absl::string_view name) {
      for (const auto& [k, v] : desc.parameters) {
        if (k == name) return v;
      }
      return 0.0;
    };
    out.device_memory_bytes = desc.memory_bytes;
    const double stack_bytes = param("stack_bytes");
    auto& pc = out.planner;
    pc.overlap = c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL
                     ? scheduler::OverlapPolicy::kHeadLevel
                 : c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL_FF
                     ? scheduler::OverlapPolicy::kHeadLevelFf
                 : c.overlap() == servesim::v1::OVERLAP_POLICY_BATCH_LEVEL
                     ? scheduler::OverlapPolicy::kBatchLevel
                     : scheduler::OverlapPolicy::kSerial;
    pc.head_groups = c.head_groups();
    pc.link_bytes_per_s = c.attacc().link().bandwidth_bytes_per_s();
    pc.link_latency_s = c.attacc().link().latency_s();
    pc.link_energy_pj_per_byte = c.attacc().link().energy_pj_per_byte();
    pc.xpu_bandwidth = x.memory_bw_bytes_per_s() * static_cast<double>(tp);
    pc.device_bandwidth = param("internal_bandwidth_bytes_per_s");
    pc.ff_min_batch = c.ff_min_batch();
    pc.ff_max_batch = c.has_ff_max_batch() ? c.ff_max_batch() : s.max_batch_size();
    // FF co-processing places f(min batch) of every FF matrix on the device
    // and keeps 1 - f(max batch) on the xPUs (§6.2).
    double ff_on_device = 0, ff_on_xpu = 1;
    if (pc.overlap == scheduler::OverlapPolicy::kHeadLevelFf) {
      scheduler::IterationPlanner fp(out.model, pc);
      ff_on_device = fp.FfDeviceFraction(pc.ff_min_batch);
      ff_on_xpu = 1 - fp.FfDeviceFraction(pc.ff_max_batch);
    }
    const double ff_bytes = static_cast<double>(out.model.num_layers) *
                            static_cast<double>(out.model.FfParamsPerLayer()) *
                            out.model.bytes_per_element;
    out.device_ff_weight_bytes = ff_on_device * ff_bytes;
    out.weight_bytes_per_xpu -= (1 - ff_on_xpu) * ff_bytes / static_cast<double>(tp);
    const double kv_per_token = static_cast<double>(out.model.KvBytesPerToken());
    const double kv_bytes = out.device_memory_bytes - out.device_ff_weight_bytes;
    out.kv.usable_bytes_per_xpu = 0;
    out.kv.blocks = scheduler::KvBlocksIn(kv_bytes, kv_per_token * s.kv_block_tokens());
    out.kv.tokens = out.kv.blocks * s.kv_block_tokens();
    // One head's KV, all layers, per position.
    const double head_bytes = 2.0 * static_cast<double>(out.model.num_layers) *
                              static_cast<double>(out.model.d_head) *
                              static_cast<double>(out.model.kv_bytes_per_element);
    out.batching.placement_stacks = c.attacc().stacks();
    out.batching.placement_capacity_tokens = static_cast<int64_t>(std::floor(
        (stack_bytes - out.device_ff_weight_bytes / c.attacc().stacks()) / head_bytes));
    out.batching.placement_kv_heads = static_cast<int>(out.model.num_kv_heads);
    const double xpu_available = x.memory_bytes() * c.memory_utilization();
    const double xpu_required = out.weight_bytes_per_xpu + out.activation_bytes_per_xpu;
    if (xpu_required > xpu_available) {
      return absl::InvalidArgumentError(absl::StrCat(
          sc.Where("cluster.tensor_parallel"), ": ", m.name(), " weights do not fit the ",
          tp, " x ", x.preset(), " of a DGX+AttAcc replica: required ", Gb(xpu_required),
          " per xPU vs available ", Gb(xpu_available)));
    }
  } else if (c.has_attention_pool()) {
    // xPUs + a pool of token-pruning accelerators: the xPUs hold the
    // weights, the pool the KV cache; its heads are split among the units.
    const auto& pool = c.attention_pool();
    out.has_attention_device = true;
    if (pool.has_spatten()) {
      *out.attention_device.mutable_spatten() = pool.spatten();
      out.attention_kind = "spatten";
      out.attention_label = absl::StrCat(pool.spatten().spatten().preset(), " x ", pool.units());
    } else if (pool.has_cta()) {
      *out.attention_device.mutable_cta() = pool.cta();
      out.attention_kind = "cta";
      out.attention_label = absl::StrCat(pool.cta().cta().preset(), " x ", pool.units());
    } else if (pool.has_lad()) {
      *out.attention_device.mutable_lad() = pool.lad();
      out.attention_kind = "lad";
      out.attention_label = absl::StrCat(pool.lad().lad().preset(), " x ", pool.units());
    } else {
      *out.attention_device.mutable_topick() = pool.topick();
      out.attention_kind = "topick";
      out.attention_label = absl::StrCat(pool.topick().topick().preset(), " x ", pool.units());
    }
    out.attention_units = pool.units();
    out.attention_memory_per_unit = pool.memory_bytes_per_unit();
    out.attention_link = pool.link();
    out.device_memory_bytes = pool.memory_bytes_per_unit() * pool.units();
    auto& pc = out.planner;
    pc.overlap = c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL
                     ? scheduler::OverlapPolicy::kHeadLevel
                 : c.overlap() == servesim::v1::OVERLAP_POLICY_BATCH_LEVEL
                     ? scheduler::OverlapPolicy::kBatchLevel
                     : scheduler::OverlapPolicy::kSerial;
    pc.head_groups = c.head_groups();
    pc.link_bytes_per_s = pool.link().bandwidth_bytes_per_s();
    pc.link_latency_s = pool.link().latency_s();
    pc.link_energy_pj_per_byte = pool.link().energy_pj_per_byte();
    const double kv_per_token = static_cast<double>(out.model.KvBytesPerToken());
    out.kv.usable_bytes_per_xpu = 0;
    out.kv.blocks = scheduler::KvBlocksIn(out.device_memory_bytes,
                                          kv_per_token * s.kv_block_tokens());
    out.kv.tokens = out.kv.blocks * s.kv_block_tokens();
    const double xpu_available = x.memory_bytes() * c.memory_utilization();
    const double xpu_required = out.weight_bytes_per_xpu + out.activation_bytes_per_xpu;
    if (xpu_required > xpu_available) {
      return absl::InvalidArgumentError(absl::StrCat(
          sc.Where("cluster.tensor_parallel"), ": ", m.name(), " weights do not fit the ",
          tp, " x ", x.preset(), " of the replica: required ", Gb(xpu_required),
          " per xPU vs available ", Gb(xpu_available)));
    }
    // The device must accept this scenario's spec (e.g. FULL fidelity's
    // model shape): fail here, with the field, rather than mid-run. (On
    // agents, the agent checks it when the spec is bound.)
    if (AgentEndpoints(sc, out.attention_kind, c.attention_endpoints()).empty()) {
      auto dev = CreateAttentionDevice(out);
      if (!dev.ok()) {
        // "<kind> device: <field> = ...": name that field's line (or its
        // --set), else the pool's.
        const std::string pool_path = absl::StrCat("cluster.attention_pool.", out.attention_kind);
        std::string where = sc.Where(pool_path);
        const absl::string_view msg = dev.status().message();
        const std::string prefix = absl::StrCat(out.attention_kind, " device: ");
        if (absl::StartsWith(msg, prefix)) {
          const absl::string_view rest = msg.substr(prefix.size());
          const absl::string_view field = rest.substr(0, rest.find(' '));
          const std::string spec_path = absl::StrCat(pool_path, ".", out.attention_kind, ".", field);
          if (sc.overridden.count(spec_path) > 0 || sc.Where(spec_path) != sc.Where(pool_path)) {
            where = sc.Where(spec_path);
          }
        }
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", msg));
      }
      out.attention_shared = std::move(*dev);
    }
  } else {
    out.kv = scheduler::ComputeKvCapacity(kin);
    if (s.num_kv_blocks() > 0) {
      // The engine's own figure (vLLM's num_gpu_blocks) replaces the memory
      // model's.
      out.kv.blocks = s.num_kv_blocks();
      out.kv.tokens = out.kv.blocks * s.kv_block_tokens();
      out.kv.usable_bytes_per_xpu =
          static_cast<double>(out.kv.blocks) * s.kv_block_tokens() * kin.kv_bytes_per_token_per_xpu;
    }
    if (pp > 1) {
      // One share per in-flight batch's scheduler.
      out.kv.blocks /= pp;
      out.kv.tokens = out.kv.blocks * s.kv_block_tokens();
    }
  }
  const double available = x.memory_bytes() * c.memory_utilization();
  const double required = out.weight_bytes_per_xpu + out.activation_bytes_per_xpu +
                          out.runtime_reserve_bytes_per_xpu;
  if (out.kv.blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        sc.Where("cluster.tensor_parallel"), ": ", m.name(),
        " does not fit a replica of ", tp, " x ", x.preset().empty() ? "xPU" : x.preset(),
        ": required ", Gb(required), " per xPU (weights ", Gb(out.weight_bytes_per_xpu),
        " + activations ", Gb(out.activation_bytes_per_xpu),
        out.runtime_reserve_bytes_per_xpu > 0
            ? absl::StrCat(" + runtime reserve ", Gb(out.runtime_reserve_bytes_per_xpu))
            : std::string(),
        ") plus at least one KV block (",
        Gb(double(kin.block_tokens) * kin.kv_bytes_per_token_per_xpu), ") vs available ",
        Gb(available), " (memory ", Gb(x.memory_bytes()), " x cluster.memory_utilization ",
        c.memory_utilization(), "); raise cluster.tensor_parallel or use a larger xPU"));
  }

  out.batching.policy = s.batching() == servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL
                            ? scheduler::BatchingPolicy::kChunkedPrefill
                        : s.batching() == servesim::v1::BATCHING_POLICY_VLLM_V1
                            ? scheduler::BatchingPolicy::kVllmV1
                            : scheduler::BatchingPolicy::kPrefillFirst;
  out.batching.prefix_caching = s.prefix_caching();
  out.reject_late = s.admission() == servesim::v1::ADMISSION_POLICY_REJECT_LATE;
  out.batching.long_prefill_token_threshold = s.long_prefill_token_threshold();
  out.step_overhead_s = s.step_overhead_s();
  {
    const auto& pw = p.cluster().power();
    out.xpu_idle_power_w = p.cluster().xpu().idle_power_w();
    out.xpu_active_power_w = p.cluster().xpu().active_power_w();
    out.xpu_tdp_w = p.cluster().xpu().tdp_w();
    const int64_t per_node = p.cluster().xpus_per_node();
    out.host_power_w =
        pw.host_w_per_node() *
        (per_node > 0 ? static_cast<double>(out.xpus_per_replica()) / per_node : 1.0);
    out.xpu_power_cap_w = pw.xpu_cap_w();
    if (pw.has_attention_device_static_w()) out.attention_static_w = pw.attention_device_static_w();
  }
  out.batching.max_batch_size = s.max_batch_size();
  out.batching.max_tokens_per_iteration = s.max_tokens_per_iteration();
  out.batching.kv_block_tokens = s.kv_block_tokens();
  out.batching.kv_capacity_blocks = out.kv.blocks;
  out.batching.kv_watermark = s.kv_watermark();
  out.batching.max_context_tokens = m.max_context_tokens();
  if (c.has_kv_tiers()) {
    RETURN_IF_ERROR(ResolveKvTiers(sc, static_cast<double>(kin.kv_bytes_per_token_per_xpu), &out));
  }
  switch (s.routing()) {
    case servesim::v1::ROUTING_POLICY_LEAST_OUTSTANDING:
      out.routing = scheduler::RoutingPolicy::kLeastOutstanding;
      break;
    case servesim::v1::ROUTING_POLICY_LEAST_KV_LOAD:
      out.routing = scheduler::RoutingPolicy::kLeastKvLoad;
      break;
    case servesim::v1::ROUTING_POLICY_PREFIX_AFFINITY:
      out.routing = scheduler::RoutingPolicy::kPrefixAffinity;
      break;
    default:
      out.routing = scheduler::RoutingPolicy::kRoundRobin;
  }
  RETURN_IF_ERROR(ConnectAgents(sc, &out));
  return out;
}

absl::StatusOr<std::unique_ptr<devices::Device>> CreateAttentionDevice(
    const ResolvedScenario& sc) {
  if (sc.attention_shared != nullptr) {
    return absl::FailedPreconditionError("the attention pool is shared: use attention_shared");
  }
  ASSIGN_OR_RETURN(auto device, devices::CreateDevice(sc.attention_device));
  if (sc.attention_units <= 0) return device;
  return std::unique_ptr<devices::Device>(std::make_unique<devices::PooledDevice>(
      std::move(device), sc.attention_units, sc.attention_memory_per_unit));
}

}  // namespace servesim::scenario
