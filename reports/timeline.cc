#include "reports/timeline.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "reports/summary.h"

namespace servesim::reports {
namespace {

using metrics::MetricsCollector;
using metrics::TimelineIteration;
using scenario::ResolvedScenario;

constexpr int kIterationTid = 0;
// Track tids follow scheduler::Track, after the iterations' track.
int Tid(scheduler::Track t) { return 1 + static_cast<int>(t); }
using scheduler::kNumTracks;

}  // namespace

std::string TimelineJson(const ResolvedScenario& sc, const MetricsCollector& metrics, bool partial,
                         const std::string& why) {
  const int32_t detail = sc.proto.output().timeline_layers();
  const int64_t layers = sc.model.num_layers;
  const std::string device = sc.has_attention_device ? sc.attention_label : std::string();
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"scenario\":";
  absl::StrAppend(&out, JsonString(sc.proto.name()), ",\"overlap_policy\":\"",
                  scheduler::OverlapPolicyName(sc.planner.overlap), "\"",
                  partial ? absl::StrCat(",\"partial\":true,\"stopped\":", JsonString(why)) : "",
                  "},\n\"traceEvents\":[\n");
  // Metadata: process and thread names, in a fixed order.
  bool first = true;
  // Each event appended in place (no string per event): a separator first,
  // then the event's text.
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (int64_t r = 0; r < sc.replicas; ++r) {
    // A disaggregated cluster's replica is its pool's.
    const bool prefill = sc.disaggregated() && r < sc.prefill_pool->replicas;
    const ResolvedScenario& pool = !sc.disaggregated() ? sc
                                   : prefill           ? *sc.prefill_pool
                                                       : *sc.decode_pool;
    const std::string label =
        !sc.disaggregated() ? absl::StrCat("replica ", r)
                            : absl::StrCat("replica ", r, prefill ? " (prefill)" : " (decode)");
    sep();
    absl::StrAppendFormat(&out,
                          R"({"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":%s}})",
                          r, JsonString(label));
    sep();
    absl::StrAppendFormat(
        &out, R"({"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"iterations"}})",
        r, kIterationTid);
    for (int t = 0; t < kNumTracks; ++t) {
      const auto track = static_cast<scheduler::Track>(t);
      std::string name = scheduler::TrackName(track);
      if (track == scheduler::Track::kXpu) {
        name = absl::StrCat("xpu (", pool.tensor_parallel, " x ",
                            pool.proto.cluster().xpu().preset(), ", one shown)");
      } else if (track == scheduler::Track::kDevice) {
        name = pool.has_attention_device ? pool.attention_label : device;
      }
      if (!pool.has_attention_device && track != scheduler::Track::kXpu) continue;
      sep();
      absl::StrAppendFormat(
          &out, R"({"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}})", r,
          Tid(track), JsonString(name));
      sep();
      absl::StrAppendFormat(
          &out,
          R"({"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}})", r,
          Tid(track), Tid(track));
    }
  }
  // Microseconds rounded to the printed nanosecond: ts + dur of one span
  // never passes the next span's ts on the same track.
  auto us = [](double s) { return std::round(s * 1e9) / 1e3; };
  for (const TimelineIteration& it : metrics.timeline()) {
    sep();
    absl::StrAppendFormat(
        &out,
        R"({"ph":"X","name":"iteration %d","cat":"iteration","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"batch_size":%d,"prefill_tokens":%d,"decode_tokens":%d}})",
        it.index, it.replica, kIterationTid, us(it.start_s),
        us(it.start_s + it.duration_s) - us(it.start_s), it.batch_size, it.prefill_tokens,
        it.decode_tokens);
    // The replica's power over the iteration (static + its ops' energy /
    // its duration), a counter track that holds until the next sample.
    sep();
    absl::StrAppendFormat(&out, R"({"ph":"C","name":"power","pid":%d,"ts":%.3f,"args":{"W":%.6g}})",
                          it.replica, us(it.start_s), it.power_w);
    // Layers past the detail limit: one span per track.
    std::array<double, kNumTracks> lo, hi;
    lo.fill(std::numeric_limits<double>::infinity());
    hi.fill(-std::numeric_limits<double>::infinity());
    for (const scheduler::Span& s : it.spans) {
      const int t = static_cast<int>(s.track);
      if (s.layer >= detail) {
        lo[t] = std::min(lo[t], s.start_s);
        hi[t] = std::max(hi[t], s.end_s);
        continue;
      }
      const std::string name = s.group >= 0 ? absl::StrCat(std::string(s.name), " g", s.group)
                                            : std::string(s.name);
      sep();
      absl::StrAppendFormat(
          &out,
          R"({"ph":"X","name":%s,"cat":"%s","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"iteration":%d,"layer":%d,"group":%d}})",
          JsonString(name), s.layer >= 0 ? "layer" : "once", it.replica, Tid(s.track),
          us(it.start_s + s.start_s), us(it.start_s + s.end_s) - us(it.start_s + s.start_s),
          it.index, s.layer, s.group);
    }
    for (int t = 0; t < kNumTracks; ++t) {
      if (hi[t] <= lo[t]) continue;
      sep();
      absl::StrAppendFormat(
          &out,
          R"({"ph":"X","name":"layers %d-%d","cat":"layers","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"iteration":%d}})",
          detail, layers - 1, it.replica, 1 + t, us(it.start_s + lo[t]),
          us(it.start_s + hi[t]) - us(it.start_s + lo[t]), it.index);
    }
  }
  // KV transfers (disaggregated clusters): async spans on the decode
  // replica, from the first part leaving the prefill replica to the last
  // landing; they may overlap one another.
  for (const metrics::TimelineTransfer& t : metrics.timeline_transfers()) {
    const std::string common =
        absl::StrFormat(R"("cat":"kv","name":"KV from replica %d","id":%d,"pid":%d,"tid":0)",
                        t.from, t.request_id, t.to);
    sep();
    absl::StrAppendFormat(
        &out, R"({"ph":"b",%s,"ts":%.3f,"args":{"request":%d,"bytes":%.0f,"seconds":%.9g}})",
        common, us(t.start_s), t.request_id, t.bytes, t.end_s - t.start_s);
    sep();
    absl::StrAppendFormat(&out, R"({"ph":"e",%s,"ts":%.3f})", common, us(t.end_s));
  }
  out += "\n]}\n";
  return out;
}

}  // namespace servesim::reports
