// The streamed workload gives the requests the whole-file algorithm gave,
// keeps time order within its reorder window, and names file:line in
// errors.
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
#include "workload/workload.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/test_util.h"

namespace servesim::workload {
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
    out.push_back({0, row.timestamp_s, row.input_tokens, row.output_tokens, {}});
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

  // A scan reads one pass and multiplies: the same summary as the stream's.
  auto scanned = ScanWorkload(spec, "", "", 1);
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  EXPECT_EQ(scanned->num_requests, summary.num_requests);
  EXPECT_EQ(scanned->rows_read, summary.rows_read);
  EXPECT_EQ(scanned->outside_window, summary.outside_window);
  EXPECT_EQ(scanned->skipped_failed, summary.skipped_failed);
  EXPECT_EQ(scanned->last_arrival_s, summary.last_arrival_s);
  EXPECT_EQ(scanned->description, summary.description);

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

}  // namespace
}  // namespace servesim::workload
