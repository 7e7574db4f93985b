// report.html's series over simulated time, kept in bounded memory.
#ifndef SERVESIM_METRICS_TIME_SERIES_H_
#define SERVESIM_METRICS_TIME_SERIES_H_

#include <cstdint>
#include <vector>

#include "metrics/huge_pages.h"
#include "metrics/records.h"

namespace servesim::metrics {

// What report.html plots over simulated time: per iteration, its decode
// tokens, batch-size x duration, duration, busy times and energy, binned once
// the run's length is known. Exact (the iterations kept, 56 bytes each, in
// HugeBlocks) while the run has at most kExactIterations iterations; beyond,
// added into kFineBins fixed-width bins whose width doubles as time goes on,
// and each fine bin goes to the output bin holding its midpoint.
class TimeSeries {
 public:
  static constexpr int64_t kExactIterations = int64_t{1} << 20;
  static constexpr int kFineBins = 8192;
  static constexpr int kShownReplicas = 4;  // report.html plots r0..r3

  void Add(const IterationRecord& it);
  struct Binned {
    std::vector<double> tokens, batch_time, batch_w;
    std::vector<double> energy;                           // the iterations' energy, J, all replicas
    std::vector<std::vector<double>> xpu_busy, dev_busy;  // [replica][bin]
  };
  Binned Bin(double span_s, int bins, int64_t replicas) const;
  bool exact() const { return fine_width_s_ == 0; }

 private:
  struct Point {
    double start_s, duration_s, xpu_busy_s, device_busy_s, energy_j;
    int64_t decode_tokens;
    int32_t batch_size, replica;
  };
  void AddFine(const Point& p);
  HugeBlocks<Point> points_;
  double fine_width_s_ = 0;  // 0: exact
  std::vector<double> f_tokens_, f_batch_time_, f_batch_w_, f_energy_;
  std::vector<std::vector<double>> f_xpu_, f_dev_;
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_TIME_SERIES_H_
