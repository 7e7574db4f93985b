// timeline.json: the schedule of sampled iterations in the Chrome trace
// event format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
// which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// One process per replica; in it one thread (track) per resource: the
// iterations themselves, the xPUs (one TP group, in lockstep), the link to
// the attention device each way, the device, and the KV copy. Spans are
// complete events ("ph":"X") in microseconds of simulated time, named by
// stage ("qkv", "attention", "projection", "ff", "send q/k/v", ...), with
// the layer and head group in args. The first output.timeline_layers layers
// of an iteration are drawn span by span; the rest are one span per track.
// On each track spans never overlap (CliTest.TimelineAndReport... checks it).
#ifndef SERVESIM_REPORTS_TIMELINE_H_
#define SERVESIM_REPORTS_TIMELINE_H_

#include <string>

#include "metrics/collector.h"
#include "scenario/scenario.h"

namespace servesim::reports {

// A partial run (stopped early: `why`) has "partial": true and "stopped"
// in otherData.
std::string TimelineJson(const scenario::ResolvedScenario& sc,
                         const metrics::MetricsCollector& metrics, bool partial = false,
                         const std::string& why = "");

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_TIMELINE_H_
