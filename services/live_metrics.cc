#include "services/live_metrics.h"

#include <sstream>
#include <string>

#include "prometheus/text_serializer.h"

namespace servesim::services {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Latency buckets (seconds): TBT sits at tens of milliseconds, TTFT and E2E
// reach minutes under overload.
const Histogram::BucketBoundaries& TbtBuckets() {
  static const Histogram::BucketBoundaries b = {0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08,
                                                0.1,   0.15, 0.2,  0.3,  0.5,  1,    2,    5};
  return b;
}
const Histogram::BucketBoundaries& LongBuckets() {
  static const Histogram::BucketBoundaries b = {0.05, 0.1, 0.2, 0.5, 1,   2,   5,    10,
                                                20,   30,  60,  120, 300, 600, 1800, 3600};
  return b;
}

}  // namespace

LiveMetrics::LiveMetrics(const LiveMetricsConfig& c)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  auto& arrived = BuildCounter().Name("servesim_requests_arrived_total")
                      .Help("Requests that reached the replica").Register(r);
  auto& finished = BuildCounter().Name("servesim_requests_finished_total")
                       .Help("Requests that finished generating").Register(r);
  auto& rejected = BuildCounter().Name("servesim_requests_rejected_total")
                       .Help("Requests rejected at admission, by reason").Register(r);
  auto& preempted = BuildCounter().Name("servesim_requests_preempted_total")
                        .Help("Recompute preemptions").Register(r);
  auto& prefix_hit = BuildCounter().Name("servesim_prefix_cache_hit_tokens_total")
                         .Help("Prompt tokens found in the prefix cache at admission").Register(r);
  auto& prefix_query = BuildCounter().Name("servesim_prefix_cache_query_tokens_total")
                           .Help("Prompt tokens of requests admitted with prefix caching on")
                           .Register(r);
  tier_hit_ = &BuildCounter()
                   .Name("servesim_kv_tier_hit_tokens_total")
                   .Help("Prompt tokens loaded from a lower KV tier instead of computed, by tier")
                   .Register(r);
  auto& kv_bytes = BuildCounter()
                       .Name("servesim_kv_transfer_bytes_total")
                       .Help("KV bytes a decode replica received from the prefill pool")
                       .Register(r);
  auto& kv_transfer = BuildHistogram()
                          .Name("servesim_kv_transfer_seconds")
                          .Help("Prefill end to the whole KV at the decode replica")
                          .Register(r);
  auto& tokens = BuildCounter().Name("servesim_tokens_generated_total")
                     .Help("Output tokens generated").Register(r);
  auto& iterations = BuildCounter().Name("servesim_iterations_total")
                         .Help("Batched iterations run").Register(r);
  auto& queue = BuildGauge().Name("servesim_queue_length")
                    .Help("Requests waiting for admission").Register(r);
  auto& batch = BuildGauge().Name("servesim_batch_size")
                    .Help("Requests in the latest iteration").Register(r);
  auto& kv_used = BuildGauge().Name("servesim_kv_blocks_used")
                      .Help("KV-cache blocks in use").Register(r);
  auto& kv_total = BuildGauge().Name("servesim_kv_blocks_total")
                       .Help("KV-cache blocks in all").Register(r);
  auto& ttft = BuildHistogram().Name("servesim_ttft_seconds")
                   .Help("Time to first token").Register(r);
  auto& tbt = BuildHistogram().Name("servesim_tbt_seconds")
                  .Help("Time between consecutive tokens of a request").Register(r);
  auto& e2e = BuildHistogram().Name("servesim_e2e_seconds")
                  .Help("Arrival to last token").Register(r);
  auto& busy = BuildCounter().Name("servesim_device_busy_seconds_total")
                   .Help("Simulated seconds a device was busy").Register(r);
  auto& bytes = BuildCounter().Name("servesim_device_bytes_total")
                    .Help("Bytes a device moved, by level (dram: its memory cells; "
                          "link: sent over links; bg_bus/tsv/external: PIM levels)")
                    .Register(r);
  auto& energy = BuildCounter().Name("servesim_energy_joules_total")
                     .Help("Energy a device's ops spent (compute, memory, links)").Register(r);
  auto& power = BuildGauge().Name("servesim_power_watts")
                    .Help("Mean power over the latest iteration: static (idle, background, "
                          "host share) plus the ops' energy / its duration")
                    .Register(r);
  simulated_ = &BuildGauge().Name("servesim_simulated_seconds")
                    .Help("Simulated clock").Register(r).Add({});
  rtf_ = &BuildGauge().Name("servesim_realtime_factor")
              .Help("Simulated seconds per wall second so far").Register(r).Add({});
  trace_ = &BuildGauge().Name("servesim_trace_seconds")
                .Help("Arrival time of the workload's last request").Register(r).Add({});
  done_ = &BuildGauge().Name("servesim_run_done")
               .Help("1 once the simulation has ended").Register(r).Add({});
  BuildGauge().Name("servesim_run_info").Help("The run being simulated").Register(r)
      .Add({{"scenario", c.scenario}, {"version", "0.1.0"}}).Set(1);
  trace_->Set(c.trace_s);

  for (int i = 0; i < c.replicas; ++i) {
    const std::string rep = std::to_string(i);
    const prometheus::Labels l = {{"replica", rep}};
    const prometheus::Labels xpu = {{"replica", rep}, {"device", "xpu"}, {"kind", c.xpu_kind}};
    prometheus::Labels dev = {{"replica", rep}, {"device", c.device_kind}, {"kind", c.device_kind}};
    auto with = [](prometheus::Labels base, const char* k, const char* v) {
      base[k] = v;
      return base;
    };
    Replica x{};
    x.arrived = &arrived.Add(l);
    x.finished = &finished.Add(l);
    x.rejected_too_long = &rejected.Add(with(l, "reason", "too_long"));
    x.rejected_kv = &rejected.Add(with(l, "reason", "kv_capacity"));
    x.rejected_late = &rejected.Add(with(l, "reason", "late"));
    x.preempted = &preempted.Add(l);
    x.prefix_hit = &prefix_hit.Add(l);
    x.prefix_query = &prefix_query.Add(l);
    x.kv_bytes = &kv_bytes.Add(l);
    x.kv_transfer = &kv_transfer.Add(l, TbtBuckets());
    x.tokens = &tokens.Add(l);
    x.iterations = &iterations.Add(l);
    x.queue = &queue.Add(l);
    x.batch = &batch.Add(l);
    x.kv_used = &kv_used.Add(l);
    x.kv_total = &kv_total.Add(l);
    x.ttft = &ttft.Add(l, LongBuckets());
    x.tbt = &tbt.Add(l, TbtBuckets());
    x.e2e = &e2e.Add(l, LongBuckets());
    x.xpu_power = &power.Add(xpu);
    x.host_power = &power.Add({{"replica", rep}, {"device", "host"}, {"kind", "host"}});
    x.xpu_busy = &busy.Add(xpu);
    x.xpu_energy = &energy.Add(xpu);
    x.xpu_dram = &bytes.Add(with(xpu, "level", "dram"));
    x.xpu_link = &bytes.Add(with(xpu, "level", "link"));
    if (!c.device_kind.empty()) {
      x.dev_power = &power.Add(dev);
      x.dev_busy = &busy.Add(dev);
      x.dev_energy = &energy.Add(dev);
      x.dev_dram = &bytes.Add(with(dev, "level", "dram"));
      x.dev_bg = &bytes.Add(with(dev, "level", "bg_bus"));
      x.dev_tsv = &bytes.Add(with(dev, "level", "tsv"));
      x.dev_ext = &bytes.Add(with(dev, "level", "external"));
    }
    replicas_.push_back(x);
  }
}

std::string LiveMetrics::Render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

void LiveMetrics::OnArrival(int replica) { replicas_[replica].arrived->Increment(); }

void LiveMetrics::OnFirstToken(int replica, double ttft_s) {
  replicas_[replica].tokens->Increment();
  replicas_[replica].ttft->Observe(ttft_s);
}

void LiveMetrics::OnToken(int replica, double gap_s) {
  replicas_[replica].tokens->Increment();
  replicas_[replica].tbt->Observe(gap_s);
}

void LiveMetrics::OnFinish(int replica, double e2e_s) {
  replicas_[replica].finished->Increment();
  replicas_[replica].e2e->Observe(e2e_s);
}

void LiveMetrics::OnReject(int replica, scheduler::RejectReason why) {
  Replica& x = replicas_[replica];
  (why == scheduler::RejectReason::kTooLong ? x.rejected_too_long
   : why == scheduler::RejectReason::kLate  ? x.rejected_late
                                            : x.rejected_kv)
      ->Increment();
}

void LiveMetrics::OnKvTransfer(int replica, double bytes, double exposed_s) {
  replicas_[replica].kv_bytes->Increment(bytes);
  replicas_[replica].kv_transfer->Observe(exposed_s);
}

void LiveMetrics::OnLinks(const std::vector<std::pair<std::string, double>>& links) {
  auto& r = *registry_;
  auto& bytes = BuildCounter()
                    .Name("servesim_link_bytes_total")
                    .Help("KV bytes that crossed the link, counted as each transfer lands")
                    .Register(r);
  auto& bandwidth = BuildGauge()
                        .Name("servesim_link_bandwidth_bytes_per_second")
                        .Help("The link's bandwidth (per direction for an uplink's .up/.down)")
                        .Register(r);
  link_bytes_.clear();
  for (const auto& [name, bw] : links) {
    link_bytes_.push_back(&bytes.Add({{"link", name}}));
    bandwidth.Add({{"link", name}}).Set(bw);
  }
}

void LiveMetrics::OnLinkBytes(int link, double bytes) {
  link_bytes_[static_cast<size_t>(link)]->Increment(bytes);
}

void LiveMetrics::OnIteration(const metrics::LiveIteration& it) {
  Replica& x = replicas_[it.replica];
  x.iterations->Increment();
  x.queue->Set(static_cast<double>(it.queue_length));
  x.batch->Set(static_cast<double>(it.batch_size));
  x.kv_used->Set(static_cast<double>(it.kv_blocks_used));
  x.kv_total->Set(static_cast<double>(it.kv_blocks_total));
  if (it.preemptions_total > x.preemptions_seen) {
    x.preempted->Increment(static_cast<double>(it.preemptions_total - x.preemptions_seen));
    x.preemptions_seen = it.preemptions_total;
  }
  if (it.prefix_hit_tokens_total > x.prefix_hit_seen) {
    x.prefix_hit->Increment(static_cast<double>(it.prefix_hit_tokens_total - x.prefix_hit_seen));
    x.prefix_hit_seen = it.prefix_hit_tokens_total;
  }
  for (int k = 0; k < it.num_kv_tiers; ++k) {
    if (x.tier_hit[k] == nullptr) {
      x.tier_hit[k] = &tier_hit_->Add(
          {{"replica", std::to_string(it.replica)}, {"tier", std::string(it.kv_tier_names[k])}});
    }
    if (it.kv_tier_hit_tokens_total[k] > x.tier_hit_seen[k]) {
      x.tier_hit[k]->Increment(
          static_cast<double>(it.kv_tier_hit_tokens_total[k] - x.tier_hit_seen[k]));
      x.tier_hit_seen[k] = it.kv_tier_hit_tokens_total[k];
    }
  }
  if (it.prefix_query_tokens_total > x.prefix_query_seen) {
    x.prefix_query->Increment(
        static_cast<double>(it.prefix_query_tokens_total - x.prefix_query_seen));
    x.prefix_query_seen = it.prefix_query_tokens_total;
  }
  const double per_s = it.duration_s > 0 ? 1e-12 / it.duration_s : 0.0;
  x.xpu_power->Set(it.xpu_static_w + (it.xpu.energy_pj() + it.xpu_active_j * 1e12) * per_s);
  x.host_power->Set(it.host_w);
  if (x.dev_power != nullptr) x.dev_power->Set(it.device_static_w + it.device.energy_pj() * per_s);
  x.xpu_busy->Increment(it.xpu_busy_s);
  x.xpu_energy->Increment(it.xpu.energy_pj() * 1e-12);
  x.xpu_dram->Increment(it.xpu.dram_bytes);
  x.xpu_link->Increment(it.xpu.link_bytes);
  if (x.dev_busy != nullptr) {
    x.dev_busy->Increment(it.device_busy_s);
    x.dev_energy->Increment(it.device.energy_pj() * 1e-12);
    x.dev_dram->Increment(it.device.dram_bytes);
    x.dev_bg->Increment(it.device.bg_bus_bytes);
    x.dev_tsv->Increment(it.device.tsv_bytes);
    x.dev_ext->Increment(it.device.external_bytes);
  }
}

void LiveMetrics::OnClock(double simulated_s, double wall_s) {
  simulated_->Set(simulated_s);
  if (wall_s > 0) rtf_->Set(simulated_s / wall_s);
}

void LiveMetrics::OnDone(double simulated_s, double wall_s) {
  OnClock(simulated_s, wall_s);
  done_->Set(1);
}

}  // namespace servesim::services
