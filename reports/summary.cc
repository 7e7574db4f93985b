// The run's summary (reports/summary.h): summary.json, written section by
// section (the scenario, the requests, latency and the SLO, batches and
// the KV cache, disaggregation, links, energy, the attention device), and
// the table `servesim run` prints, block by block. Each section appends
// its keys in the file's fixed order with fixed number formats, so the
// same run gives the same bytes.
#include "reports/summary.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "devices/model.h"
#include "devices/prune_common.h"

namespace servesim::reports {
namespace {

using metrics::Distribution;
using metrics::Summary;
using scenario::ResolvedScenario;
using workload::Workload;

// A distribution with no samples has no statistics: null, not 0.
std::string Dist(const Distribution& d) {
  if (d.count == 0) {
    return "{\"count\": 0, \"mean\": null, \"p50\": null, \"p90\": null, \"p99\": null, "
           "\"max\": null}";
  }
  return absl::StrCat("{\"count\": ", d.count, ", \"mean\": ", FormatFigure(d.mean),
                      ", \"p50\": ", FormatFigure(d.p50), ", \"p90\": ", FormatFigure(d.p90),
                      ", \"p99\": ", FormatFigure(d.p99), ", \"max\": ", FormatFigure(d.max), "}");
}

std::string Ms(double s) { return absl::StrFormat("%10.2f", s * 1e3); }

// Appends summary.json's "key": value lines, two spaces in; the last
// line of the object has no comma.
// line of the object has no comma. A figure that is null is listed in
// `nulls` with the reason (summary.json's "nulls").
struct JsonFields {
  std::string* j;
  std::vector<std::pair<std::string, std::string>>* nulls = nullptr;
  void operator()(const std::string& k, const std::string& v, bool last = false) const {
    absl::StrAppend(j, "  ", JsonString(k), ": ", v, last ? "\n" : ",\n");
    if (nulls != nullptr && v == "null") nulls->emplace_back(k, NullReason(k));
  }
  // Why a figure came out undefined (a ratio over nothing).
  static std::string NullReason(absl::string_view k) {
    if (k == "energy_per_token_j") return "no output token was generated";
    if (k == "energy_per_good_request_j") return "no request met the SLO";
    if (k == "power_mean_w") return "no simulated time passed";
    if (absl::StrContains(k, "prefix_cache_hit_rate")) return "no prompt token was looked up";
    if (k == "makespan_s" || absl::StartsWith(k, "throughput_") || k == "slo_attainment" ||
        k == "goodput_requests_per_s" || k == "energy_per_request_j") {
      return "no request finished";
    }
    return "not defined for this run: a ratio over a count or a time that is zero here";
  }
};

// A distribution's field; with no samples its statistics are null, for
// `why`.
void DistField(const JsonFields& kv, const std::string& k, const Distribution& d, const char* why) {
  kv(k, Dist(d));
  if (d.count == 0 && kv.nulls != nullptr) kv.nulls->emplace_back(k, why);
}

// The scenario: its name, model, xPU, parallelism, workload and KV capacity.
void AddScenarioFields(const ResolvedScenario& sc, const Workload& wl, const JsonFields& kv) {
  const auto& p = sc.proto;
  kv("scenario", JsonString(p.name()));
  kv("model", JsonString(sc.model.name));
  kv("xpu", JsonString(p.cluster().xpu().preset()));
  kv("replicas", absl::StrCat(sc.replicas));
  kv("tensor_parallel", absl::StrCat(sc.tensor_parallel));
  if (sc.model.moe()) {
    kv("data_parallel", absl::StrCat(sc.data_parallel));
    kv("expert_parallel", p.cluster().expert_parallel() ? "true" : "false");
  }
  if (sc.pipeline_parallel > 1) kv("pipeline_parallel", absl::StrCat(sc.pipeline_parallel));
  if (sc.has_attention_device) {
    kv("attention_device", JsonString(sc.attention_label));
    kv("overlap_policy", JsonString(scheduler::OverlapPolicyName(sc.planner.overlap)));
  }
  if (sc.tbt_slo_s > 0) kv("slo_tbt_s", FormatFigure(sc.tbt_slo_s));
  kv("seed", absl::StrCat(sc.seed));
  kv("workload", JsonString(wl.description));
  kv("kv_capacity_blocks_per_replica", absl::StrCat(sc.kv.blocks * sc.ranks()));
  kv("kv_capacity_tokens_per_replica", absl::StrCat(sc.kv.tokens * sc.ranks()));
}

// What arrived, what was served or rejected, and the throughput.
void AddRequestFields(const ResolvedScenario& sc, const Workload& wl, const Summary& s,
                      double simulated_s, const JsonFields& kv) {
  kv("requests", absl::StrCat(s.requests));
  kv("requests_completed", absl::StrCat(s.completed));
  kv("requests_rejected", absl::StrCat(s.rejected));
  kv("requests_rejected_too_long", absl::StrCat(s.rejected_too_long));
  kv("requests_rejected_kv_capacity", absl::StrCat(s.rejected_kv_capacity));
  if (sc.reject_late || (sc.disaggregated() && sc.prefill_pool->reject_late)) {
    kv("requests_rejected_late", absl::StrCat(s.rejected_late));
  }
  kv("trace_rows_skipped_failed", absl::StrCat(wl.skipped_failed));
  kv("trace_rows_outside_window", absl::StrCat(wl.outside_window));
  kv("preemptions", absl::StrCat(s.preemptions));
  kv("iterations", absl::StrCat(s.iterations));
  kv("input_tokens", absl::StrCat(s.input_tokens));
  kv("output_tokens", absl::StrCat(s.output_tokens));
  kv("makespan_s", FormatFigure(s.makespan_s));
  kv("simulated_time_s", FormatFigure(simulated_s));
  kv("throughput_tokens_per_s", FormatFigure(s.throughput_tokens_per_s));
  kv("throughput_requests_per_s", FormatFigure(s.throughput_requests_per_s));
}

// The latency distributions (and how their percentiles were taken) and
// the per-request SLO.
void AddLatencyFields(const Summary& s, const JsonFields& kv) {
  DistField(kv, "ttft_s", s.ttft_s, "no request got its first token");
  DistField(kv, "tbt_s", s.tbt_s, "no request got a second token");
  DistField(kv, "tpot_s", s.tpot_s, "no request finished with more than one output token");
  DistField(kv, "e2e_s", s.e2e_s, "no request finished");
  // Only when a sketch answered (runs whose percentiles are all exact keep
  // the file they always had, as complete runs have no "partial" key).
  if (!s.ttft_s.exact || !s.tbt_s.exact || !s.tpot_s.exact || !s.e2e_s.exact) {
    auto method = [](const Distribution& d) {
      return d.exact ? std::string("\"exact\"")
                     : absl::StrFormat("\"sketch(rel_err=%g)\"", metrics::kSketchRelativeError);
    };
    kv("percentiles",
       absl::StrCat("{\"ttft_s\": ", method(s.ttft_s), ", \"tbt_s\": ", method(s.tbt_s),
                    ", \"tpot_s\": ", method(s.tpot_s), ", \"e2e_s\": ", method(s.e2e_s), "}"));
  }
  kv("slo_ttft_s", FormatFigure(s.slo_ttft_s));
  kv("slo_tpot_s", FormatFigure(s.slo_tpot_s));
  kv("slo_met_requests", absl::StrCat(s.slo_met));
  kv("slo_attainment", FormatFigure(s.slo_attainment));
  kv("goodput_requests_per_s", FormatFigure(s.goodput_requests_per_s));
}

// The iterations' batch-size bounds, by name.
std::string BatchBoundsJson(const Summary& s) {
  std::string b = "{";
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&b, i ? ", " : "", "\"",
                    scheduler::BatchBoundName(static_cast<scheduler::BatchBound>(i)),
                    "\": ", s.bound_iterations[i]);
  }
  return b + "}";
}

// Per lower KV tier: its hits and its traffic.
std::string KvTiersJson(const Summary& s) {
  std::string b = "[";
  for (size_t i = 0; i < s.kv_tiers.size(); ++i) {
    const metrics::KvTierTotals& k = s.kv_tiers[i];
    absl::StrAppend(
        &b, i ? ", " : "", "{\"name\": ", JsonString(k.name),
        ", \"capacity_blocks\": ", k.capacity_blocks, ", \"hit_tokens\": ", k.hit_tokens,
        ", \"hit_rate\": ",
        FormatFigure(s.tiered_query_tokens > 0 ? static_cast<double>(k.hit_tokens) /
                                                     static_cast<double>(s.tiered_query_tokens)
                                               : 0.0),
        ", \"loaded_blocks\": ", k.loaded_blocks, ", \"stored_blocks\": ", k.stored_blocks,
        ", \"dropped_blocks\": ", k.dropped_blocks,
        ", \"loaded_bytes\": ", FormatFigure(k.loaded_bytes),
        ", \"stored_bytes\": ", FormatFigure(k.stored_bytes),
        ", \"energy_j\": ", FormatFigure(k.energy_j));
    if (k.cluster_store) {
      absl::StrAppend(&b, ", \"network_bytes\": ", FormatFigure(k.network_bytes),
                      ", \"network_steps\": ", k.network_steps,
                      ", \"contention_s\": ", FormatFigure(k.contention_s));
    }
    absl::StrAppend(&b, "}");
  }
  return b + "]";
}

// Batches, KV cache use, prefix caching and the KV tiers.
void AddBatchAndKvFields(const ResolvedScenario& sc, const Summary& s, const JsonFields& kv) {
  kv("batch_size_mean", FormatFigure(s.batch_size_mean));
  kv("batch_size_max", absl::StrCat(s.batch_size_max));
  kv("kv_utilization_mean", FormatFigure(s.kv_utilization_mean));
  kv("kv_utilization_max", FormatFigure(s.kv_utilization_max));
  kv("batch_bound_iterations", BatchBoundsJson(s));
  if (sc.prefix_block_tokens() > 0) {
    kv("prefix_cache_hit_tokens", absl::StrCat(s.prefix_hit_tokens));
    kv("prefix_cache_query_tokens", absl::StrCat(s.prefix_query_tokens));
    kv("prefix_cache_hit_rate",
       FormatFigure(s.prefix_query_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) /
                                                    static_cast<double>(s.prefix_query_tokens)
                                              : 0.0));
  }
  if (!s.kv_tiers.empty()) {
    // Per lower tier (docs/kv_tiers.md): its share of the prompt tokens
    // admitted (hit_rate), and its traffic.
    kv("kv_tiers", KvTiersJson(s));
  }
}

// One pool of a disaggregated cluster (`index` 0: prefill, 1: decode).
std::string PoolJson(const ResolvedScenario& ps, const Summary& s, int index) {
  std::string o = absl::StrCat("{\"replicas\": ", ps.replicas,
                               ", \"xpu\": ", JsonString(ps.proto.cluster().xpu().preset()),
                               ", \"tensor_parallel\": ", ps.tensor_parallel);
  if (ps.data_parallel > 1) absl::StrAppend(&o, ", \"data_parallel\": ", ps.data_parallel);
  if (ps.pipeline_parallel > 1) {
    absl::StrAppend(&o, ", \"pipeline_parallel\": ", ps.pipeline_parallel);
  }
  if (ps.has_attention_device) {
    absl::StrAppend(&o, ", \"attention_device\": ", JsonString(ps.attention_label));
  }
  absl::StrAppend(&o, ", \"kv_capacity_tokens_per_replica\": ", ps.kv.tokens * ps.ranks());
  if (ps.batching.prefix_caching) {
    // The pool's own: a decode replica's hits are prompt tokens whose
    // KV did not move.
    const int64_t hit = s.pool_prefix_hit_tokens[index];
    const int64_t query = s.pool_prefix_query_tokens[index];
    absl::StrAppend(
        &o, ", \"prefix_cache_hit_tokens\": ", hit, ", \"prefix_cache_query_tokens\": ", query,
        ", \"prefix_cache_hit_rate\": ",
        FormatFigure(query > 0 ? static_cast<double>(hit) / static_cast<double>(query) : 0.0));
  }
  return o + "}";
}

// A disaggregated cluster's pools, the hand-offs and TTFT's parts
// (docs/disaggregation.md).
void AddDisaggregationFields(const ResolvedScenario& sc, const Summary& s, const JsonFields& kv) {
  kv("prefill_pool", PoolJson(*sc.prefill_pool, s, 0));
  kv("decode_pool", PoolJson(*sc.decode_pool, s, 1));
  kv("kv_transfer_policy", JsonString(sc.kv_layerwise ? "layerwise" : "after_prefill"));
  kv("handoffs", absl::StrCat(s.handoffs));
  kv("kv_transfer_bytes", FormatFigure(s.kv_bytes));
  kv("ttft_prefill_s", Dist(s.ttft_prefill_s));
  kv("ttft_kv_transfer_s", Dist(s.ttft_transfer_s));
  kv("ttft_decode_s", Dist(s.ttft_decode_s));
  kv("ttft_kv_transfer_share", FormatFigure(s.ttft_transfer_share));
  if (s.collective_bytes > 0) {
    kv("collective_nic_bytes", FormatFigure(s.collective_bytes));
    kv("collective_shared_steps", absl::StrCat(s.collective_flows));
    kv("collective_contention_s", FormatFigure(s.collective_extra_s));
  }
}

// The platform's links (a disaggregated cluster's fabric, a colocated
// cluster's NIC links to its KV store).
void AddLinkFields(const ResolvedScenario& sc, const Summary& s, const JsonFields& kv) {
  std::string links = "[";
  for (size_t i = 0; i < s.links.size(); ++i) {
    absl::StrAppend(&links, i ? ", " : "", "{\"name\": ", JsonString(s.links[i].name),
                    ", \"bytes\": ", FormatFigure(s.links[i].bytes),
                    ", \"utilization\": ", FormatFigure(s.links[i].utilization),
                    ", \"peak_utilization\": ", FormatFigure(s.links[i].peak_utilization), "}");
  }
  kv("link_bin_s", FormatFigure(sc.proto.output().link_bin_s()));
  kv("links", links + "]");
}

// The energy's parts, by name.
std::string EnergyPartsJson(const metrics::EnergyParts& e) {
  std::string parts = "{";
  bool first = true;
  for (auto [name, v] : {std::pair<const char*, double>{"xpu_compute", e.xpu_compute},
                         {"xpu_memory", e.xpu_memory},
                         {"xpu_active", e.xpu_active},
                         {"xpu_idle", e.xpu_idle},
                         {"device_compute", e.device_compute},
                         {"device_memory", e.device_memory},
                         {"device_static", e.device_static},
                         {"links", e.links},
                         {"host", e.host}}) {
    absl::StrAppend(&parts, first ? "" : ", ", "\"", name, "\": ", FormatFigure(v));
    first = false;
  }
  return parts + "}";
}

// Energy and power, and the iterations slowed by a power cap or limit.
void AddEnergyFields(const ResolvedScenario& sc, const Summary& s, const JsonFields& kv) {
  kv("energy_j", FormatFigure(s.energy_j));
  kv("energy_static_j", FormatFigure(s.energy_static_j));
  kv("energy_dynamic_j", FormatFigure(s.energy_dynamic_j));
  kv("energy_parts_j", EnergyPartsJson(s.energy_parts));
  kv("energy_per_request_j", FormatFigure(s.energy_per_request_j));
  kv("energy_per_good_request_j", FormatFigure(s.energy_per_good_request_j));
  kv("power_mean_w", FormatFigure(s.power_mean_w));
  kv("power_peak_replica_w", FormatFigure(s.power_peak_replica_w));
  if (sc.xpu_power_cap_w > 0 || (sc.disaggregated() && (sc.prefill_pool->xpu_power_cap_w > 0 ||
                                                        sc.decode_pool->xpu_power_cap_w > 0))) {
    kv("power_capped_iterations", absl::StrCat(s.power_capped_iterations));
  }
  if (s.tdp_limited_iterations > 0) {
    kv("tdp_limited_iterations", absl::StrCat(s.tdp_limited_iterations));
  }
}

// The attention device: its fidelity and ratios' source where it has them,
// its busy time, DRAM traffic and parameters.
void AddAttentionDeviceFields(const ResolvedScenario& sc, const Summary& s, const JsonFields& kv) {
  if (sc.attention_device.has_topick() || sc.attention_device.has_spatten() ||
      sc.attention_device.has_cta() || sc.attention_device.has_lad()) {
    const v1::DeviceSpec& d = sc.attention_device;
    kv("attention_device_fidelity",
       JsonString(devices::FidelityName(d.has_topick()    ? d.topick().fidelity()
                                        : d.has_spatten() ? d.spatten().fidelity()
                                        : d.has_cta()     ? d.cta().fidelity()
                                                          : d.lad().fidelity())));
    // Where the keep/prune ratios charged (and listed below) come from.
    kv("attention_device_ratios_source", JsonString(devices::RatioSourceOf(d)));
  }
  kv("attention_device_busy_s", FormatFigure(s.device_busy_s));
  kv("attention_device_dram_bytes", FormatFigure(s.device_dram_bytes));
  std::string d = "{";
  for (size_t i = 0; i < s.device_parameters.size(); ++i) {
    absl::StrAppend(&d, i ? ", " : "", JsonString(s.device_parameters[i].first), ": ",
                    FormatFigure(s.device_parameters[i].second));
  }
  kv("attention_device_parameters", d + "}");
}

// The table's cluster line(s): per pool when disaggregated.
void AppendClusterLines(const ResolvedScenario& sc, std::string* out) {
  std::string& t = *out;
  if (sc.disaggregated()) {
    for (const auto* ps : {sc.prefill_pool.get(), sc.decode_pool.get()}) {
      absl::StrAppendFormat(&t, "  %-10s %d replica(s) x %d %s (TP=%d%s%s), KV %d tokens/replica\n",
                            ps == sc.prefill_pool.get() ? "prefill" : "decode", ps->replicas,
                            ps->tensor_parallel * ps->ranks(), ps->proto.cluster().xpu().preset(),
                            ps->tensor_parallel,
                            ps->data_parallel > 1 ? absl::StrCat(", DP=", ps->data_parallel) : "",
                            ps->has_attention_device ? absl::StrCat(", ", ps->attention_label) : "",
                            ps->kv.tokens * ps->ranks());
    }
  } else if (sc.data_parallel > 1) {
    absl::StrAppendFormat(
        &t, "  cluster    %d replica(s) x DP=%d x %d %s (TP=%d, %s), KV %d tokens/replica\n",
        sc.replicas, sc.data_parallel, sc.tensor_parallel, sc.proto.cluster().xpu().preset(),
        sc.tensor_parallel,
        sc.proto.cluster().expert_parallel() ? "experts split by expert" : "experts split by width",
        sc.kv.tokens * sc.data_parallel);
  } else if (sc.pipeline_parallel > 1) {
    absl::StrAppendFormat(
        &t, "  cluster    %d replica(s) x PP=%d x %d %s (TP=%d), KV %d tokens/replica\n",
        sc.replicas, sc.pipeline_parallel, sc.tensor_parallel, sc.proto.cluster().xpu().preset(),
        sc.tensor_parallel, sc.kv.tokens * sc.pipeline_parallel);
  } else {
    absl::StrAppendFormat(&t, "  cluster    %d replica(s) x %d %s (TP=%d), KV %d tokens/replica\n",
                          sc.replicas, sc.tensor_parallel, sc.proto.cluster().xpu().preset(),
                          sc.tensor_parallel, sc.kv.tokens);
  }
}

// The latency table, in milliseconds ("-" where nothing was measured).
void AppendLatencyTable(const Summary& s, std::string* out) {
  std::string& t = *out;
  absl::StrAppendFormat(&t, "\n  latency (ms)     p50        p90        p99       mean\n");
  auto row = [&](const char* name, const Distribution& d) {
    if (d.count == 0) {  // nothing measured: not 0.00
      absl::StrAppendFormat(&t, "  %-6s   %10s %10s %10s %10s\n", name, "-", "-", "-", "-");
      return;
    }
    absl::StrAppendFormat(&t, "  %-6s   %s %s %s %s\n", name, Ms(d.p50), Ms(d.p90), Ms(d.p99),
                          Ms(d.mean));
  };
  row("TTFT", s.ttft_s);
  row("TBT", s.tbt_s);
  row("TPOT", s.tpot_s);
  row("E2E", s.e2e_s);
}

// Where the prompt tokens were found across the KV tiers, and their traffic.
void AppendKvTierLines(const Summary& s, std::string* out) {
  std::string& t = *out;
  int64_t lower = 0;
  std::string parts;
  for (const metrics::KvTierTotals& k : s.kv_tiers) lower += k.hit_tokens;
  auto share = [&](int64_t tokens) {
    return s.tiered_query_tokens > 0
               ? 100.0 * static_cast<double>(tokens) / static_cast<double>(s.tiered_query_tokens)
               : 0.0;
  };
  for (const metrics::KvTierTotals& k : s.kv_tiers) {
    absl::StrAppendFormat(&parts, ", %s %.1f%%", k.name, share(k.hit_tokens));
  }
  double loaded = 0, stored = 0;
  for (const metrics::KvTierTotals& k : s.kv_tiers) {
    loaded += k.loaded_bytes;
    stored += k.stored_bytes;
  }
  absl::StrAppendFormat(&t,
                        "  KV tiers   prompt tokens found in HBM %.1f%%%s; %.2f GB loaded, "
                        "%.2f GB stored\n",
                        share(s.tiered_hit_tokens - lower), parts, loaded / 1e9, stored / 1e9);
  for (const metrics::KvTierTotals& k : s.kv_tiers) {
    if (k.network_steps == 0) continue;
    absl::StrAppendFormat(&t,
                          "  KV store   %.2f GB loaded from other replicas' nodes in %d steps, "
                          "%.2f ms lost to shared links\n",
                          k.network_bytes / 1e9, k.network_steps, 1e3 * k.contention_s);
  }
}

// A disaggregated cluster's hand-offs, and its collectives' traffic.
void AppendHandoffLines(const ResolvedScenario& sc, const Summary& s, std::string* out) {
  std::string& t = *out;
  double busiest = 0;
  std::string busiest_name = "-";
  for (const auto& l : s.links) {
    if (l.utilization > busiest) {
      busiest = l.utilization;
      busiest_name = l.name;
    }
  }
  absl::StrAppendFormat(
      &t,
      "  hand-off   %d requests, %.2f GB of KV (%s); TTFT mean = prefill %s + "
      "transfer %s + decode %s ms; transfer %.1f%% of TTFT; busiest link %s %.1f%%\n",
      s.handoffs, s.kv_bytes / 1e9, sc.kv_layerwise ? "layer-wise" : "after prefill",
      absl::StripLeadingAsciiWhitespace(Ms(s.ttft_prefill_s.mean)),
      absl::StripLeadingAsciiWhitespace(Ms(s.ttft_transfer_s.mean)),
      absl::StripLeadingAsciiWhitespace(Ms(s.ttft_decode_s.mean)), 100 * s.ttft_transfer_share,
      busiest_name, 100 * busiest);
  if (s.collective_bytes > 0) {
    absl::StrAppendFormat(&t,
                          "  collective %.2f GB out of nodes' NICs; %d steps as flows, %.2f ms "
                          "lost to shared or oversubscribed links\n",
                          s.collective_bytes / 1e9, s.collective_flows, 1e3 * s.collective_extra_s);
  }
}

// Energy and power, and the iterations slowed by a power cap or limit.
void AppendEnergyLine(const Summary& s, std::string* out) {
  std::string& t = *out;
  absl::StrAppendFormat(
      &t,
      "  energy     %.1f kJ (%.0f%% static), %.3f J per output token, %.1f J per "
      "request; power mean %.2f kW, peak replica %.2f kW%s\n",
      s.energy_j / 1e3, s.energy_j > 0 ? 100 * s.energy_static_j / s.energy_j : 0.0,
      s.energy_per_token_j, s.energy_per_request_j, s.power_mean_w / 1e3,
      s.power_peak_replica_w / 1e3,
      absl::StrCat(
          s.power_capped_iterations > 0
              ? absl::StrCat("; ", s.power_capped_iterations, " iterations slowed by the power cap")
              : "",
          s.tdp_limited_iterations > 0
              ? absl::StrCat("; ", s.tdp_limited_iterations, " at the xPUs' power limit")
              : ""));
}

}  // namespace

std::string FormatFigure(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.9g", v);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string SummaryJson(const ResolvedScenario& sc, const Workload& wl, const Summary& s,
                        double simulated_s, bool partial) {
  std::string j = partial ? "{\n  \"partial\": true,\n" : "{\n";
  std::vector<std::pair<std::string, std::string>> nulls;
  JsonFields kv{&j, &nulls};
  AddScenarioFields(sc, wl, kv);
  AddRequestFields(sc, wl, s, simulated_s, kv);
  AddLatencyFields(s, kv);
  AddBatchAndKvFields(sc, s, kv);
  if (sc.disaggregated()) AddDisaggregationFields(sc, s, kv);
  if (!s.links.empty()) AddLinkFields(sc, s, kv);
  AddEnergyFields(sc, s, kv);
  if (sc.has_attention_device) AddAttentionDeviceFields(sc, s, kv);
  const std::string per_token = FormatFigure(s.energy_per_token_j);
  if (per_token == "null")
    nulls.emplace_back("energy_per_token_j", "no output token was generated");
  kv.nulls = nullptr;
  kv("energy_per_token_j", per_token, nulls.empty());
  // Every null figure above, with why (none in a run that served).
  if (!nulls.empty()) {
    std::vector<std::string> items;
    for (const auto& [k, why] : nulls)
      items.push_back(absl::StrCat(JsonString(k), ": ", JsonString(why)));
    kv("nulls", absl::StrCat("{", absl::StrJoin(items, ", "), "}"), true);
  }
  j += "}\n";
  return j;
}

std::string FormatSummaryTable(const ResolvedScenario& sc, const Workload& wl, const Summary& s,
                               const RunInfo& info) {
  std::string t;
  absl::StrAppendFormat(&t, "servesim: %s\n", sc.proto.name());
  absl::StrAppendFormat(&t, "  model      %s (%s)\n", sc.model.name,
                        devices::DTypeName(sc.model.dtype));
  AppendClusterLines(sc, &t);
  absl::StrAppendFormat(&t, "  workload   %s\n\n", wl.description);
  absl::StrAppendFormat(
      &t,
      "  requests   %d arrived, %d done, %d rejected (%d too long, %d over KV capacity%s), %d "
      "preemptions\n",
      s.requests, s.completed, s.rejected, s.rejected_too_long, s.rejected_kv_capacity,
      s.rejected_late > 0 ? absl::StrCat(", ", s.rejected_late, " late for the TTFT SLO") : "",
      s.preemptions);
  absl::StrAppendFormat(&t, "  throughput %.1f tokens/s, %.3f requests/s over %.1f s\n",
                        s.throughput_tokens_per_s, s.throughput_requests_per_s, s.makespan_s);
  AppendLatencyTable(s, &t);
  absl::StrAppendFormat(&t,
                        "\n  SLO        TTFT <= %.3g s and TPOT <= %.3g s: %.2f%% attained, "
                        "goodput %.3f requests/s\n",
                        s.slo_ttft_s, s.slo_tpot_s, 100 * s.slo_attainment,
                        s.goodput_requests_per_s);
  absl::StrAppendFormat(&t, "  batch      mean %.2f, max %d over %d iterations\n",
                        s.batch_size_mean, s.batch_size_max, s.iterations);
  absl::StrAppendFormat(&t, "  KV cache   mean %.1f%%, max %.1f%% used\n",
                        100 * s.kv_utilization_mean, 100 * s.kv_utilization_max);
  if (!s.kv_tiers.empty()) AppendKvTierLines(s, &t);
  if (sc.disaggregated()) AppendHandoffLines(sc, s, &t);
  AppendEnergyLine(s, &t);
  absl::StrAppendFormat(&t, "  time       %.1f s simulated in %.2f s wall (%.0fx real time)\n",
                        info.simulated_s, info.wall_s,
                        info.wall_s > 0 ? info.simulated_s / info.wall_s : 0.0);
  return t;
}

}  // namespace servesim::reports
