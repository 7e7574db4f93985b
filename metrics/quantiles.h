// Summary statistics of one metric's samples: mean, p50, p90, p99 and max.
//
// Percentiles interpolate linearly between the closest ranks (numpy's
// default) over the sorted values while a distribution has at most a given
// number of stored runs of equal consecutive samples
// (output.exact_percentile_max_samples, default 4M);
// above, they come from a log-bucket quantile sketch (DDSketch, Masson et
// al., VLDB 2019) whose every estimate is within kSketchRelativeError (1e-4)
// of the exact value; the max stays exact and the mean is a running sum.
#ifndef SERVESIM_METRICS_QUANTILES_H_
#define SERVESIM_METRICS_QUANTILES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "metrics/huge_pages.h"

namespace servesim::metrics {

// Relative error of the quantile sketch: every estimate v' of a value v
// has |v' - v| <= kSketchRelativeError * v.
inline constexpr double kSketchRelativeError = 1e-4;

// DDSketch-style quantile sketch of non-negative samples: bucket i counts
// the samples in (gamma^(i-1), gamma^i], gamma = (1 + a) / (1 - a), and
// answers with 2 gamma^i / (gamma + 1), within relative error a of any
// sample of the bucket. Samples below kMinPositive count as 0. At most
// kMaxBuckets buckets (8 MiB): beyond, the lowest collapse into one, which
// only loosens the smallest values' error. Mergeable.
class QuantileSketch {
 public:
  static constexpr double kMinPositive = 1e-12;
  static constexpr int64_t kMaxBuckets = int64_t{1} << 20;

  explicit QuantileSketch(double relative_error = kSketchRelativeError);
  void Add(double value) { Add(value, 1); }
  // `count` samples of `value`: one bucket update, as `count` Adds give.
  void Add(double value, int64_t count);
  void Merge(const QuantileSketch& other);
  int64_t count() const { return count_; }
  // The estimate of the `rank`-th smallest sample (0-based), clamped to
  // the exact min and max.
  double ValueAtRank(int64_t rank) const;
  // Linear interpolation between closest ranks, as Summarize.
  double Quantile(double q) const;
  double relative_error() const { return relative_error_; }
  size_t num_buckets() const { return counts_.size(); }

 private:
  int64_t Index(double value) const;
  double Estimate(int64_t index) const;

  double relative_error_;
  double gamma_;
  double log_gamma_;
  int64_t count_ = 0;
  int64_t zero_count_ = 0;
  int64_t offset_ = 0;            // index of counts_[0]
  std::vector<int64_t> counts_;
  double min_ = 0, max_ = 0;
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  bool exact = true;  // false: percentiles from the sketch
};
// Sorts `values` in place.
Distribution Summarize(std::vector<double>& values);
// The same of values already sorted ascending.
Distribution SummarizeSorted(const std::vector<double>& sorted);
// Sorts ascending, as std::sort does (equal values are indistinguishable);
// large vectors by an LSD radix sort on the values' bits, O(n): a run's
// millions of TBT gaps sort in a few passes instead of n log n comparisons.
// NaNs are not expected (the simulator makes none).
void SortValues(std::vector<double>* values);

// One metric's samples, stored as runs of equal consecutive values: the
// tokens of one decode iteration see the same gap (the iteration's
// duration), so the TBT gaps of a run's millions of tokens are about one
// run per iteration. Kept while there are at most `exact_max_samples`
// runs (percentiles exact, as Summarize over every sample), then folded
// into a QuantileSketch and dropped.
class QuantileAccumulator {
 public:
  struct Run {
    double value;
    int64_t count;
  };

  explicit QuantileAccumulator(int64_t exact_max_samples);
  void Add(double value) { Add(value, 1); }
  // `count` samples of `value`, as `count` calls of Add(value) would add
  // them.
  void Add(double value, int64_t count);
  Distribution ToDistribution() const;
  bool exact() const { return sketch_ == nullptr; }
  int64_t count() const { return count_; }
  // The runs stored (exact mode only; 0 in sketch mode).
  int64_t stored() const {
    return static_cast<int64_t>(sorted_valid_ ? sorted_.size() : runs_.size());
  }
  // The `rank`-th smallest sample (0-based, < count()): exact while
  // exact(), else the sketch's estimate. The runs are sorted on the first
  // call after an Add and kept, so the summary and the report sort once.
  double ValueAtRank(int64_t rank) const;
  const QuantileSketch* sketch() const { return sketch_.get(); }

 private:
  // Moves the runs into sorted_, sorted by value, equal values merged,
  // with each one's cumulative count (its last sample's rank + 1): one
  // copy of them in memory, not two. An Add moves them back.
  void Sort() const;

  int64_t exact_max_samples_;
  int64_t count_ = 0;
  mutable HugeBlocks<Run> runs_;  // chunked: no doubling spike as it grows
  mutable std::vector<Run, HugePageAllocator<Run>> sorted_;  // count: cumulative
  mutable bool sorted_valid_ = false;
  std::unique_ptr<QuantileSketch> sketch_;
  double sum_ = 0, max_ = 0;   // sketch mode
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_QUANTILES_H_
