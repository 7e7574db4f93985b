// Resolve's devices (resolve_internal.h): the xPU's device spec and its
// measured profile bundle, the attention device beside the xPUs (AttAcc,
// or a pool of token-pruning accelerators) with the KV cache it holds, and
// the device agents that run either out of process.
//
// Contract: steps of Resolve, after CheckScenario; they read the normalised
// scenario and fill the ResolvedScenario's device fields. Devices are
// created here only to check a spec (a roofline, an AttAcc, a pool's
// units: errors name the field's line) and to share a pool's device, or an
// agent's, among the replicas; devices are immutable, so sharing is safe.
// Bytes, bytes/s, seconds, pJ.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "agents/remote_device.h"
#include "common/status_macros.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/gpu/profile.h"
#include "devices/lad/lad_device.h"
#include "devices/model.h"
#include "devices/pool.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "scenario/resolve_internal.h"
#include "scenario/scenario.h"
#include "scheduler/kv_cache.h"
#include "scheduler/planner.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario::internal {

namespace {

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

// The device must accept this scenario's spec (e.g. FULL fidelity's
// model shape): fail here, with the field, rather than mid-run. (On
// agents, the agent checks it when the spec is bound.) The pool's device
// is then created once, shared by every replica.
absl::Status CreatePoolDevice(const LoadedScenario& sc, ResolvedScenario* out) {
  auto dev = CreateAttentionDevice(*out);
  if (!dev.ok()) {
    // "<kind> device: <field> = ...": name that field's line (or its
    // --set), else the pool's.
    const std::string pool_path = absl::StrCat("cluster.attention_pool.", out->attention_kind);
    std::string where = sc.Where(pool_path);
    const absl::string_view msg = dev.status().message();
    const std::string prefix = absl::StrCat(out->attention_kind, " device: ");
    if (absl::StartsWith(msg, prefix)) {
      const absl::string_view rest = msg.substr(prefix.size());
      const absl::string_view field = rest.substr(0, rest.find(' '));
      const std::string spec_path = absl::StrCat(pool_path, ".", out->attention_kind, ".", field);
      if (sc.overridden.count(spec_path) > 0 || sc.Where(spec_path) != sc.Where(pool_path)) {
        where = sc.Where(spec_path);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", msg));
  }
  out->attention_shared = std::move(*dev);
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveXpuDevice(const LoadedScenario& sc, const Layout& layout,
                              ResolvedScenario* out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const auto& x = c.xpu();
  const int64_t tp = layout.tp;
  auto* gpu = out->xpu_device.mutable_gpu();
  *gpu->mutable_xpu() = x;
  *gpu->mutable_interconnect() = c.interconnect();
  gpu->set_dtype(m.dtype());
  gpu->set_kv_dtype(out->model.kv_dtype);
  if (m.expert_dtype() != servesim::v1::DTYPE_UNSPECIFIED) gpu->set_expert_dtype(m.expert_dtype());
  if (c.xpus_per_node() > 0) {
    gpu->set_xpus_per_node(c.xpus_per_node());
    *gpu->mutable_internode() = c.internode();
  }
  if (m.dtype() == servesim::v1::DTYPE_FP8 && !(x.peak_flops_fp8() > 0)) {
    out->fallbacks.push_back(absl::StrCat(
        "model.dtype FP8 on ", x.preset().empty() ? "an xPU" : x.preset(),
        " without FP8 tensor cores (cluster.xpu.peak_flops_fp8 0): weight-only FP8, GEMMs at "
        "the 16-bit rate"));
  }
  RETURN_IF_ERROR(ResolveProfile(sc, m, x, tp, out));
  RETURN_IF_ERROR(ResolveCollectives(sc, layout, gpu, out));
  if (!x.roofline().empty()) {
    // Per-class caps are checked by the device; report them here, located.
    if (auto d = devices::CreateDevice(out->xpu_device); !d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(sc.Where("cluster.xpu.roofline"), ": ", d.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveAttAcc(const LoadedScenario& sc, const Layout& layout, ResolvedScenario* out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const auto& s = sc.proto.scheduler();
  const auto& x = c.xpu();
  const int64_t tp = layout.tp;
  // DGX+AttAccs (§4, §7.1): the xPUs hold the weights, the device pool the
  // KV cache (and the FF slices of §6.2 co-processing).
  out->has_attention_device = true;
  auto* spec = out->attention_device.mutable_attacc();
  *spec->mutable_attacc() = c.attacc();
  spec->set_dtype(out->model.kv_dtype);
  out->attention_kind = "attacc";
  out->attention_label = absl::StrCat(c.attacc().preset(), " x ", c.attacc().stacks(), " stacks");
  out->attention_link = c.attacc().link();
  auto device = devices::CreateDevice(out->attention_device);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat(sc.Where("cluster.attacc"), ": ", device.status().message()));
  }
  const devices::DeviceDescription desc = (*device)->Describe();
  auto param = [&](absl::string_view name) {
    for (const auto& [k, v] : desc.parameters) {
      if (k == name) return v;
    }
    return 0.0;
  };
  out->device_memory_bytes = desc.memory_bytes;
  const double stack_bytes = param("stack_bytes");
  auto& pc = out->planner;
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
    scheduler::IterationPlanner fp(out->model, pc);
    ff_on_device = fp.FfDeviceFraction(pc.ff_min_batch);
    ff_on_xpu = 1 - fp.FfDeviceFraction(pc.ff_max_batch);
  }
  const double ff_bytes = static_cast<double>(out->model.num_layers) *
                          static_cast<double>(out->model.FfParamsPerLayer()) *
                          out->model.bytes_per_element;
  out->device_ff_weight_bytes = ff_on_device * ff_bytes;
  out->weight_bytes_per_xpu -= (1 - ff_on_xpu) * ff_bytes / static_cast<double>(tp);
  const double kv_per_token = static_cast<double>(out->model.KvBytesPerToken());
  const double kv_bytes = out->device_memory_bytes - out->device_ff_weight_bytes;
  out->kv.usable_bytes_per_xpu = 0;
  out->kv.blocks = scheduler::KvBlocksIn(kv_bytes, kv_per_token * s.kv_block_tokens());
  out->kv.tokens = out->kv.blocks * s.kv_block_tokens();
  // One head's KV, all layers, per position.
  const double head_bytes = 2.0 * static_cast<double>(out->model.num_layers) *
                            static_cast<double>(out->model.d_head) *
                            static_cast<double>(out->model.kv_bytes_per_element);
  out->batching.placement_stacks = c.attacc().stacks();
  out->batching.placement_capacity_tokens = static_cast<int64_t>(
      std::floor((stack_bytes - out->device_ff_weight_bytes / c.attacc().stacks()) / head_bytes));
  out->batching.placement_kv_heads = static_cast<int>(out->model.num_kv_heads);
  const double xpu_available = x.memory_bytes() * c.memory_utilization();
  const double xpu_required = out->weight_bytes_per_xpu + out->activation_bytes_per_xpu;
  if (xpu_required > xpu_available) {
    return absl::InvalidArgumentError(absl::StrCat(
        sc.Where("cluster.tensor_parallel"), ": ", m.name(), " weights do not fit the ", tp, " x ",
        x.preset(), " of a DGX+AttAcc replica: required ", Gb(xpu_required),
        " per xPU vs available ", Gb(xpu_available)));
  }
  return absl::OkStatus();
}

absl::Status ResolveAttentionPool(const LoadedScenario& sc, const Layout& layout,
                                  ResolvedScenario* out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const auto& s = sc.proto.scheduler();
  const auto& x = c.xpu();
  const int64_t tp = layout.tp;
  // xPUs + a pool of token-pruning accelerators: the xPUs hold the
  // weights, the pool the KV cache; its heads are split among the units.
  const auto& pool = c.attention_pool();
  out->has_attention_device = true;
  if (pool.has_spatten()) {
    *out->attention_device.mutable_spatten() = pool.spatten();
    out->attention_kind = "spatten";
    out->attention_label = absl::StrCat(pool.spatten().spatten().preset(), " x ", pool.units());
  } else if (pool.has_cta()) {
    *out->attention_device.mutable_cta() = pool.cta();
    out->attention_kind = "cta";
    out->attention_label = absl::StrCat(pool.cta().cta().preset(), " x ", pool.units());
  } else if (pool.has_lad()) {
    *out->attention_device.mutable_lad() = pool.lad();
    out->attention_kind = "lad";
    out->attention_label = absl::StrCat(pool.lad().lad().preset(), " x ", pool.units());
  } else {
    *out->attention_device.mutable_topick() = pool.topick();
    out->attention_kind = "topick";
    out->attention_label = absl::StrCat(pool.topick().topick().preset(), " x ", pool.units());
  }
  out->attention_units = pool.units();
  out->attention_memory_per_unit = pool.memory_bytes_per_unit();
  out->attention_link = pool.link();
  out->device_memory_bytes = pool.memory_bytes_per_unit() * pool.units();
  auto& pc = out->planner;
  pc.overlap = c.overlap() == servesim::v1::OVERLAP_POLICY_HEAD_LEVEL
                   ? scheduler::OverlapPolicy::kHeadLevel
               : c.overlap() == servesim::v1::OVERLAP_POLICY_BATCH_LEVEL
                   ? scheduler::OverlapPolicy::kBatchLevel
                   : scheduler::OverlapPolicy::kSerial;
  pc.head_groups = c.head_groups();
  pc.link_bytes_per_s = pool.link().bandwidth_bytes_per_s();
  pc.link_latency_s = pool.link().latency_s();
  pc.link_energy_pj_per_byte = pool.link().energy_pj_per_byte();
  const double kv_per_token = static_cast<double>(out->model.KvBytesPerToken());
  out->kv.usable_bytes_per_xpu = 0;
  out->kv.blocks =
      scheduler::KvBlocksIn(out->device_memory_bytes, kv_per_token * s.kv_block_tokens());
  out->kv.tokens = out->kv.blocks * s.kv_block_tokens();
  const double xpu_available = x.memory_bytes() * c.memory_utilization();
  const double xpu_required = out->weight_bytes_per_xpu + out->activation_bytes_per_xpu;
  if (xpu_required > xpu_available) {
    return absl::InvalidArgumentError(absl::StrCat(
        sc.Where("cluster.tensor_parallel"), ": ", m.name(), " weights do not fit the ", tp, " x ",
        x.preset(), " of the replica: required ", Gb(xpu_required), " per xPU vs available ",
        Gb(xpu_available)));
  }
  if (AgentEndpoints(sc, out->attention_kind, c.attention_endpoints()).empty()) {
    RETURN_IF_ERROR(CreatePoolDevice(sc, out));
  }
  return absl::OkStatus();
}

// --agent KIND=... replaces the scenario's list for devices of that kind.
std::vector<std::string> AgentEndpoints(
    const LoadedScenario& sc, const std::string& kind,
    const google::protobuf::RepeatedPtrField<std::string>& from_scenario) {
  auto it = sc.agent_endpoints.find(kind);
  if (it != sc.agent_endpoints.end()) return it->second;
  return {from_scenario.begin(), from_scenario.end()};
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
    return absl::InvalidArgumentError(
        absl::StrCat(sc.Where("cluster.attention_endpoints"),
                     ": cluster.attention_endpoints is set but the cluster has no attention device "
                     "(cluster.attacc or cluster.attention_pool)"));
  }
  out->xpu_endpoints = AgentEndpoints(sc, "gpu", c.xpu_endpoints());
  if (out->has_attention_device) {
    out->attention_endpoints = AgentEndpoints(sc, out->attention_kind, c.attention_endpoints());
  }
  if (!out->xpu_endpoints.empty()) {
    auto remote = agents::RemoteDevice::Create(out->xpu_device, out->xpu_endpoints, sc.agent_client,
                                               "xPU device (gpu)");
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

}  // namespace servesim::scenario::internal
