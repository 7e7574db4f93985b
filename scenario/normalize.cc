// Normalising a scenario: presets and documented defaults filled in, so the
// resolved scenario shows every value a run uses.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "scenario/scenario.h"

namespace servesim::scenario {

namespace {

template <typename Msg>
absl::Status FillFromPreset(Msg* spec, absl::StatusOr<Msg> (*lookup)(absl::string_view),
                            const LoadedScenario& sc, absl::string_view field_path) {
  if (spec->preset().empty()) return absl::OkStatus();
  auto preset = lookup(spec->preset());
  if (!preset.ok()) {
    return absl::Status(preset.status().code(),
                        absl::StrCat(sc.Where(absl::StrCat(field_path, ".preset")), ": ",
                                     field_path, ".preset: ", preset.status().message()));
  }
  devices::FillUnset(*preset, spec);
  return absl::OkStatus();
}

// The scheduler's defaults.
absl::Status NormalizeScheduler(LoadedScenario* scenario) {
  auto& p = scenario->proto;
  auto* s = p.mutable_scheduler();
  if (s->batching() == servesim::v1::BATCHING_POLICY_UNSPECIFIED) {
    s->set_batching(servesim::v1::BATCHING_POLICY_PREFILL_FIRST);
  }
  if (s->routing() == servesim::v1::ROUTING_POLICY_UNSPECIFIED) {
    s->set_routing(servesim::v1::ROUTING_POLICY_ROUND_ROBIN);
  }
  const bool v1 = s->batching() == servesim::v1::BATCHING_POLICY_VLLM_V1;
  if (!s->has_max_batch_size()) s->set_max_batch_size(256);
  if (!s->has_max_tokens_per_iteration()) {
    // vLLM v1 serving an API on a GPU under 70 GB: 2048 tokens per step.
    const bool chunked = s->batching() == servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL;
    s->set_max_tokens_per_iteration(chunked ? 512 : v1 ? 2048 : 8192);
  }
  if (!s->has_kv_block_tokens()) s->set_kv_block_tokens(16);
  if (!s->has_kv_watermark()) s->set_kv_watermark(v1 ? 0.0 : 0.01);
  if (!s->has_prefix_caching()) s->set_prefix_caching(v1);
  if (!s->has_num_kv_blocks()) s->set_num_kv_blocks(0);
  if (!s->has_long_prefill_token_threshold()) s->set_long_prefill_token_threshold(0);
  if (!s->has_step_overhead_s()) s->set_step_overhead_s(0);
  // vLLM keeps CUDA graphs, the CUDA context, NCCL and cuBLAS workspaces
  // besides weights, activations and KV: about 1 GiB on one GPU
  // (docs/fidelity.md, "KV capacity").
  if (!s->has_runtime_reserve_bytes()) s->set_runtime_reserve_bytes(v1 ? 1073741824.0 : 0.0);
  if (s->admission() == servesim::v1::ADMISSION_POLICY_UNSPECIFIED) {
    s->set_admission(servesim::v1::ADMISSION_POLICY_ACCEPT_ALL);
  }

  return absl::OkStatus();
}

// A node preset (cluster.node) fills what the cluster leaves unset.
absl::Status NormalizeNode(LoadedScenario* scenario) {
  auto* c = scenario->proto.mutable_cluster();
  RETURN_IF_ERROR(
      FillFromPreset(c->mutable_node(), &devices::NodePreset, *scenario, "cluster.node"));
  const auto& n = c->node();
  if (c->xpu().preset().empty() && !c->xpu().has_peak_flops_fp16()) {
    c->mutable_xpu()->set_preset(n.xpu());
  }
  if (!c->has_xpus_per_node() && n.has_xpus()) c->set_xpus_per_node(n.xpus());
  // The node's NIC fills what the cluster's internode leaves unset: a
  // bandwidth given alone (a --set) keeps the NIC's latency and energy.
  if (c->internode().preset().empty()) c->mutable_internode()->set_preset(n.nic());
  return absl::OkStatus();
}

// The xPU's preset, and the links' presets: within a replica, to the
// router, and the NIC where groups span nodes.
absl::Status NormalizeXpuAndLinks(LoadedScenario* scenario) {
  auto* c = scenario->proto.mutable_cluster();
  RETURN_IF_ERROR(FillFromPreset(c->mutable_xpu(), &devices::XpuPreset, *scenario, "cluster.xpu"));
  // The xPU's own GPU-to-GPU link (its preset's), else NVLink 3.
  if (c->interconnect().preset().empty() && !c->interconnect().has_bandwidth_bytes_per_s()) {
    c->mutable_interconnect()->set_preset(
        c->xpu().interconnect().empty() ? "nvlink3" : c->xpu().interconnect());
  }
  if (c->frontend().preset().empty() && !c->frontend().has_bandwidth_bytes_per_s()) {
    c->mutable_frontend()->set_preset("ethernet-100g");
  }
  // The NIC only where groups span nodes (other scenarios resolve as they
  // always have).
  if (c->xpus_per_node() > 0) {
    if (c->internode().preset().empty() && !c->internode().has_bandwidth_bytes_per_s()) {
      c->mutable_internode()->set_preset("infiniband-ndr");
    }
    RETURN_IF_ERROR(FillFromPreset(c->mutable_internode(), &devices::LinkPreset, *scenario,
                                   "cluster.internode"));
  }
  RETURN_IF_ERROR(FillFromPreset(c->mutable_interconnect(), &devices::LinkPreset, *scenario,
                                 "cluster.interconnect"));
  RETURN_IF_ERROR(
      FillFromPreset(c->mutable_frontend(), &devices::LinkPreset, *scenario, "cluster.frontend"));
  return absl::OkStatus();
}

// cluster.kv_tiers: the write and load policies, each tier's link.
absl::Status NormalizeKvTiers(LoadedScenario* scenario) {
  auto* kt = scenario->proto.mutable_cluster()->mutable_kv_tiers();
  if (kt->write() == servesim::v1::KV_TIER_WRITE_UNSPECIFIED) {
    kt->set_write(servesim::v1::KV_TIER_WRITE_THROUGH);
  }
  if (kt->load() == servesim::v1::KV_TIER_LOAD_UNSPECIFIED) {
    kt->set_load(servesim::v1::KV_TIER_LOAD_BLOCKING);
  }
  for (int i = 0; i < kt->tier_size(); ++i) {
    auto* link = kt->mutable_tier(i)->mutable_link();
    RETURN_IF_ERROR(FillFromPreset(link, &devices::LinkPreset, *scenario,
                                   absl::StrCat("cluster.kv_tiers.tier[", i, "].link")));
    if (!link->has_latency_s()) link->set_latency_s(0);
    if (!link->has_energy_pj_per_byte()) link->set_energy_pj_per_byte(0);
  }
  return absl::OkStatus();
}

// Explicit hardware without a preset still gets the documented defaults.
void NormalizeXpuDefaults(servesim::v1::XpuSpec* x) {
  if (!x->has_compute_utilization()) x->set_compute_utilization(0.8);
  if (!x->has_memory_utilization()) x->set_memory_utilization(0.85);
  if (!x->has_kernel_overhead_s()) x->set_kernel_overhead_s(4e-6);
  if (!x->has_dram_energy_pj_per_byte()) x->set_dram_energy_pj_per_byte(28.72);
  if (!x->has_flop_energy_pj()) x->set_flop_energy_pj(0.16);
  if (!x->has_int8_op_energy_pj()) x->set_int8_op_energy_pj(0.08);
  if (!x->has_peak_flops_fp8()) x->set_peak_flops_fp8(0);  // none unless given
  if (!x->has_tdp_w()) x->set_tdp_w(0);                    // unknown unless given
  if (!x->has_idle_power_w()) x->set_idle_power_w(0);      // not counted unless given
  if (!x->has_active_power_w()) x->set_active_power_w(0);  // not counted unless given
  if (!x->has_peak_flops_int8() && x->has_peak_flops_fp16()) {
    x->set_peak_flops_int8(2 * x->peak_flops_fp16());
  }
}

// cluster.attacc: its preset and link, and the overlap settings it uses.
absl::Status NormalizeAttAcc(LoadedScenario* scenario) {
  auto* c = scenario->proto.mutable_cluster();
  auto* a = c->mutable_attacc();
  if (a->preset().empty()) a->set_preset("attacc_bank");
  RETURN_IF_ERROR(FillFromPreset(a, &devices::AttAccPreset, *scenario, "cluster.attacc"));
  if (!a->has_attention_level_pipelining()) a->set_attention_level_pipelining(true);
  if (a->link().preset().empty() && !a->link().has_bandwidth_bytes_per_s()) {
    a->mutable_link()->set_preset("nvlink3");
  }
  RETURN_IF_ERROR(
      FillFromPreset(a->mutable_link(), &devices::LinkPreset, *scenario, "cluster.attacc.link"));
  if (!a->link().has_latency_s()) a->mutable_link()->set_latency_s(0);
  if (!a->link().has_energy_pj_per_byte()) a->mutable_link()->set_energy_pj_per_byte(0);
  if (c->overlap() == servesim::v1::OVERLAP_POLICY_UNSPECIFIED) {
    c->set_overlap(servesim::v1::OVERLAP_POLICY_SERIAL);
  }
  if (!c->has_head_groups()) c->set_head_groups(8);
  if (!c->has_ff_min_batch()) c->set_ff_min_batch(1);
  return absl::OkStatus();
}

// cluster.attention_pool: the device kind's preset and model shape, the
// units, their memory and link, and the overlap settings it uses.
absl::Status NormalizeAttentionPool(LoadedScenario* scenario) {
  const auto* m = &scenario->proto.model();
  auto* c = scenario->proto.mutable_cluster();
  auto* pool = c->mutable_attention_pool();
  // The device's model shape comes from the model (FULL fidelity runs
  // every head of every layer).
  auto shape = [&](servesim::v1::AttentionShape* s) {
    if (!s->has_layers()) s->set_layers(static_cast<int32_t>(m->num_layers()));
    if (!s->has_heads()) s->set_heads(static_cast<int32_t>(m->num_heads()));
    if (!s->has_d_head()) s->set_d_head(static_cast<int32_t>(m->d_head()));
  };
  int channels = 8;
  if (pool->has_spatten()) {
    auto* sp = pool->mutable_spatten()->mutable_spatten();
    if (sp->preset().empty()) sp->set_preset("spatten");
    RETURN_IF_ERROR(FillFromPreset(sp, &devices::SpattenPreset, *scenario,
                                   "cluster.attention_pool.spatten.spatten"));
    shape(pool->mutable_spatten()->mutable_model());
    channels = sp->hbm_channels();
  } else if (pool->has_cta()) {
    auto* ct = pool->mutable_cta()->mutable_cta();
    if (ct->preset().empty()) ct->set_preset("cta_0");
    RETURN_IF_ERROR(
        FillFromPreset(ct, &devices::CtaPreset, *scenario, "cluster.attention_pool.cta.cta"));
    shape(pool->mutable_cta()->mutable_model());
    channels = ct->hbm_channels();
  } else if (pool->has_lad()) {
    auto* ld = pool->mutable_lad()->mutable_lad();
    if (ld->preset().empty()) ld->set_preset("lad_1.5");
    RETURN_IF_ERROR(
        FillFromPreset(ld, &devices::LadPreset, *scenario, "cluster.attention_pool.lad.lad"));
    shape(pool->mutable_lad()->mutable_model());
    // 5 HBM2 cubes of 8 GiB: 40 channels' worth (the A100-40GB's 40 GiB).
    channels = 40;
  } else {
    auto* tp = pool->mutable_topick()->mutable_topick();  // the default kind
    if (tp->preset().empty()) tp->set_preset("topick");
    RETURN_IF_ERROR(FillFromPreset(tp, &devices::TopickPreset, *scenario,
                                   "cluster.attention_pool.topick.topick"));
    shape(pool->mutable_topick()->mutable_model());
    channels = tp->hbm_channels();
  }
  if (!pool->has_units()) pool->set_units(8);
  // One 8 GiB (8-Hi, 8 Gb dies) HBM2 stack per 8 channels.
  if (!pool->has_memory_bytes_per_unit()) {
    pool->set_memory_bytes_per_unit(8.0 * (1 << 30) * std::max(1, channels / 8));
  }
  if (pool->link().preset().empty() && !pool->link().has_bandwidth_bytes_per_s()) {
    pool->mutable_link()->set_preset("pcie4");
  }
  RETURN_IF_ERROR(FillFromPreset(pool->mutable_link(), &devices::LinkPreset, *scenario,
                                 "cluster.attention_pool.link"));
  if (!pool->link().has_latency_s()) pool->mutable_link()->set_latency_s(0);
  if (!pool->link().has_energy_pj_per_byte()) pool->mutable_link()->set_energy_pj_per_byte(0);
  if (c->overlap() == servesim::v1::OVERLAP_POLICY_UNSPECIFIED) {
    c->set_overlap(servesim::v1::OVERLAP_POLICY_SERIAL);
  }
  if (!c->has_head_groups()) c->set_head_groups(8);
  return absl::OkStatus();
}

// The cluster's presets and defaults (a colocated cluster, or one pool).
absl::Status NormalizeCluster(LoadedScenario* scenario) {
  auto& p = scenario->proto;
  auto* c = p.mutable_cluster();
  if (!c->has_replicas()) c->set_replicas(1);
  if (!c->has_tensor_parallel()) c->set_tensor_parallel(1);
  if (!c->has_memory_utilization()) c->set_memory_utilization(0.9);
  if (c->has_node()) RETURN_IF_ERROR(NormalizeNode(scenario));
  RETURN_IF_ERROR(NormalizeXpuAndLinks(scenario));
  if (c->has_kv_tiers()) RETURN_IF_ERROR(NormalizeKvTiers(scenario));
  NormalizeXpuDefaults(c->mutable_xpu());
  if (c->has_attacc()) RETURN_IF_ERROR(NormalizeAttAcc(scenario));
  if (c->has_attention_pool()) RETURN_IF_ERROR(NormalizeAttentionPool(scenario));
  if (c->xpus_per_node() > 0) {
    if (!c->internode().has_latency_s()) c->mutable_internode()->set_latency_s(0);
    if (!c->internode().has_energy_pj_per_byte()) c->mutable_internode()->set_energy_pj_per_byte(0);
  }
  for (auto* link : {c->mutable_interconnect(), c->mutable_frontend()}) {
    if (!link->has_latency_s()) link->set_latency_s(0);
    if (!link->has_energy_pj_per_byte()) link->set_energy_pj_per_byte(0);
  }

  return absl::OkStatus();
}

// A disaggregated cluster: each pool is the scenario's cluster and
// scheduler with the pool's fields merged over them, normalised as a
// scenario of its own and written back in full; the top-level cluster then
// holds the pools only.
absl::Status NormalizePools(LoadedScenario* scenario) {
  auto& p = scenario->proto;
  servesim::v1::DisaggregationSpec d = p.cluster().disaggregation();
  for (const bool prefill : {true, false}) {
    const char* role = prefill ? "prefill" : "decode";
    servesim::v1::PoolSpec* pool = prefill ? d.mutable_prefill() : d.mutable_decode();
    const std::string path = absl::StrCat("cluster.disaggregation.", role);
    if (pool->cluster().has_disaggregation()) {
      return absl::InvalidArgumentError(
          absl::StrCat(scenario->Where(absl::StrCat(path, ".cluster.disaggregation")), ": ", path,
                       ".cluster.disaggregation is set: pools do not nest"));
    }
    LoadedScenario sub = *scenario;
    sub.pool_path = path;
    auto* c = sub.proto.mutable_cluster();
    c->clear_disaggregation();
    c->MergeFrom(pool->cluster());
    sub.proto.mutable_scheduler()->MergeFrom(pool->scheduler());
    // KV leaves a pool through its NICs.
    if (c->internode().preset().empty() && !c->internode().has_bandwidth_bytes_per_s() &&
        c->node().preset().empty() && c->node().nic().empty()) {
      c->mutable_internode()->set_preset("infiniband-ndr");
    }
    RETURN_IF_ERROR(NormalizeCluster(&sub));
    if (c->xpus_per_node() == 0) {
      // The NIC is filled where nodes are named; a pool always has one.
      RETURN_IF_ERROR(
          FillFromPreset(c->mutable_internode(), &devices::LinkPreset, sub, "cluster.internode"));
      if (!c->internode().has_latency_s()) c->mutable_internode()->set_latency_s(0);
      if (!c->internode().has_energy_pj_per_byte()) {
        c->mutable_internode()->set_energy_pj_per_byte(0);
      }
    }
    RETURN_IF_ERROR(NormalizeScheduler(&sub));
    *pool->mutable_cluster() = sub.proto.cluster();
    *pool->mutable_scheduler() = sub.proto.scheduler();
  }
  if (d.kv_transfer() == servesim::v1::KV_TRANSFER_POLICY_UNSPECIFIED) {
    d.set_kv_transfer(servesim::v1::KV_TRANSFER_POLICY_LAYERWISE);
  }
  auto* f = d.mutable_fabric();
  if (!f->has_nodes_per_rack()) f->set_nodes_per_rack(0);
  if (!f->has_oversubscription()) f->set_oversubscription(1.0);
  if (!f->has_spine_latency_s()) f->set_spine_latency_s(1e-6);
  if (!f->has_racks_per_pod()) f->set_racks_per_pod(0);
  if (!f->has_pod_oversubscription()) f->set_pod_oversubscription(1.0);
  if (!f->has_core_latency_s()) f->set_core_latency_s(1e-6);
  p.mutable_cluster()->Clear();
  *p.mutable_cluster()->mutable_disaggregation() = std::move(d);
  return absl::OkStatus();
}

}  // namespace

absl::Status Normalize(LoadedScenario* scenario) {
  auto& p = scenario->proto;
  if (!p.has_seed()) p.set_seed(1);
  if (p.name().empty()) {
    // Untitled scenarios are named after their file, without folder and
    // extension, so tables and summary.json always say what ran.
    std::string stem = scenario->path.substr(scenario->path.find_last_of('/') + 1);
    if (absl::EndsWith(stem, ".pbtxt")) stem.resize(stem.size() - 6);
    p.set_name(stem);
  }

  auto* m = p.mutable_model();
  RETURN_IF_ERROR(FillFromPreset(m, &devices::ModelPreset, *scenario, "model"));
  if (!m->has_name()) m->set_name(m->preset().empty() ? "custom" : m->preset());
  if (!m->has_num_kv_heads() && m->has_num_heads()) m->set_num_kv_heads(m->num_heads());
  if (m->ff_kind() == servesim::v1::FF_KIND_UNSPECIFIED) m->set_ff_kind(servesim::v1::FF_KIND_GELU);
  if (m->dtype() == servesim::v1::DTYPE_UNSPECIFIED) m->set_dtype(servesim::v1::DTYPE_FP16);
  if (!m->has_tied_embeddings()) m->set_tied_embeddings(false);
  if (!m->has_qk_norm()) m->set_qk_norm(false);

  if (p.cluster().has_disaggregation()) {
    RETURN_IF_ERROR(NormalizePools(scenario));
  } else {
    RETURN_IF_ERROR(NormalizeCluster(scenario));
  }

  RETURN_IF_ERROR(NormalizeScheduler(scenario));

  auto* slo = p.mutable_slo();
  if (!slo->has_ttft_s()) slo->set_ttft_s(5.0);
  if (!slo->has_tpot_s()) slo->set_tpot_s(0.1);

  auto* o = p.mutable_output();
  if (!o->has_requests_csv()) o->set_requests_csv(true);
  if (!o->has_iterations_csv()) o->set_iterations_csv(true);
  if (!o->has_timeline()) o->set_timeline(true);
  if (!o->has_timeline_every()) o->set_timeline_every(500);
  if (!o->has_timeline_max_iterations()) o->set_timeline_max_iterations(100);
  if (!o->has_timeline_end_s()) o->set_timeline_end_s(1e30);
  if (!o->has_timeline_layers()) o->set_timeline_layers(2);
  if (!o->has_report_html()) o->set_report_html(true);
  if (!o->has_links_csv()) o->set_links_csv(true);
  if (!o->has_link_bin_s()) o->set_link_bin_s(1.0);

  auto* w = p.mutable_workload();
  if (!w->has_rate_scale()) w->set_rate_scale(1.0);
  return absl::OkStatus();
}

}  // namespace servesim::scenario
