#include "metrics/quantiles.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <utility>

#include "absl/base/casts.h"

namespace servesim::metrics {
namespace {

// Invariants of the run (ids in order, observers on live requests).
void Check(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "servesim: metrics invariant violated: " << what << "\n";
    std::abort();
  }
}

// An order-preserving key of a double's bits: flip every bit of negatives,
// the sign bit of the rest.
uint64_t OrderedBits(double d) {
  const uint64_t u = absl::bit_cast<uint64_t>(d);
  return (u >> 63) != 0 ? ~u : u | (uint64_t{1} << 63);
}

// Sorts `v` by key(element), ascending and stable: an LSD radix sort in
// passes of 11 bits (counts fit in L1), a pass whose digit is the same
// everywhere skipped; O(n) with one extra buffer.
template <typename V, typename Key>
void RadixSort(V* values, Key key) {
  V& v = *values;
  const size_t n = v.size();
  if (n == 0) return;
  V tmp(n);
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<size_t> count(size_t{1} << kBits);
  for (int shift = 0; shift < 64; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (const auto& x : v) ++count[(key(x) >> shift) & kMask];
    if (count[(key(v[0]) >> shift) & kMask] == n) continue;  // one digit: nothing moves
    size_t at = 0;
    for (size_t& c : count) {
      const size_t here = c;
      c = at;
      at += here;
    }
    for (const auto& x : v) tmp[count[(key(x) >> shift) & kMask]++] = x;
    v.swap(tmp);
  }
}

}  // namespace

// ------------------------------------------------------------ sketch ----

QuantileSketch::QuantileSketch(double relative_error)
    : relative_error_(relative_error),
      gamma_((1 + relative_error) / (1 - relative_error)),
      log_gamma_(std::log(gamma_)) {}

int64_t QuantileSketch::Index(double value) const {
  // +inf counts in the largest finite value's bucket (its index is ~35,000
  // at 1% error), never a cast of inf.
  return static_cast<int64_t>(
      std::ceil(std::log(std::min(value, std::numeric_limits<double>::max())) / log_gamma_));
}

double QuantileSketch::Estimate(int64_t index) const {
  return 2 * std::exp(static_cast<double>(index) * log_gamma_) / (gamma_ + 1);
}

void QuantileSketch::Add(double value, int64_t count) {
  if (count <= 0) return;
  if (count_ == 0) {
    min_ = max_ = value;
  } else {
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
  }
  count_ += count;
  if (!(value >= kMinPositive)) {
    zero_count_ += count;
    return;
  }
  // log() may round a value on a bucket's edge into its neighbour, which
  // is off by at most an ulp more than the stated error.
  int64_t i = Index(value);
  if (counts_.empty()) {
    offset_ = i;
    counts_.assign(1, 0);
  }
  if (i < offset_) {
    const int64_t grow = offset_ - i;
    if (static_cast<int64_t>(counts_.size()) + grow > kMaxBuckets) {
      i = offset_;  // collapsed into the lowest bucket
    } else {
      counts_.insert(counts_.begin(), static_cast<size_t>(grow), 0);
      offset_ = i;
    }
  } else if (i >= offset_ + static_cast<int64_t>(counts_.size())) {
    const int64_t size = i - offset_ + 1;
    if (size > kMaxBuckets) {
      // Collapse the lowest buckets into the new lowest one.
      const int64_t drop = size - kMaxBuckets;
      const int64_t keep_from = std::min<int64_t>(drop, static_cast<int64_t>(counts_.size()));
      int64_t folded = 0;
      for (int64_t k = 0; k < keep_from; ++k) folded += counts_[static_cast<size_t>(k)];
      counts_.erase(counts_.begin(), counts_.begin() + keep_from);
      offset_ += drop;
      if (counts_.empty()) counts_.assign(1, 0);
      counts_[0] += folded;
    }
    counts_.resize(static_cast<size_t>(i - offset_ + 1), 0);
  }
  counts_[static_cast<size_t>(i - offset_)] += count;
}

void QuantileSketch::Merge(const QuantileSketch& other) {
  Check(other.gamma_ == gamma_, "sketches of different accuracy merged");
  if (other.count_ == 0) return;
  if (count_ == 0) {
    *this = other;
    return;
  }
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  count_ += other.count_;
  zero_count_ += other.zero_count_;
  if (other.counts_.empty()) return;
  if (counts_.empty()) {
    counts_ = other.counts_;
    offset_ = other.offset_;
    return;
  }
  const int64_t lo = std::min(offset_, other.offset_);
  const int64_t hi = std::max(offset_ + static_cast<int64_t>(counts_.size()),
                              other.offset_ + static_cast<int64_t>(other.counts_.size()));
  std::vector<int64_t> merged(static_cast<size_t>(hi - lo), 0);
  for (size_t k = 0; k < counts_.size(); ++k) merged[k + static_cast<size_t>(offset_ - lo)] += counts_[k];
  for (size_t k = 0; k < other.counts_.size(); ++k) {
    merged[k + static_cast<size_t>(other.offset_ - lo)] += other.counts_[k];
  }
  counts_ = std::move(merged);
  offset_ = lo;
  if (static_cast<int64_t>(counts_.size()) > kMaxBuckets) {
    const size_t drop = counts_.size() - static_cast<size_t>(kMaxBuckets);
    int64_t folded = 0;
    for (size_t k = 0; k < drop; ++k) folded += counts_[k];
    counts_.erase(counts_.begin(), counts_.begin() + static_cast<std::ptrdiff_t>(drop));
    offset_ += static_cast<int64_t>(drop);
    counts_[0] += folded;
  }
}

double QuantileSketch::ValueAtRank(int64_t rank) const {
  if (count_ == 0) return 0;
  if (rank <= 0) return min_;
  if (rank >= count_ - 1) return max_;
  double value = 0;
  if (rank < zero_count_) {
    value = std::max(0.0, min_);
  } else {
    int64_t seen = zero_count_;
    for (size_t k = 0; k < counts_.size(); ++k) {
      seen += counts_[k];
      if (rank < seen) {
        value = Estimate(offset_ + static_cast<int64_t>(k));
        break;
      }
    }
  }
  return std::clamp(value, min_, max_);
}

double QuantileSketch::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double pos = q * static_cast<double>(count_ - 1);
  const int64_t lo = static_cast<int64_t>(std::floor(pos));
  const int64_t hi = std::min(lo + 1, count_ - 1);
  const double a = ValueAtRank(lo), b = ValueAtRank(hi);
  return a + (b - a) * (pos - static_cast<double>(lo));
}

// ------------------------------------------------------- accumulator ----

void SortValues(std::vector<double>* values) {
  if (values->size() < 4096) {
    std::sort(values->begin(), values->end());
    return;
  }
  RadixSort(values, OrderedBits);
}

Distribution Summarize(std::vector<double>& v) {
  SortValues(&v);
  return SummarizeSorted(v);
}

Distribution SummarizeSorted(const std::vector<double>& v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  auto pct = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  d.p50 = pct(0.50);
  d.p90 = pct(0.90);
  d.p99 = pct(0.99);
  d.max = v.back();
  return d;
}

QuantileAccumulator::QuantileAccumulator(int64_t exact_max_samples)
    : exact_max_samples_(exact_max_samples) {}

void QuantileAccumulator::Sort() const {
  if (sorted_valid_) return;
  auto& v = sorted_;
  v.clear();
  runs_.DrainInto(&v);  // frees its blocks as they are copied
  const size_t n = v.size();
  if (n < 4096) {
    std::sort(v.begin(), v.end(), [](const Run& a, const Run& b) { return a.value < b.value; });
  } else {
    RadixSort(&v, [](const Run& r) { return OrderedBits(r.value); });
  }
  // Equal values merged; counts made cumulative.
  size_t out = 0;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    total += v[i].count;
    if (out > 0 && v[out - 1].value == v[i].value) {
      v[out - 1].count = total;
    } else {
      v[out++] = {v[i].value, total};
    }
  }
  v.resize(out);
  sorted_valid_ = true;
}

double QuantileAccumulator::ValueAtRank(int64_t rank) const {
  if (sketch_ != nullptr) return sketch_->ValueAtRank(rank);
  Sort();
  auto it = std::upper_bound(sorted_.begin(), sorted_.end(), rank,
                             [](int64_t r, const Run& run) { return r < run.count; });
  return it == sorted_.end() ? sorted_.back().value : it->value;
}

void QuantileAccumulator::Add(double value, int64_t count) {
  if (count <= 0) return;
  count_ += count;
  if (sorted_valid_) {
    // Back to unsorted runs (their order does not matter, only which values
    // were seen how often).
    int64_t before = 0;
    for (const Run& r : sorted_) {
      runs_.push_back({r.value, r.count - before});
      before = r.count;
    }
    sorted_valid_ = false;
    decltype(sorted_)().swap(sorted_);
  }
  if (sketch_ == nullptr) {
    if (!runs_.empty() && runs_.back().value == value) {
      runs_.back().count += count;
      return;
    }
    runs_.push_back({value, count});
    if (static_cast<int64_t>(runs_.size()) <= exact_max_samples_) return;
    sketch_ = std::make_unique<QuantileSketch>();
    runs_.ForEach([&](const Run& r) {
      sketch_->Add(r.value, r.count);
      for (int64_t k = 0; k < r.count; ++k) sum_ += r.value;
      max_ = std::max(max_, r.value);
    });
    runs_.clear();
    return;
  }
  sketch_->Add(value, count);
  for (int64_t k = 0; k < count; ++k) sum_ += value;  // the sum one Add at a time gives
  max_ = std::max(max_, value);
}

Distribution QuantileAccumulator::ToDistribution() const {
  Distribution d;
  d.count = count_;
  if (count_ == 0) return d;
  if (sketch_ == nullptr) {
    Sort();
    // Summed in ascending order, sample by sample, as Summarize sums the
    // sorted values: the same mean to the bit.
    double sum = 0;
    int64_t seen = 0;
    for (const Run& r : sorted_) {
      for (; seen < r.count; ++seen) sum += r.value;
    }
    d.mean = sum / static_cast<double>(count_);
    auto pct = [&](double q) {
      const double pos = q * static_cast<double>(count_ - 1);
      const int64_t lo = static_cast<int64_t>(std::floor(pos));
      const int64_t hi = std::min(lo + 1, count_ - 1);
      const double a = ValueAtRank(lo), b = ValueAtRank(hi);
      return a + (b - a) * (pos - static_cast<double>(lo));
    };
    d.p50 = pct(0.50);
    d.p90 = pct(0.90);
    d.p99 = pct(0.99);
    d.max = sorted_.back().value;
    return d;
  }
  d.exact = false;
  d.mean = sum_ / static_cast<double>(count_);
  d.p50 = sketch_->Quantile(0.50);
  d.p90 = sketch_->Quantile(0.90);
  d.p99 = sketch_->Quantile(0.99);
  d.max = max_;
  return d;
}

}  // namespace servesim::metrics
