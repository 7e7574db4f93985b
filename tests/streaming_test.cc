// Streaming workloads and bounded metrics (issue 8): the stream gives the
// requests the whole-file algorithm gave, errors name file:line, the
// quantile sketch keeps its stated error, and the collector's buffers stay
// bounded while a long run goes by.
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
#include "cluster/metrics.h"
#include "cluster/scenario.h"
#include "cluster/simulation.h"
#include "cluster/workload.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/test_util.h"

namespace servesim::cluster {
namespace {

using scheduler::RequestSpec;
using servesim::v1::WorkloadSpec;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;

#define SERVESIM_TRACES_ SERVESIM_SOURCE_DIR "/examples/traces/"
constexpr char kAzureConv[] = SERVESIM_TRACES_ "AzureLLMInferenceTrace_conv.csv";
constexpr char kAzureCode[] = SERVESIM_TRACES_ "AzureLLMInferenceTrace_code.csv";
constexpr char kMooncake[] = SERVESIM_TRACES_ "synthetic_trace.jsonl";
constexpr char kBurstGpt[] = SERVESIM_TRACES_ "burstgpt_slice.csv";
constexpr char kShareGpt[] =
    SERVESIM_TRACES_ "sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
#undef SERVESIM_TRACES_

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = absl::StrCat(::testing::TempDir(), "streaming_test_", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  return path;
}

struct Shaping {
  double rate_scale = 1;
  std::optional<double> window_start, window_end;
  std::optional<int64_t> max_requests;
};

void ApplyShaping(const Shaping& s, WorkloadSpec* spec) {
  if (s.rate_scale != 1) spec->set_rate_scale(s.rate_scale);
  if (s.window_start) spec->set_window_start_s(*s.window_start);
  if (s.window_end) spec->set_window_end_s(*s.window_end);
  if (s.max_requests) spec->set_max_requests(*s.max_requests);
}

// The whole-file algorithm LoadWorkload had before streaming: every
// arrival in a vector, rate_scale, stable sort, window, max_requests, shift
// and renumber. The reference the stream must reproduce.
std::vector<RequestSpec> Reference(std::vector<RequestSpec> requests, const Shaping& s,
                                   int64_t* outside) {
  if (s.rate_scale != 1) {
    for (RequestSpec& r : requests) r.arrival_s /= s.rate_scale;
  }
  std::stable_sort(requests.begin(), requests.end(),
                   [](const RequestSpec& a, const RequestSpec& b) {
                     return a.arrival_s < b.arrival_s;
                   });
  const size_t total = requests.size();
  const double lo = s.window_start.value_or(-std::numeric_limits<double>::infinity());
  const double hi = s.window_end.value_or(std::numeric_limits<double>::infinity());
  std::erase_if(requests, [&](const RequestSpec& r) {
    return !(r.arrival_s >= lo && r.arrival_s < hi);
  });
  if (s.max_requests && requests.size() > static_cast<size_t>(*s.max_requests)) {
    requests.resize(static_cast<size_t>(*s.max_requests));
  }
  *outside = static_cast<int64_t>(total - requests.size());
  const double shift = requests.front().arrival_s;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].id = static_cast<int64_t>(i);
    requests[i].arrival_s -= shift;
  }
  return requests;
}

std::vector<RequestSpec> FromRows(const TraceFile& file) {
  std::vector<RequestSpec> out;
  for (const TraceRow& row : file.rows) {
    out.push_back({0, row.timestamp_s, row.input_tokens, row.output_tokens});
  }
  return out;
}

// Pulls every request from a fresh stream of `spec`.
std::vector<RequestSpec> Drain(const WorkloadSpec& spec, Workload* summary = nullptr) {
  auto stream = OpenWorkload(spec, "", "", 7);
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return {};
  std::vector<RequestSpec> out;
  RequestSpec r;
  while (true) {
    auto more = (*stream)->Next(&r);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    out.push_back(r);
  }
  if (summary != nullptr) *summary = (*stream)->summary();
  return out;
}

::testing::AssertionResult Same(const std::vector<RequestSpec>& a,
                                const std::vector<RequestSpec>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " requests";
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].arrival_s != b[i].arrival_s ||
        a[i].input_tokens != b[i].input_tokens || a[i].output_tokens != b[i].output_tokens) {
      return ::testing::AssertionFailure()
             << "request " << i << ": id " << a[i].id << "/" << b[i].id << " arrival "
             << a[i].arrival_s << "/" << b[i].arrival_s << " tokens " << a[i].input_tokens
             << "," << a[i].output_tokens << "/" << b[i].input_tokens << ","
             << b[i].output_tokens;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------- streams ----

struct TraceCase {
  const char* path;
  Shaping shaping;
  int64_t expected_requests;
};

TEST(RequestStreamTest, TracesMatchTheWholeFileAlgorithm) {
  const TraceCase cases[] = {
      {kAzureConv, {}, 19366},
      {kAzureConv, {2.0, 100.0, 1000.0, 5000}, 5000},
      {kAzureConv, {0.5, std::nullopt, 600.0, std::nullopt}, 1445},
      {kAzureCode, {1.0, 30.0, std::nullopt, 200}, 200},
      {kBurstGpt, {}, 383},
      {kBurstGpt, {4.0, 50.0, 2000.0, std::nullopt}, 43},
      {kMooncake, {}, 3993},
      {kMooncake, {3.0, 10.0, 300.0, 300}, 300},
  };
  for (const TraceCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.path, " rate_scale ", c.shaping.rate_scale));
    absl::StatusOr<TraceFile> file = absl::EndsWith(c.path, ".jsonl")
                                         ? ReadMooncakeTrace(c.path)
                                     : absl::StrContains(c.path, "burstgpt")
                                         ? ReadBurstGptTrace(c.path)
                                         : ReadAzureTrace(c.path);
    ASSERT_TRUE(file.ok()) << file.status();
    int64_t outside = 0;
    const std::vector<RequestSpec> expected = Reference(FromRows(*file), c.shaping, &outside);
    WorkloadSpec spec;
    spec.mutable_trace()->set_path(c.path);
    ApplyShaping(c.shaping, &spec);
    Workload summary;
    const std::vector<RequestSpec> streamed = Drain(spec, &summary);
    EXPECT_TRUE(Same(streamed, expected));
    if (c.expected_requests > 0) {
      EXPECT_EQ(static_cast<int64_t>(streamed.size()), c.expected_requests);
    }
    EXPECT_EQ(summary.num_requests, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(summary.last_arrival_s, expected.back().arrival_s);
    EXPECT_EQ(summary.outside_window, outside);
    EXPECT_EQ(summary.rows_read,
              static_cast<int64_t>(file->rows.size()) + file->skipped_failed);
    EXPECT_EQ(summary.skipped_failed, file->skipped_failed);
    // LoadWorkload materialises the same stream.
    const auto loaded = LoadWorkload(spec, "", "", 7);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(Same(loaded->requests, expected));
    EXPECT_EQ(loaded->description, summary.description);
  }
}

TEST(RequestStreamTest, SyntheticMatchesTheVectorGenerator) {
  const auto pairs = ReadLengthCsv(kShareGpt);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  const uint64_t seed = 7;
  const int64_t n = 3000;
  for (const char* kind : {"poisson", "gamma", "constant"}) {
    SCOPED_TRACE(kind);
    WorkloadSpec spec;
    const std::string k = kind;
    if (k == "poisson") spec.mutable_poisson()->set_rate_rps(12);
    if (k == "gamma") {
      spec.mutable_gamma()->set_rate_rps(12);
      spec.mutable_gamma()->set_cv(3);
    }
    if (k == "constant") spec.mutable_constant()->set_rate_rps(12);
    spec.set_num_requests(n);
    spec.mutable_lengths()->set_sampled_from(kShareGpt);
    const Shaping shaping{1.5, 20.0, 200.0, 1500};
    ApplyShaping(shaping, &spec);
    // The generator as it was: all arrivals first, then all lengths, each
    // from its own stream.
    Rng arrivals(seed, "workload.arrivals"), lengths(seed, "workload.lengths");
    std::vector<RequestSpec> all(static_cast<size_t>(n));
    double t = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (k == "poisson") t += arrivals.Exponential(1.0 / 12);
      if (k == "gamma") t += arrivals.Gamma(1.0 / 9, 9.0 / 12);
      all[i].arrival_s = k == "constant" ? static_cast<double>(i) / 12 : t;
    }
    for (RequestSpec& r : all) {
      const LengthPair& p = (*pairs)[lengths.UniformInt(pairs->size())];
      r.input_tokens = p.input_tokens;
      r.output_tokens = p.output_tokens;
    }
    int64_t outside = 0;
    const std::vector<RequestSpec> expected = Reference(all, shaping, &outside);
    Workload summary;
    EXPECT_TRUE(Same(Drain(spec, &summary), expected));
    EXPECT_EQ(summary.outside_window, outside);
    EXPECT_EQ(summary.rows_read, n);
  }
  WorkloadSpec saturated;
  saturated.mutable_saturated()->set_num_requests(50);
  saturated.mutable_saturated()->set_input_tokens(100);
  saturated.mutable_saturated()->set_output_tokens(10);
  saturated.set_max_requests(20);
  const std::vector<RequestSpec> s = Drain(saturated);
  ASSERT_EQ(s.size(), 20u);
  EXPECT_EQ(s[19].id, 19);
  EXPECT_EQ(s[19].arrival_s, 0.0);
  EXPECT_EQ(s[19].input_tokens, 100);
}

TEST(RequestStreamTest, RepeatReplaysPassesBackToBack) {
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(kAzureConv);
  spec.set_max_requests(1000);
  const std::vector<RequestSpec> once = Drain(spec);
  ASSERT_EQ(once.size(), 1000u);
  spec.set_repeat(3);
  Workload summary;
  const std::vector<RequestSpec> thrice = Drain(spec, &summary);
  ASSERT_EQ(thrice.size(), 3000u);
  const double span = once.back().arrival_s;
  const double period = span + span / 999;
  for (size_t pass = 0; pass < 3; ++pass) {
    for (size_t i = 0; i < 1000; ++i) {
      const RequestSpec& r = thrice[pass * 1000 + i];
      ASSERT_EQ(r.id, static_cast<int64_t>(pass * 1000 + i));
      ASSERT_EQ(r.arrival_s, pass == 0 ? once[i].arrival_s
                                       : once[i].arrival_s + static_cast<double>(pass) * period);
      ASSERT_EQ(r.input_tokens, once[i].input_tokens);
      ASSERT_EQ(r.output_tokens, once[i].output_tokens);
    }
  }
  // Arrivals stay in order across the seams.
  EXPECT_GT(thrice[1000].arrival_s, thrice[999].arrival_s);
  EXPECT_EQ(summary.num_requests, 3000);
  EXPECT_EQ(summary.rows_read, 3 * 19366);
  EXPECT_EQ(summary.outside_window, 3 * 18366);
  EXPECT_EQ(summary.last_arrival_s, thrice.back().arrival_s);
  EXPECT_TRUE(absl::EndsWith(summary.description,
                             absl::StrFormat("; max_requests 1000; repeat 3 (period %g s)",
                                             period)))
      << summary.description;

  // Synthetic sources replay the same random sequence.
  WorkloadSpec poisson;
  poisson.mutable_poisson()->set_rate_rps(5);
  poisson.set_num_requests(100);
  poisson.mutable_lengths()->set_sampled_from(kShareGpt);
  const std::vector<RequestSpec> p1 = Drain(poisson);
  poisson.set_repeat(2);
  const std::vector<RequestSpec> p2 = Drain(poisson);
  ASSERT_EQ(p2.size(), 200u);
  EXPECT_EQ(p2[150].output_tokens, p1[50].output_tokens);
  EXPECT_EQ(p2[150].id, 150);

  spec.set_repeat(0);
  EXPECT_EQ(OpenWorkload(spec, "", "", 1).status().message(),
            "workload.repeat = 0; expected 1..10000");
}

// An Azure file of `rows` rows one second apart, except `moves`: row i is
// given the time of row j instead.
std::string AzureFile(int rows, const std::vector<std::pair<int, int>>& moves, bool crlf,
                      bool bom) {
  std::string text = bom ? "\xEF\xBB\xBF" : "";
  const char* eol = crlf ? "\r\n" : "\n";
  absl::StrAppend(&text, "TIMESTAMP,ContextTokens,GeneratedTokens", eol);
  for (int i = 0; i < rows; ++i) {
    int at = i;
    for (const auto& [from, to] : moves) {
      if (from == i) at = to;
    }
    absl::StrAppendFormat(&text, "2023-11-16 %02d:%02d:%02d.5,%d,%d%s", 10 + at / 3600,
                          at / 60 % 60, at % 60, 100 + i, 1 + i % 7, eol);
  }
  return text;
}

TEST(RequestStreamTest, OutOfOrderRowsWithinTheWindowAreSorted) {
  // Row 4000 belongs at second 100 (3,900 rows early); row 20 at second 25.
  const std::string path =
      WriteTemp("reorder.csv", AzureFile(5000, {{4000, 100}, {20, 25}}, true, true));
  const auto file = ReadAzureTrace(path);
  ASSERT_TRUE(file.ok()) << file.status();
  int64_t outside = 0;
  const std::vector<RequestSpec> expected = Reference(FromRows(*file), {}, &outside);
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const std::vector<RequestSpec> streamed = Drain(spec);
  EXPECT_TRUE(Same(streamed, expected));
  // Ties keep file order: row 100 (second 100) before row 4000.
  EXPECT_EQ(streamed[100].input_tokens, 200);
  EXPECT_EQ(streamed[101].input_tokens, 4100);
  EXPECT_EQ(streamed[101].arrival_s, 100.0);
}

TEST(RequestStreamTest, RowsBeyondTheReorderWindowNameFileAndLine) {
  // Row 4999 (line 5001) belongs at second 10: 4,989 rows early.
  const std::string path = WriteTemp("late.csv", AzureFile(5000, {{4999, 10}}, false, false));
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const absl::Status st = ScanWorkload(spec, "", "", 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(st.message(), absl::StrCat(path, ":5001: arrives at 10 s")))
      << st.message();
  EXPECT_TRUE(absl::StrContains(st.message(), "time order to within 4096 rows")) << st.message();

  // Mooncake buckets too.
  std::string jsonl;
  for (int i = 0; i < 4200; ++i) {
    absl::StrAppend(&jsonl, "{\"timestamp\": ", i == 4199 ? 3 : i,
                    ", \"input_length\": 5, \"output_length\": 2}\n");
  }
  spec.mutable_trace()->set_path(WriteTemp("late.jsonl", jsonl));
  EXPECT_TRUE(absl::StrContains(ScanWorkload(spec, "", "", 1).status().message(),
                                "late.jsonl:4200: arrives at 0.003 s"))
      << ScanWorkload(spec, "", "", 1).status();
}

TEST(RequestStreamTest, BadRowDeepInTheFileNamesItsLine) {
  std::string text = AzureFile(3000, {}, false, false);
  // Line 2500 holds row 2498; break its token count.
  const std::string row = absl::StrCat(",", 100 + 2498, ",");
  const size_t at = text.find(row);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, row.size(), ",12x,");
  const std::string path = WriteTemp("bad_deep.csv", text);
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const absl::Status st = ScanWorkload(spec, "", "", 1).status();
  EXPECT_EQ(st.message(), absl::StrCat(path,
                                       ":2500: ContextTokens is \"12x\"; expected an "
                                       "integer in [1, 2147483647]"));
  // The stream hands out the rows before it, then the error.
  auto stream = OpenWorkload(spec, "", "", 1);
  ASSERT_TRUE(stream.ok());
  RequestSpec r;
  int good = 0;
  absl::StatusOr<bool> more = true;
  while (more.ok() && *more) {
    more = (*stream)->Next(&r);
    if (more.ok() && *more) ++good;
  }
  EXPECT_FALSE(more.ok());
  EXPECT_GE(good, 2498 - static_cast<int>(kReorderWindowRows));
  EXPECT_LE(good, 2498);
}

TEST(RequestStreamTest, LongFileAcrossChunksWithCrlfAndBom) {
  // ~200 KB: several 64 KiB chunks, lines split across their edges.
  const std::string path = WriteTemp("chunks.csv", AzureFile(6000, {}, true, true));
  const auto file = ReadAzureTrace(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->rows.size(), 6000u);
  for (size_t i = 0; i < 6000; ++i) {
    ASSERT_EQ(file->rows[i].timestamp_s, static_cast<double>(i));
    ASSERT_EQ(file->rows[i].input_tokens, static_cast<int64_t>(100 + i));
    ASSERT_EQ(file->rows[i].output_tokens, static_cast<int64_t>(1 + i % 7));
  }
}

// ----------------------------------------------------------- sketch ----

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
  EXPECT_TRUE(sketched.values().empty());
  EXPECT_EQ(s.count, 5000);
  EXPECT_EQ(s.max, want.max);
  EXPECT_NEAR(s.mean, want.mean, 1e-12 * want.mean);
  for (auto [got, exp] : {std::pair{s.p50, want.p50}, {s.p90, want.p90}, {s.p99, want.p99}}) {
    EXPECT_LE(std::fabs(got - exp), kSketchRelativeError * exp);
  }
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
  for (int64_t id = 0; id < 4; ++id) m.OnArrival({id, 0.0, 10, 1});
  EXPECT_EQ(m.live_requests(), 4);
  scheduler::RequestObserver* obs = m.ObserverFor(0);
  scheduler::RequestState s1;
  s1.spec = {1, 0.0, 10, 1};
  obs->OnToken(s1, 0.2, -1);
  obs->OnFinish(s1, 0.2);
  EXPECT_TRUE(sink.requests.empty());  // 0 is still in flight
  obs->OnReject({0, 0.0, 10, 1}, scheduler::RejectReason::kTooLong, 0.3);
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

// A long run in a child process (SimGrid allows one engine per process):
// the golden 5-minute Azure scenario replayed 12 times. The collector's
// live requests and buffered iterations stay near what one pass needs.
struct RunStats {
  int64_t requests = 0, iterations = 0, max_live = 0, max_buffered = 0, live_at_end = -1,
          buffered_at_end = -1;
};

RunStats RunInChild(int64_t repeat) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    RunStats stats;
    auto loaded = LoadScenarioFile(SERVESIM_SOURCE_DIR
                                   "/tests/testdata/golden_llama2_13b_azure_5min.pbtxt");
    if (loaded.ok() && ApplyOverride(&*loaded, absl::StrCat("workload.repeat=", repeat)).ok() &&
        Normalize(&*loaded).ok()) {
      auto sc = Resolve(*loaded);
      if (sc.ok()) {
        auto stream = OpenWorkload(sc->proto.workload(), sc->base_dir, "", sc->seed);
        if (stream.ok()) {
          auto result = RunSimulation(*sc, **stream, RunOptions{});
          if (result.ok()) {
            const MetricsCollector& m = *result->metrics;
            stats = {m.request_totals().requests, m.iteration_totals().iterations,
                     m.max_live_requests(), m.max_buffered_iterations(), m.live_requests(),
                     m.buffered_iterations()};
          }
        }
      }
    }
    const std::string line =
        absl::StrCat(stats.requests, " ", stats.iterations, " ", stats.max_live, " ",
                     stats.max_buffered, " ", stats.live_at_end, " ", stats.buffered_at_end);
    (void)!write(fds[1], line.data(), line.size());
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  RunStats s;
  const std::vector<std::string> f = absl::StrSplit(text, ' ');
  EXPECT_EQ(f.size(), 6u) << text;
  if (f.size() == 6) {
    EXPECT_TRUE(absl::SimpleAtoi(f[0], &s.requests) && absl::SimpleAtoi(f[1], &s.iterations) &&
                absl::SimpleAtoi(f[2], &s.max_live) && absl::SimpleAtoi(f[3], &s.max_buffered) &&
                absl::SimpleAtoi(f[4], &s.live_at_end) &&
                absl::SimpleAtoi(f[5], &s.buffered_at_end));
  }
  return s;
}

TEST(MetricsCollectorTest, LongRepeatedRunStaysBounded) {
  const RunStats one = RunInChild(1);
  const RunStats twelve = RunInChild(12);
  std::cout << "1 pass: " << one.requests << " requests, " << one.iterations
            << " iterations, at most " << one.max_live << " live requests and "
            << one.max_buffered << " buffered iterations; 12 passes: " << twelve.requests
            << ", " << twelve.iterations << ", " << twelve.max_live << ", "
            << twelve.max_buffered << "\n";
  ASSERT_GT(one.requests, 1000);
  EXPECT_EQ(twelve.requests, 12 * one.requests);
  EXPECT_GT(twelve.iterations, 11 * one.iterations);
  EXPECT_EQ(twelve.live_at_end, 0);
  EXPECT_EQ(twelve.buffered_at_end, 0);
  // What is held at once is set by the load, not the run's length: a few
  // dozen requests in flight, a handful of iterations of run-ahead.
  EXPECT_LE(twelve.max_live, 2 * one.max_live);
  EXPECT_LT(twelve.max_live, one.requests / 4);
  EXPECT_LE(twelve.max_buffered, 2 * one.max_buffered + 8);
  EXPECT_LT(twelve.max_buffered, 1000);
}

// --------------------------------------------------------------- CLI ----

TEST(StreamingCliTest, RepeatWithSketchedPercentiles) {
  const std::string dir = test_util::FreshDir("streaming_cli");
  const std::string sc =
      SERVESIM_SOURCE_DIR "/tests/testdata/golden_llama2_13b_azure_5min.pbtxt";
  const auto exact = RunServesim({"run", sc, "--quiet", "--out", dir + "/exact", "--set",
                                  "workload.repeat=3"});
  ASSERT_EQ(exact.code, 0) << exact.out;
  const auto sketched =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/sketch", "--set", "workload.repeat=3",
                   "--set", "output.exact_percentile_max_samples=1000"});
  ASSERT_EQ(sketched.code, 0) << sketched.out;
  const std::string je = ReadFile(dir + "/exact/summary.json");
  const std::string js = ReadFile(dir + "/sketch/summary.json");
  EXPECT_FALSE(absl::StrContains(je, "\"percentiles\""));
  EXPECT_TRUE(absl::StrContains(
      js, "\"percentiles\": {\"ttft_s\": \"sketch(rel_err=0.0001)\", \"tbt_s\": "
          "\"sketch(rel_err=0.0001)\", \"tpot_s\": \"sketch(rel_err=0.0001)\", \"e2e_s\": "
          "\"sketch(rel_err=0.0001)\"}"))
      << js;
  // Same run, same CSVs; percentiles within the sketch's error.
  EXPECT_EQ(ReadFile(dir + "/exact/requests.csv"), ReadFile(dir + "/sketch/requests.csv"));
  EXPECT_EQ(ReadFile(dir + "/exact/iterations.csv"), ReadFile(dir + "/sketch/iterations.csv"));
  for (const char* key : {"\"tbt_s\": ", "\"ttft_s\": ", "\"e2e_s\": "}) {
    for (const char* stat : {"\"p50\": ", "\"p90\": ", "\"p99\": "}) {
      auto value = [&](const std::string& json) {
        const size_t at = json.find(stat, json.find(key));
        double v = 0;
        EXPECT_TRUE(absl::SimpleAtod(
            json.substr(at + strlen(stat), json.find_first_of(",}", at) - at - strlen(stat)),
            &v));
        return v;
      };
      const double e = value(je), s = value(js);
      EXPECT_LE(std::fabs(s - e), 1.0001e-4 * e + 1e-9) << key << stat << e << " vs " << s;
    }
  }
  // requests.csv in id order, iterations.csv in (start, replica) order.
  const std::vector<std::string> req = Lines(ReadFile(dir + "/exact/requests.csv"));
  ASSERT_GT(req.size(), 3u);
  for (size_t i = 1; i < req.size(); ++i) {
    ASSERT_TRUE(absl::StartsWith(req[i], absl::StrCat(i - 1, ","))) << req[i];
  }
  const std::vector<std::string> its = Lines(ReadFile(dir + "/exact/iterations.csv"));
  ASSERT_GT(its.size(), 100u);
  double last_start = -1;
  for (size_t i = 1; i < its.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(its[i], ',');
    double start = 0;
    ASSERT_TRUE(absl::SimpleAtod(f[1], &start));
    ASSERT_GE(start, last_start) << "line " << i + 1 << ": " << its[i];
    last_start = start;
  }
}

}  // namespace
}  // namespace servesim::cluster
