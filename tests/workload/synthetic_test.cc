// Synthetic arrivals and lengths: Poisson, gamma and
// constant processes, lengths sampled from a file, saturated runs, rate
// scaling, windows and request caps, and the spec's checks (workload/synthetic.cc).
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/workload/workload_test_util.h"
#include "workload/workload.h"

namespace servesim::workload {
namespace {

using scheduler::RequestSpec;
using servesim::v1::WorkloadSpec;

WorkloadSpec Poisson(double rate, int64_t n) {
  WorkloadSpec spec;
  auto* synthetic = &spec;
  synthetic->mutable_poisson()->set_rate_rps(rate);
  synthetic->set_num_requests(n);
  synthetic->mutable_lengths()->mutable_fixed()->set_input_tokens(512);
  synthetic->mutable_lengths()->mutable_fixed()->set_output_tokens(128);
  return spec;
}

WorkloadSpec Constant(double rate, int64_t n) {
  WorkloadSpec spec = Poisson(rate, n);
  spec.mutable_constant()->set_rate_rps(rate);
  return spec;
}

bool SameRequests(const std::vector<RequestSpec>& a, const std::vector<RequestSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].arrival_s != b[i].arrival_s ||
        a[i].input_tokens != b[i].input_tokens || a[i].output_tokens != b[i].output_tokens) {
      return false;
    }
  }
  return true;
}

// Mean and coefficient of variation of the gaps between arrivals.
std::pair<double, double> GapStats(const std::vector<RequestSpec>& requests) {
  double sum = 0, sum_sq = 0;
  const double n = static_cast<double>(requests.size() - 1);
  for (size_t i = 1; i < requests.size(); ++i) {
    const double gap = requests[i].arrival_s - requests[i - 1].arrival_s;
    sum += gap;
    sum_sq += gap * gap;
  }
  const double mean = sum / n;
  const double variance = sum_sq / n - mean * mean;
  return {mean, std::sqrt(variance) / mean};
}

TEST(SyntheticTest, PoissonIsDeterministicPerSeed) {
  const WorkloadSpec spec = Poisson(8, 1000);
  const auto a = LoadWorkload(spec, "", "", 1);
  const auto b = LoadWorkload(spec, "", "", 1);
  const auto c = LoadWorkload(spec, "", "", 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status();
  EXPECT_TRUE(SameRequests(a->requests, b->requests));
  EXPECT_FALSE(SameRequests(a->requests, c->requests));
  EXPECT_EQ(a->requests.size(), 1000u);
  EXPECT_EQ(a->rows_read, 1000);
  EXPECT_EQ(a->requests[0].arrival_s, 0.0);
  EXPECT_EQ(a->requests[999].id, 999);
  EXPECT_EQ(a->requests[5].input_tokens, 512);
  EXPECT_EQ(a->requests[5].output_tokens, 128);
  EXPECT_EQ(a->description, "poisson 8 req/s, 1000 requests, lengths 512 in / 128 out tokens");
}

TEST(SyntheticTest, PoissonMeanGap) {
  const auto workload = LoadWorkload(Poisson(8, 20000), "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  const auto [mean, cv] = GapStats(workload->requests);
  EXPECT_NEAR(mean, 0.125, 0.02 * 0.125);
  EXPECT_NEAR(cv, 1.0, 0.05);
}

TEST(SyntheticTest, GammaCv) {
  WorkloadSpec spec = Poisson(8, 200000);
  spec.mutable_gamma()->set_rate_rps(8);
  spec.mutable_gamma()->set_cv(2);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  const auto [mean, cv] = GapStats(workload->requests);
  EXPECT_NEAR(mean, 0.125, 0.02 * 0.125);
  EXPECT_NEAR(cv, 2.0, 0.05 * 2.0);
  EXPECT_TRUE(absl::StartsWith(workload->description, "gamma 8 req/s cv 2, "));
}

TEST(SyntheticTest, ConstantArrivalsAreExact) {
  const auto workload = LoadWorkload(Constant(8, 100), "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->requests.size(), 100u);
  for (size_t i = 0; i < 100; ++i) {
    EXPECT_EQ(workload->requests[i].arrival_s, static_cast<double>(i) / 8);
  }
}

TEST(SyntheticTest, SampledLengthsComeFromTheFile) {
  WorkloadSpec spec = Poisson(8, 1000);
  spec.mutable_lengths()->set_sampled_from(
      "traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv");
  const auto workload = LoadWorkload(spec, SERVESIM_SOURCE_DIR "/examples", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  const auto pairs = ReadLengthCsv(kShareGpt);
  ASSERT_TRUE(pairs.ok());
  std::set<std::pair<int64_t, int64_t>> known;
  for (const LengthPair& p : *pairs) known.insert({p.input_tokens, p.output_tokens});
  std::set<std::pair<int64_t, int64_t>> drawn;
  for (const RequestSpec& r : workload->requests) {
    ASSERT_TRUE(known.count({r.input_tokens, r.output_tokens}))
        << r.input_tokens << "," << r.output_tokens;
    drawn.insert({r.input_tokens, r.output_tokens});
  }
  EXPECT_GT(drawn.size(), 900u);  // with replacement, from 30,731 rows
  EXPECT_EQ(workload->description,
            absl::StrCat("poisson 8 req/s, 1000 requests, lengths from ", SERVESIM_SOURCE_DIR,
                         "/examples/traces/"
                         "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"));
  // Lengths and arrivals are separate streams: fixed lengths, same arrivals.
  const auto fixed = LoadWorkload(Poisson(8, 1000), "", "", 1);
  ASSERT_TRUE(fixed.ok());
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(fixed->requests[i].arrival_s, workload->requests[i].arrival_s);
  }
}

TEST(SyntheticTest, Saturated) {
  WorkloadSpec spec;
  spec.mutable_saturated()->set_num_requests(64);
  spec.mutable_saturated()->set_input_tokens(2048);
  spec.mutable_saturated()->set_output_tokens(256);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->requests.size(), 64u);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(workload->requests[i].id, static_cast<int64_t>(i));
    EXPECT_EQ(workload->requests[i].arrival_s, 0.0);
    EXPECT_EQ(workload->requests[i].input_tokens, 2048);
    EXPECT_EQ(workload->requests[i].output_tokens, 256);
  }
  EXPECT_EQ(workload->description, "saturated 64 requests at t=0, 2048 in / 256 out tokens");
}

TEST(SyntheticTest, RateScaleHalvesArrivals) {
  WorkloadSpec spec = Poisson(8, 500);
  const auto base = LoadWorkload(spec, "", "", 3);
  spec.set_rate_scale(2);
  const auto scaled = LoadWorkload(spec, "", "", 3);
  ASSERT_TRUE(base.ok() && scaled.ok());
  for (size_t i = 0; i < 500; ++i) {
    ASSERT_DOUBLE_EQ(scaled->requests[i].arrival_s, base->requests[i].arrival_s / 2);
  }
  EXPECT_TRUE(absl::StrContains(scaled->description, "rate_scale 2"));
}

TEST(SyntheticTest, WindowAndMaxRequests) {
  // Arrivals 0, 0.1, ..., 9.9 s.
  WorkloadSpec spec = Constant(10, 100);
  spec.set_window_start_s(2);
  spec.set_window_end_s(5);
  auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 30u);  // 2.0 .. 4.9
  EXPECT_EQ(workload->outside_window, 70);
  EXPECT_EQ(workload->requests[0].arrival_s, 0.0);
  EXPECT_NEAR(workload->requests.back().arrival_s, 2.9, 1e-12);

  spec.set_max_requests(10);
  workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->requests.size(), 10u);
  EXPECT_EQ(workload->outside_window, 90);
  EXPECT_EQ(workload->rows_read, 100);
  EXPECT_EQ(workload->requests[9].id, 9);
  EXPECT_NEAR(workload->requests[9].arrival_s, 0.9, 1e-12);

  // rate_scale applies first: arrivals 0 .. 4.95 s, window [2, 5) keeps 60.
  spec.clear_max_requests();
  spec.set_rate_scale(2);
  workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 60u);
  EXPECT_EQ(workload->outside_window, 40);
}

TEST(SyntheticTest, MaxRequestsOnTrace) {
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(kAzureConv);
  spec.set_max_requests(100);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 100u);
  EXPECT_EQ(workload->outside_window, 19266);
  EXPECT_EQ(workload->rows_read, 19366);
}

TEST(SyntheticTest, EmptyWindowIsAnError) {
  WorkloadSpec spec = Constant(10, 100);
  spec.set_window_start_s(50);
  spec.set_window_end_s(60);
  EXPECT_TRUE(IsError(LoadWorkload(spec, "", "", 1).status(), absl::StatusCode::kInvalidArgument,
                      {"kept none of the 100 requests"}));
}

TEST(SyntheticTest, TraceOverrideReplacesSource) {
  const auto workload = LoadWorkload(Poisson(8, 10), "/elsewhere", kBurstGpt, 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 383u);
  WorkloadSpec spec;
  spec.mutable_trace()->set_path("missing.csv");
  const auto overridden = LoadWorkload(spec, "/elsewhere", kMooncake, 1);
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->requests.size(), 3993u);
}

TEST(SyntheticTest, SpecValidation) {
  const auto expect_invalid = [](const WorkloadSpec& spec, absl::string_view message) {
    EXPECT_TRUE(IsError(LoadWorkload(spec, "", "", 1).status(), absl::StatusCode::kInvalidArgument,
                        {message}))
        << spec.ShortDebugString();
  };
  expect_invalid(Poisson(0, 10), "workload.poisson.rate_rps = 0; expected > 0");
  expect_invalid(Constant(-1, 10), "workload.constant.rate_rps = -1; expected > 0");
  WorkloadSpec spec = Poisson(8, 10);
  spec.mutable_gamma()->set_rate_rps(8);
  expect_invalid(spec, "workload.gamma.cv = 0; expected > 0");
  expect_invalid(Poisson(8, 0), "workload.num_requests = 0");
  spec = Poisson(8, 10);
  spec.mutable_lengths()->mutable_fixed()->set_output_tokens(0);
  expect_invalid(spec,
                 "workload.lengths.fixed.output_tokens = 0; "
                 "expected 1..2147483647");
  spec = Poisson(8, 10);
  spec.clear_lengths();
  expect_invalid(spec, "workload.lengths is not set");
  spec = Poisson(8, 10);
  spec.clear_poisson();
  expect_invalid(spec, "workload has no source");
  spec = Poisson(8, 10);
  spec.set_rate_scale(0);
  expect_invalid(spec, "workload.rate_scale = 0; expected > 0");
  spec = Poisson(8, 10);
  spec.set_window_start_s(10);
  spec.set_window_end_s(10);
  expect_invalid(spec,
                 "workload.window_end_s = 10; expected > "
                 "workload.window_start_s (10)");
  spec = Poisson(8, 10);
  spec.set_max_requests(0);
  expect_invalid(spec, "workload.max_requests = 0; expected >= 1");
  spec.Clear();
  spec.mutable_saturated()->set_num_requests(4);
  spec.mutable_saturated()->set_input_tokens(0);
  spec.mutable_saturated()->set_output_tokens(1);
  expect_invalid(spec, "workload.saturated.input_tokens = 0; expected 1..2147483647");
  spec.mutable_saturated()->set_input_tokens(int64_t{5'000'000'000'000'000'000});
  expect_invalid(spec,
                 "workload.saturated.input_tokens = 5000000000000000000; expected 1..2147483647");
  expect_invalid(WorkloadSpec(), "workload has no source");
}

}  // namespace
}  // namespace servesim::workload
