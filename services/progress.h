// Progress on stderr: simulated time against the trace's length, requests
// done, real-time factor and ETA. On a terminal one line redrawn in place
// (runs longer than a second); with --progress always into a log (Slurm,
// nohup) a new line every `every_s` wall seconds.
#ifndef SERVESIM_SERVICES_PROGRESS_H_
#define SERVESIM_SERVICES_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "metrics/live_sink.h"

namespace servesim::services {

class ProgressBar : public metrics::LiveSink {
 public:
  // `out` null: silent. `trace_s`: arrival time of the last request.
  // `every_s` > 0: lines every that many wall seconds instead of a bar.
  ProgressBar(std::FILE* out, int64_t requests, double trace_s, double every_s = 0)
      : out_(out), requests_(requests), trace_s_(trace_s), every_s_(every_s) {}

  // The line shown at simulated time `sim_s` after `wall_s` (for tests).
  std::string Line(double sim_s, double wall_s) const;

  void OnArrival(int) override {}
  void OnFirstToken(int, double) override {}
  void OnToken(int, double) override {}
  void OnFinish(int, double) override { ++done_; }
  void OnReject(int, scheduler::RejectReason) override { ++done_; }
  void OnIteration(const metrics::LiveIteration&) override {}
  void OnClock(double simulated_s, double wall_s) override;
  void OnDone(double simulated_s, double wall_s) override;

 private:
  std::FILE* out_;
  int64_t requests_;
  double trace_s_;
  double every_s_;
  int64_t done_ = 0;
  double last_draw_s_ = -1;
  bool drawn_ = false;
};

// Forwards every call to each sink in order.
class FanoutSink : public metrics::LiveSink {
 public:
  explicit FanoutSink(std::vector<metrics::LiveSink*> sinks) : sinks_(std::move(sinks)) {}
  void OnArrival(int r) override {
    for (auto* s : sinks_) s->OnArrival(r);
  }
  void OnFirstToken(int r, double t) override {
    for (auto* s : sinks_) s->OnFirstToken(r, t);
  }
  void OnToken(int r, double g) override {
    for (auto* s : sinks_) s->OnToken(r, g);
  }
  void OnFinish(int r, double e) override {
    for (auto* s : sinks_) s->OnFinish(r, e);
  }
  void OnReject(int r, scheduler::RejectReason w) override {
    for (auto* s : sinks_) s->OnReject(r, w);
  }
  void OnIteration(const metrics::LiveIteration& it) override {
    for (auto* s : sinks_) s->OnIteration(it);
  }
  void OnClock(double sim, double wall) override {
    for (auto* s : sinks_) s->OnClock(sim, wall);
  }
  void OnDone(double sim, double wall) override {
    for (auto* s : sinks_) s->OnDone(sim, wall);
  }

 private:
  std::vector<metrics::LiveSink*> sinks_;
};

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_PROGRESS_H_
