// Bounded metrics: the quantile sketch keeps its stated error, the radix
// sort equals std::sort, and the collector merges replicas and retires
// requests in order as the run goes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "metrics/collector.h"
#include "metrics/key_heap.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/test_util.h"

namespace servesim::metrics {
namespace {


// Log-normal samples (spread over 6 decades) from a fixed stream.
std::vector<double> Samples(int n, uint64_t seed) {
  Rng rng(seed, "test.sketch");
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const double u1 = std::max(rng.Uniform(), 1e-300), u2 = rng.Uniform();
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    v.push_back(0.02 * std::exp(1.5 * z));
  }
  return v;
}

TEST(SortValuesTest, RadixSortEqualsStdSort) {
  // Above the radix threshold and below it; negatives, both zeros,
  // duplicates, denormals, infinities and a single-digit run (all equal).
  Rng rng(42, "sort");
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{5000}, size_t{200000}}) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      switch (i % 7) {
        case 0: v[i] = rng.Uniform() * 0.05; break;
        case 1: v[i] = -rng.Normal() * 1e3; break;
        case 2: v[i] = (i % 14 == 2) ? 0.0 : -0.0; break;
        case 3: v[i] = 0.03125; break;
        case 4: v[i] = std::numeric_limits<double>::denorm_min() * double(i % 5); break;
        case 5: v[i] = (i % 10 == 5) ? std::numeric_limits<double>::infinity()
                                     : -std::numeric_limits<double>::infinity(); break;
        default: v[i] = std::ldexp(rng.Uniform(), static_cast<int>(i % 200) - 100);
      }
    }
    std::vector<double> want = v;
    std::sort(want.begin(), want.end());
    SortValues(&v);
    ASSERT_EQ(v.size(), want.size());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], want[i]) << n << " at " << i;
  }
  std::vector<double> same(10000, 0.25);
  SortValues(&same);
  EXPECT_EQ(same, std::vector<double>(10000, 0.25));
}

TEST(QuantileSketchTest, EstimatesWithinTheStatedRelativeError) {
  std::vector<double> values = Samples(300000, 1);
  QuantileSketch sketch;
  for (double v : values) sketch.Add(v);
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const double bound = kSketchRelativeError * (1 + 1e-9);
  for (int64_t rank = 0; rank < 300000; rank += 997) {
    ASSERT_LE(std::fabs(sketch.ValueAtRank(rank) - sorted[rank]), bound * sorted[rank])
        << "rank " << rank;
  }
  const Distribution exact = Summarize(sorted);
  for (auto [q, want] : {std::pair{0.5, exact.p50}, {0.9, exact.p90}, {0.99, exact.p99}}) {
    EXPECT_LE(std::fabs(sketch.Quantile(q) - want), bound * want) << q;
  }
  EXPECT_EQ(sketch.ValueAtRank(299999), sorted.back());
  EXPECT_EQ(sketch.ValueAtRank(0), sorted.front());
  // 6 decades at 2e-4 per bucket: ~70k buckets, far below the cap.
  EXPECT_LT(sketch.num_buckets(), 100000u);
}

TEST(QuantileSketchTest, MergeEqualsOneSketchOfEverything) {
  const std::vector<double> a = Samples(20000, 2), b = Samples(30000, 3);
  QuantileSketch sa, sb, all;
  for (double v : a) sa.Add(v), all.Add(v);
  for (double v : b) sb.Add(v), all.Add(v);
  sa.Merge(sb);
  ASSERT_EQ(sa.count(), 50000);
  for (int64_t rank = 0; rank < 50000; rank += 101) {
    ASSERT_EQ(sa.ValueAtRank(rank), all.ValueAtRank(rank)) << rank;
  }
}

TEST(QuantileSketchTest, InfinityCountsAsTheLargestValue) {
  // The bucket index of +inf once converted inf to int64 (undefined); it
  // now shares the largest finite value's bucket. (1 to 1.8e308 spans more
  // buckets than the sketch keeps, so it merges its lowest ones: only the
  // order of ranks and the top one are checked.)
  QuantileSketch sketch;
  sketch.Add(1.0);
  sketch.Add(std::numeric_limits<double>::infinity());
  sketch.Add(2.0);
  ASSERT_EQ(sketch.count(), 3);
  EXPECT_LE(sketch.ValueAtRank(0), sketch.ValueAtRank(1));
  EXPECT_LT(sketch.ValueAtRank(1), sketch.ValueAtRank(2));
  EXPECT_GT(sketch.ValueAtRank(2), 1e307);
  EXPECT_LE(sketch.num_buckets(), static_cast<size_t>(QuantileSketch::kMaxBuckets));
}

TEST(TimeSeriesTest, PointsPastTheSpanLandInTheLastBin) {
  // A partial run's summary spans the clock at the failure, while
  // fast-forwarded iterations recorded already may start later (here
  // 10^12 s over a 1 s span: 10^12 bins past the last, once cast to int).
  TimeSeries series;
  IterationRecord it;
  it.duration_s = 0.25;
  it.batch_size = 2;
  it.decode_tokens = 3;
  for (double start : {0.1, 0.6, 1e12}) {
    it.start_s = start;
    series.Add(it);
  }
  ASSERT_TRUE(series.exact());
  const TimeSeries::Binned b = series.Bin(1.0, 4, 1);
  EXPECT_EQ(b.tokens, (std::vector<double>{3, 0, 3, 3}));
  EXPECT_EQ(b.batch_w, (std::vector<double>{0.25, 0, 0.25, 0.25}));
  // A zero span (a run that ended at t = 0) puts every point after 0 in
  // the last bin (x / 0 = inf, once cast as well).
  EXPECT_EQ(series.Bin(0.0, 4, 1).tokens, (std::vector<double>{0, 0, 0, 9}));
}

// Records in blocks doubling from 64 up to 2 MiB: read back in insertion
// order across every block boundary, drained into a vector in order (the
// list left empty and usable), moved whole.
TEST(HugeBlocksTest, KeepsInsertionOrderAcrossBlocksDrainsAndMoves) {
  struct Rec {
    int64_t i;
    double x;
  };
  constexpr size_t kPer = HugeBlocks<Rec>::kMaxPerBlock;
  EXPECT_EQ(kPer, size_t{131072});  // 2 MiB of 16-byte records
  // 64 + 128 + ... + 65,536 = 131,008 in the growing blocks, then full ones.
  const size_t n = 131008 + 2 * kPer + 17;
  HugeBlocks<Rec> list;
  EXPECT_TRUE(list.empty());
  for (size_t i = 0; i < n; ++i) {
    list.push_back({static_cast<int64_t>(i), 0.5 * static_cast<double>(i)});
    if (i == 63 || i == 64 || i == 131007 || i == 131008) {
      EXPECT_EQ(list.back().i, static_cast<int64_t>(i));
    }
  }
  list.back().x = -1;
  ASSERT_EQ(list.size(), n);
  int64_t next = 0;
  bool in_order = true;
  list.ForEach([&](const Rec& r) {
    in_order = in_order && r.i == next &&
               (r.x == 0.5 * static_cast<double>(next) || static_cast<size_t>(next) == n - 1);
    ++next;
  });
  EXPECT_TRUE(in_order);
  EXPECT_EQ(next, static_cast<int64_t>(n));

  HugeBlocks<Rec> moved = std::move(list);
  EXPECT_TRUE(list.empty());  // NOLINT: a moved-from list is empty
  EXPECT_EQ(moved.size(), n);
  std::vector<Rec, HugePageAllocator<Rec>> out = {{-7, 0}};
  moved.DrainInto(&out);
  EXPECT_TRUE(moved.empty());
  ASSERT_EQ(out.size(), n + 1);
  EXPECT_EQ(out[0].i, -7);
  for (size_t i = 0; i < n; ++i) {
    if (out[i + 1].i != static_cast<int64_t>(i)) {
      ADD_FAILURE() << "record " << i << " drained as " << out[i + 1].i;
      break;
    }
  }
  EXPECT_EQ(out.back().x, -1);
  moved.push_back({5, 5});  // usable again, from a small block
  EXPECT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved.back().i, 5);
}

TEST(QuantileAccumulatorTest, ExactUpToTheThresholdThenSketch) {
  const std::vector<double> values = Samples(5000, 4);
  QuantileAccumulator exact(5000), sketched(1000);
  for (double v : values) exact.Add(v), sketched.Add(v);
  std::vector<double> copy = values;
  const Distribution want = Summarize(copy);
  const Distribution e = exact.ToDistribution();
  EXPECT_TRUE(e.exact);
  EXPECT_EQ(e.p50, want.p50);
  EXPECT_EQ(e.p99, want.p99);
  EXPECT_EQ(e.mean, want.mean);
  const Distribution s = sketched.ToDistribution();
  EXPECT_FALSE(s.exact);
  EXPECT_FALSE(sketched.exact());
  EXPECT_EQ(sketched.stored(), 0);
  EXPECT_EQ(s.count, 5000);
  EXPECT_EQ(s.max, want.max);
  EXPECT_NEAR(s.mean, want.mean, 1e-12 * want.mean);
  for (auto [got, exp] : {std::pair{s.p50, want.p50}, {s.p90, want.p90}, {s.p99, want.p99}}) {
    EXPECT_LE(std::fabs(got - exp), kSketchRelativeError * exp);
  }
}

// A step's equal gaps come as one Add(value, count): the same runs, count,
// summary and sketch (past the threshold, mid-run) as `count` Adds.
TEST(QuantileAccumulatorTest, AddingARunEqualsAddingItsSamplesOneByOne) {
  const std::vector<double> values = Samples(400, 11);
  for (int64_t threshold : {int64_t{1} << 20, int64_t{150}}) {
    QuantileAccumulator runs(threshold), each(threshold);
    for (int i = 0; i < 900; ++i) {
      // Runs of 1 to 12 samples; a value that repeats the one before now
      // and then, so that runs merge.
      const double v = i % 5 == 4 ? values[((i - 1) * 13) % 400] : values[(i * 13) % 400];
      const int64_t n = 1 + i % 12;
      runs.Add(v, n);
      for (int64_t k = 0; k < n; ++k) each.Add(v);
      ASSERT_EQ(runs.stored(), each.stored()) << "after run " << i;
      ASSERT_EQ(runs.exact(), each.exact()) << "after run " << i;
    }
    runs.Add(values[0], 0);  // nothing
    EXPECT_EQ(runs.exact(), threshold > 150);
    const Distribution a = runs.ToDistribution(), b = each.ToDistribution();
    EXPECT_EQ(a.count, b.count);
    EXPECT_EQ(a.mean, b.mean);
    EXPECT_EQ(a.p50, b.p50);
    EXPECT_EQ(a.p90, b.p90);
    EXPECT_EQ(a.p99, b.p99);
    EXPECT_EQ(a.max, b.max);
  }
}

TEST(QuantileAccumulatorTest, RunsOfEqualGapsAreStoredOnceAndSummariseAsEverySample) {
  // An iteration's tokens share one gap: samples in runs of 1 to 9 equal
  // values, with values that come back in later runs, and both zeros.
  // About 6,000 runs (above the radix sort's threshold of 4,096) and 400.
  for (auto [distinct, samples] : {std::pair{8000, 30000}, std::pair{300, 2000}}) {
    const std::vector<double> values = Samples(distinct, 7);
    std::vector<double> all;
    QuantileAccumulator acc(int64_t{1} << 20);
    for (int i = 0; static_cast<int>(all.size()) < samples; ++i) {
      double v = values[(i * 7919) % distinct];
      if (i % 97 == 0) v = (i % 2 == 0) ? 0.0 : -0.0;
      for (int k = 0; k <= i % 9; ++k) all.push_back(v), acc.Add(v);
    }
    ASSERT_TRUE(acc.exact());
    EXPECT_EQ(acc.count(), static_cast<int64_t>(all.size()));
    EXPECT_LT(acc.stored(), static_cast<int64_t>(all.size()) / 4);
    std::vector<double> sorted = all;
    const Distribution want = Summarize(sorted);
    const Distribution got = acc.ToDistribution();
    EXPECT_TRUE(got.exact);
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.mean, want.mean);  // to the bit: the same sum, in the same order
    EXPECT_EQ(got.p50, want.p50);
    EXPECT_EQ(got.p90, want.p90);
    EXPECT_EQ(got.p99, want.p99);
    EXPECT_EQ(got.max, want.max);
    for (size_t r = 0; r < sorted.size(); r += 37) {
      ASSERT_EQ(acc.ValueAtRank(static_cast<int64_t>(r)), sorted[r]) << "rank " << r;
    }
    EXPECT_EQ(acc.ValueAtRank(static_cast<int64_t>(sorted.size()) - 1), sorted.back());
    // Samples added after a summary join the ones sorted for it.
    for (int i = 0; i < 500; ++i) {
      const double v = values[(i * 31) % distinct] * 3;
      all.push_back(v), acc.Add(v);
    }
    std::vector<double> more = all;
    const Distribution want_more = Summarize(more);
    const Distribution got_more = acc.ToDistribution();
    EXPECT_EQ(got_more.count, want_more.count);
    EXPECT_EQ(got_more.mean, want_more.mean);
    EXPECT_EQ(got_more.p50, want_more.p50);
    EXPECT_EQ(got_more.p99, want_more.p99);
    EXPECT_EQ(got_more.max, want_more.max);
  }
  // The limit counts stored runs, not samples: 100 runs of 50 stay exact
  // under a limit of 100, and the 101st run switches to the sketch.
  QuantileAccumulator acc(100);
  for (int r = 0; r < 100; ++r) {
    for (int k = 0; k < 50; ++k) acc.Add(0.001 * (r + 1));
  }
  EXPECT_TRUE(acc.exact());
  EXPECT_EQ(acc.ToDistribution().p50, 0.0505);  // ranks 2499 and 2500: runs 50 and 51
  acc.Add(1.0);
  EXPECT_FALSE(acc.exact());
  EXPECT_EQ(acc.count(), 5001);
  EXPECT_EQ(acc.ToDistribution().max, 1.0);
}

// -------------------------------------------------------- collector ----

class FakeSink : public RecordSink {
 public:
  void OnRequest(const RequestRecord& r) override { requests.push_back(r.id); }
  void OnIteration(const IterationRecord& it) override {
    iterations.push_back({it.replica, it.start_s});
  }
  std::vector<int64_t> requests;
  std::vector<std::pair<int, double>> iterations;
};

IterationRecord Iter(int replica, double start) {
  IterationRecord it;
  it.replica = replica;
  it.start_s = start;
  it.duration_s = 0.5;
  it.batch_size = 1;
  return it;
}

TEST(MetricsCollectorTest, MergesReplicasInStartOrderAsTheyGo) {
  FakeSink sink;
  MetricsOptions o;
  o.replicas = 2;
  o.sink = &sink;
  MetricsCollector m(o);
  double floor = 2.5;
  m.SetArrivalFloor([&floor] { return floor; });
  m.MarkIdle(1, 0);
  // Replica 0 runs ahead to 3 s; idle replica 1 can start no earlier than
  // the next arrival (2.5 s), so everything before that goes out.
  for (double t : {0.0, 1.0, 2.0, 3.0}) m.AddIteration(Iter(0, t));
  EXPECT_EQ(sink.iterations.size(), 3u);
  EXPECT_EQ(m.buffered_iterations(), 1);
  m.AddIteration(Iter(1, 2.5));
  ASSERT_EQ(sink.iterations.size(), 4u);
  EXPECT_EQ(sink.iterations[3], (std::pair<int, double>{1, 2.5}));
  // Replica 1 is busy at 2.5 s: its next iteration may start before 3 s.
  EXPECT_EQ(m.buffered_iterations(), 1);
  m.MarkDone(1);
  ASSERT_EQ(sink.iterations.size(), 5u);
  EXPECT_EQ(sink.iterations[4], (std::pair<int, double>{0, 3.0}));
  // Equal starts: the lower replica first.
  FakeSink sink2;
  o.sink = &sink2;
  MetricsCollector ties(o);
  floor = 5;
  ties.SetArrivalFloor([&floor] { return floor; });
  ties.MarkIdle(0, 0);
  ties.AddIteration(Iter(1, 5));
  EXPECT_TRUE(sink2.iterations.empty());  // replica 0 may still start at 5 s
  ties.AddIteration(Iter(0, 5));
  ties.Finish();
  ASSERT_EQ(sink2.iterations.size(), 2u);
  EXPECT_EQ(sink2.iterations[0].first, 0);
  EXPECT_EQ(ties.iteration_totals().iterations, 2);
  EXPECT_EQ(ties.iteration_totals().busy_s, 1.0);
}

TEST(MetricsCollectorTest, RequestsLeaveInIdOrderOnceFinal) {
  FakeSink sink;
  MetricsOptions o;
  o.sink = &sink;
  o.ttft_slo_s = 1;
  o.tpot_slo_s = 1;
  MetricsCollector m(o);
  for (int64_t id = 0; id < 4; ++id) m.OnArrival({id, 0.0, 10, 1, {}});
  EXPECT_EQ(m.live_requests(), 4);
  scheduler::RequestObserver* obs = m.ObserverFor(0);
  scheduler::RequestState s1;
  s1.spec = {1, 0.0, 10, 1, {}};
  obs->OnFirstToken(s1, 0.2);
  obs->OnFinish(s1, 0.2);
  EXPECT_TRUE(sink.requests.empty());  // 0 is still in flight
  obs->OnReject({0, 0.0, 10, 1, {}}, scheduler::RejectReason::kTooLong, 0.3);
  EXPECT_EQ(sink.requests, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.live_requests(), 2);
  m.Finish();  // 2 and 3 leave as pending
  EXPECT_EQ(sink.requests, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(m.live_requests(), 0);
  const Summary s = ComputeSummary(m);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.rejected_too_long, 1);
  EXPECT_EQ(s.slo_met, 1);
  EXPECT_EQ(s.ttft_s.p50, 0.2);
}

}  // namespace
}  // namespace servesim::metrics

namespace servesim::metrics {
namespace {

// KeyHeap against a scan: 2,000 random sets and removals over 37 items
// (keys from a small range, so ties are common); after each, the top is
// the least (key, item) of the items in.
TEST(KeyHeapTest, TopIsTheLeastKeyThenItemAfterEverySetAndRemove) {
  constexpr int kItems = 37;
  KeyHeap heap(kItems);
  std::vector<double> key(kItems, 0);
  std::vector<bool> in(kItems, false);
  uint64_t x = 12345;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int step = 0; step < 2000; ++step) {
    const int item = static_cast<int>(next() % kItems);
    if (next() % 4 == 0) {
      heap.Remove(item);
      in[item] = false;
    } else {
      key[item] = static_cast<double>(next() % 9);
      heap.Set(item, key[item]);
      in[item] = true;
    }
    int least = -1;
    for (int i = 0; i < kItems; ++i) {
      if (in[i] && (least < 0 || key[i] < key[least])) least = i;
    }
    ASSERT_EQ(heap.empty(), least < 0) << step;
    if (least >= 0) {
      ASSERT_EQ(heap.top(), least) << step;
      ASSERT_EQ(heap.key(least), key[least]) << step;
    }
  }
}

}  // namespace
}  // namespace servesim::metrics
