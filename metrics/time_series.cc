#include "metrics/time_series.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace servesim::metrics {
namespace {

// The bin of `x` among `bins` bins of `width`: clamped to [0, bins - 1]
// before the conversion, so a point far past the span (a partial run's
// fast-forwarded iterations end after the clock), a zero width or a NaN
// never converts an out-of-range double.
int BinOf(double x, double width, int bins) {
  const double b = x / width;
  if (!(b >= 0)) return 0;
  if (b >= bins - 1) return bins - 1;
  return static_cast<int>(b);
}

}  // namespace

// ------------------------------------------------------- time series ----

void TimeSeries::Add(const IterationRecord& it) {
  const Point p{it.start_s,  it.duration_s,    it.xpu_busy_s, it.device_busy_s,
                it.energy_j, it.decode_tokens, it.batch_size, it.replica};
  if (fine_width_s_ == 0) {
    points_.push_back(p);
    if (static_cast<int64_t>(points_.size()) <= kExactIterations) return;
    // Too many to keep: fine bins wide enough for twice the time so far.
    double width = 1.0 / 1024;
    while (width * kFineBins <= 2 * p.start_s) width *= 2;
    fine_width_s_ = width;
    f_tokens_.assign(kFineBins, 0);
    f_batch_time_.assign(kFineBins, 0);
    f_batch_w_.assign(kFineBins, 0);
    f_energy_.assign(kFineBins, 0);
    f_xpu_.assign(kShownReplicas, std::vector<double>(kFineBins, 0));
    f_dev_.assign(kShownReplicas, std::vector<double>(kFineBins, 0));
    points_.ForEach([&](const Point& q) { AddFine(q); });
    points_.clear();
    return;
  }
  AddFine(p);
}

void TimeSeries::AddFine(const Point& p) {
  while (p.start_s >= fine_width_s_ * kFineBins) {
    // Double the width: bin j of the new series is bins 2j and 2j+1.
    auto halve = [](std::vector<double>& v) {
      for (int j = 0; j < kFineBins / 2; ++j) v[j] = v[2 * j] + v[2 * j + 1];
      std::fill(v.begin() + kFineBins / 2, v.end(), 0.0);
    };
    halve(f_tokens_);
    halve(f_batch_time_);
    halve(f_batch_w_);
    halve(f_energy_);
    for (auto& v : f_xpu_) halve(v);
    for (auto& v : f_dev_) halve(v);
    fine_width_s_ *= 2;
  }
  const int b = BinOf(p.start_s, fine_width_s_, kFineBins);
  f_tokens_[b] += static_cast<double>(p.decode_tokens);
  f_batch_time_[b] += p.batch_size * p.duration_s;
  f_batch_w_[b] += p.duration_s;
  f_energy_[b] += p.energy_j;
  if (p.replica < kShownReplicas) {
    f_xpu_[p.replica][b] += p.xpu_busy_s;
    f_dev_[p.replica][b] += p.device_busy_s;
  }
}

TimeSeries::Binned TimeSeries::Bin(double span_s, int bins, int64_t replicas) const {
  Binned out;
  const double bw = span_s / bins;
  out.tokens.assign(bins, 0);
  out.batch_time.assign(bins, 0);
  out.batch_w.assign(bins, 0);
  out.energy.assign(bins, 0);
  out.xpu_busy.assign(replicas, std::vector<double>(bins, 0));
  out.dev_busy.assign(replicas, std::vector<double>(bins, 0));
  if (fine_width_s_ == 0) {
    // The arithmetic report.html always did, in the same order.
    points_.ForEach([&](const Point& p) {
      const int b = BinOf(p.start_s, bw, bins);
      out.tokens[b] += static_cast<double>(p.decode_tokens);
      out.batch_time[b] += p.batch_size * p.duration_s;
      out.batch_w[b] += p.duration_s;
      out.energy[b] += p.energy_j;
      if (p.replica < replicas) {
        out.xpu_busy[p.replica][b] += p.xpu_busy_s;
        out.dev_busy[p.replica][b] += p.device_busy_s;
      }
    });
    return out;
  }
  for (int j = 0; j < kFineBins; ++j) {
    const double mid = (j + 0.5) * fine_width_s_;
    const int b = BinOf(mid, bw, bins);
    out.tokens[b] += f_tokens_[j];
    out.batch_time[b] += f_batch_time_[j];
    out.batch_w[b] += f_batch_w_[j];
    out.energy[b] += f_energy_[j];
    for (int64_t r = 0; r < std::min<int64_t>(replicas, kShownReplicas); ++r) {
      out.xpu_busy[r][b] += f_xpu_[r][j];
      out.dev_busy[r][b] += f_dev_[r][j];
    }
  }
  return out;
}

}  // namespace servesim::metrics
