// Resolve's checks (resolve_internal.h): every value of a colocated
// scenario against its allowed range, and the configuration as a whole
// (what the model, the layout, the xPU and the attention device allow
// together), before anything is derived from them.
//
// Contract: CheckScenario reads the normalised scenario only; the first
// error found is the one returned, so the checks run in a fixed order
// (model, output, parallelism, xPU and power, links, scheduler, SLOs, the
// attention device) and each keeps its own order. Figures are in the
// scenario's units: bytes, seconds, watts, FLOP/s.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "scenario/resolve_internal.h"
#include "scenario/scenario.h"
#include "scheduler/kv_cache.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario::internal {

namespace {

// The largest memory an xPU or an attention unit may have: 1 PB, 10^4
// times today's largest accelerator memories. It keeps KV block counts
// (bytes / block bytes) far inside an integer.
constexpr double kMaxMemoryBytes = 1e15;

// The model's dimensions: each set (by model.preset or by hand), and the
// first ones in range.
void CheckModelShape(const servesim::v1::ModelSpec& m, Checker& ck) {
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
}

// The timeline's sampling and window, the link bins, exact percentiles.
void CheckOutput(const servesim::v1::OutputSpec& o, Checker& ck) {
  ck.Range<int32_t>("output.timeline_every", o.timeline_every(), 1, 1 << 30);
  ck.Range<int32_t>("output.timeline_max_iterations", o.timeline_max_iterations(), 0, 1000000);
  ck.Range<int32_t>("output.timeline_layers", o.timeline_layers(), 0, 1024);
  ck.Range<double>("output.link_bin_s", o.link_bin_s(), 1e-6, 86400);
  if (o.has_exact_percentile_max_samples()) {
    ck.Range<int64_t>("output.exact_percentile_max_samples", o.exact_percentile_max_samples(), 0,
                      1'000'000'000);
  }
  ck.NonNegative("output.timeline_start_s", o.timeline_start_s());
  if (!(o.timeline_end_s() > o.timeline_start_s())) {
    ck.Fail("output.timeline_end_s", o.timeline_end_s(),
            absl::StrCat("expected > output.timeline_start_s (", o.timeline_start_s(), ")"));
  }
}

// The model's widths, vocabulary and context; KV heads group the heads.
void CheckModelWidths(const servesim::v1::ModelSpec& m, Checker& ck) {
  ck.Range<int64_t>("model.d_ff", m.d_ff(), 1, 1 << 22);
  ck.Range<int64_t>("model.vocab_size", m.vocab_size(), 1, 1 << 24);
  ck.Range<int64_t>("model.max_context_tokens", m.max_context_tokens(), 2, 1 << 24);
  if (ck.status().ok() && m.num_heads() % m.num_kv_heads() != 0) {
    ck.Fail("model.num_kv_heads", m.num_kv_heads(),
            absl::StrCat("must divide num_heads (", m.num_heads(), ")"));
  }
}

// Mixture of experts: an MoE model's fields set and in range; a dense
// model sets none of them.
void CheckExperts(const servesim::v1::ModelSpec& m, Checker& ck) {
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
}

// Multi-head latent attention: its ranks in range, one KV head per head; a
// model without it sets none of its fields.
void CheckLatentAttention(const servesim::v1::ModelSpec& m, Checker& ck) {
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
}

// Sliding-window layers, and the data types each part of the model may use.
void CheckWindowsAndDtypes(const servesim::v1::ModelSpec& m, const Layout& layout, Checker& ck) {
  const bool moe = layout.moe, mla = layout.mla;
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
}

// Replicas, data-parallel ranks and expert parallelism (MoE models only).
void CheckReplicasAndRanks(const servesim::v1::ClusterSpec& c, const Layout& layout, Checker& ck) {
  const bool moe = layout.moe;
  const int64_t dp = layout.dp;
  ck.Range<int32_t>("cluster.replicas", c.replicas(), 1, 4096);
  ck.Range<int32_t>("cluster.data_parallel", static_cast<int32_t>(dp), 1, 1024);
  if (ck.status().ok() && dp > 1 && !moe) {
    ck.Fail("cluster.data_parallel", dp,
            "data-parallel ranks in lockstep are for MoE models; a dense model's data-parallel "
            "engines are independent replicas (cluster.replicas)");
  }
  if (ck.status().ok() && c.expert_parallel() && !moe) {
    ck.Fail("cluster.expert_parallel", "true", "only for MoE models (model.num_experts > 0)");
  }
}

// The models an attention device (cluster.attacc or attention_pool) can
// serve beside the xPUs.
void CheckModelOnAttentionDevice(const servesim::v1::ModelSpec& m,
                                 const servesim::v1::ClusterSpec& c, const Layout& layout,
                                 Checker& ck) {
  const bool moe = layout.moe, mla = layout.mla;
  const int64_t dp = layout.dp;
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
}

// Pipeline stages: at most one per layer, alone (no data-parallel ranks, no
// attention device).
void CheckPipelineParallel(const servesim::v1::ModelSpec& m, const servesim::v1::ClusterSpec& c,
                           const Layout& layout, Checker& ck) {
  const int64_t pp = layout.pp, dp = layout.dp;
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
}

// Tensor parallelism: the group splits the heads, the FF and the experts
// evenly, and splits or replicates the KV heads.
void CheckTensorParallel(const servesim::v1::ModelSpec& m, const servesim::v1::ClusterSpec& c,
                         const Layout& layout, Checker& ck) {
  const bool moe = layout.moe;
  const int64_t tp = layout.tp, dp = layout.dp;
  ck.Range<int32_t>("cluster.tensor_parallel", c.tensor_parallel(), 1, 64);
  if (ck.status().ok() && m.num_heads() % tp != 0) {
    ck.Fail("cluster.tensor_parallel", tp,
            absl::StrCat("must divide model.num_heads (", m.num_heads(), ")"));
  }
  if (ck.status().ok() && m.d_ff() % tp != 0) {
    ck.Fail("cluster.tensor_parallel", tp, absl::StrCat("must divide model.d_ff (", m.d_ff(), ")"));
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
}

// The xPU's figures: set (by cluster.xpu.preset or by hand) and in range,
// its on-die energy model and its power.
void CheckXpu(const servesim::v1::XpuSpec& x, Checker& ck) {
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
}

// cluster.power: the host's share and the per-xPU cap.
void CheckPower(const servesim::v1::ClusterSpec& c, Checker& ck) {
  const auto& x = c.xpu();
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

// The node size and the links: within a replica, to the router, and the
// NIC where groups span nodes.
void CheckLinks(const servesim::v1::ClusterSpec& c, Checker& ck) {
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
}

// scheduler.*: the batch and token limits, KV blocks, overheads and reserve.
void CheckScheduler(const servesim::v1::SchedulerSpec& s, Checker& ck) {
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
}

// slo.*: the latency targets (tbt_s where set).
void CheckSlo(const servesim::v1::Scenario& p, Checker& ck) {
  ck.Positive("slo.ttft_s", p.slo().ttft_s());
  ck.Positive("slo.tpot_s", p.slo().tpot_s());
  if (p.slo().has_tbt_s()) ck.Positive("slo.tbt_s", p.slo().tbt_s());
}

// The attention device's settings, and the overlap policy and rule, which
// need one.
void CheckAttentionDevice(const servesim::v1::ModelSpec& m, const servesim::v1::ClusterSpec& c,
                          Checker& ck) {
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
    ck.PositiveAtMost("cluster.attention_pool.memory_bytes_per_unit", pool.memory_bytes_per_unit(),
                      kMaxMemoryBytes);
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
}

}  // namespace

Layout LayoutOf(const servesim::v1::Scenario& p) {
  const auto& c = p.cluster();
  Layout layout;
  layout.tp = c.tensor_parallel();
  layout.pp = c.has_pipeline_parallel() ? c.pipeline_parallel() : 1;
  layout.dp = c.has_data_parallel() ? c.data_parallel() : 1;
  layout.moe = p.model().num_experts() > 0;
  layout.mla = p.model().kv_lora_rank() > 0;
  return layout;
}

absl::Status CheckScenario(const LoadedScenario& sc, const Layout& layout) {
  const auto& p = sc.proto;
  const auto& m = p.model();
  const auto& c = p.cluster();
  Checker ck(sc);
  CheckModelShape(m, ck);
  // The output's ranges come between the model's shape and its widths, as
  // they always have: the first error found is the one reported.
  CheckOutput(p.output(), ck);
  CheckModelWidths(m, ck);
  CheckExperts(m, ck);
  CheckLatentAttention(m, ck);
  CheckWindowsAndDtypes(m, layout, ck);
  CheckReplicasAndRanks(c, layout, ck);
  CheckModelOnAttentionDevice(m, c, layout, ck);
  CheckPipelineParallel(m, c, layout, ck);
  CheckTensorParallel(m, c, layout, ck);
  CheckXpu(c.xpu(), ck);
  CheckPower(c, ck);
  CheckLinks(c, ck);
  CheckScheduler(p.scheduler(), ck);
  CheckSlo(p, ck);
  CheckAttentionDevice(m, c, ck);
  return ck.status();
}

}  // namespace servesim::scenario::internal
