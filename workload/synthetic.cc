// Synthetic arrival processes and the saturated batch, as SortedSources.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "workload/sources.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

// Synthetic arrivals, generated as they are pulled: arrivals and lengths
// come from separate streams, so changing the length distribution leaves
// the arrival times unchanged.
class SyntheticSource : public SortedSource {
 public:
  enum class Kind { kPoisson, kGamma, kConstant };
  SyntheticSource(Kind kind, double rate, double shape, double scale,
                  int64_t n, std::vector<LengthPair> samples, bool fixed,
                  std::string description, uint64_t seed, double rate_scale)
      : kind_(kind),
        rate_(rate),
        shape_(shape),
        scale_(scale),
        n_(n),
        samples_(std::move(samples)),
        fixed_(fixed),
        description_(std::move(description)),
        rate_scale_(rate_scale),
        arrivals_rng_(seed, "workload.arrivals"),
        lengths_rng_(seed, "workload.lengths") {}

  absl::StatusOr<bool> Next(TraceRow& row) override {
    if (i_ >= n_) return false;
    double arrival = 0;
    switch (kind_) {
      case Kind::kPoisson:
        t_ += arrivals_rng_.Exponential(1.0 / rate_);
        arrival = t_;
        break;
      case Kind::kGamma:
        t_ += arrivals_rng_.Gamma(shape_, scale_);
        arrival = t_;
        break;
      case Kind::kConstant:
        // i/rate rather than a running sum, so arrival i is exact and does
        // not collect rounding error over a long run.
        arrival = static_cast<double>(i_) / rate_;
        break;
    }
    // Fixed lengths draw nothing, so the stream is only used for sampling.
    const LengthPair& pair =
        fixed_ ? samples_[0] : samples_[lengths_rng_.UniformInt(samples_.size())];
    if (rate_scale_ != 1.0) arrival /= rate_scale_;
    row = {arrival, pair.input_tokens, pair.output_tokens, PromptContent{}};
    ++i_;
    return true;
  }
  int64_t rows_read() const override { return i_; }
  std::string Describe() const override { return description_; }

 private:
  Kind kind_;
  double rate_, shape_, scale_;
  int64_t n_;
  std::vector<LengthPair> samples_;
  bool fixed_;
  std::string description_;
  double rate_scale_;
  Rng arrivals_rng_;
  Rng lengths_rng_;
  int64_t i_ = 0;
  double t_ = 0;
};

// AttAcc's static batch: N identical requests at t = 0.
class SaturatedSource : public SortedSource {
 public:
  explicit SaturatedSource(const servesim::v1::SaturatedSource& spec)
      : spec_(spec) {}
  absl::StatusOr<bool> Next(TraceRow& row) override {
    if (i_ >= spec_.num_requests()) return false;
    row = {0.0, spec_.input_tokens(), spec_.output_tokens(), PromptContent{}};
    ++i_;
    return true;
  }
  int64_t rows_read() const override { return i_; }
  std::string Describe() const override {
    return absl::StrCat("saturated ", spec_.num_requests(),
                        " requests at t=0, ", spec_.input_tokens(), " in / ",
                        spec_.output_tokens(), " out tokens");
  }

 private:
  servesim::v1::SaturatedSource spec_;
  int64_t i_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SortedSource>> OpenSynthetic(
    const servesim::v1::WorkloadSpec& synthetic, const std::string& base_dir,
    uint64_t seed, double rate_scale) {
  using servesim::v1::WorkloadSpec;
  const int64_t n = synthetic.num_requests();
  RETURN_IF_ERROR(
      CheckCount("workload.num_requests", n, kMaxGeneratedRequests));
  SyntheticSource::Kind kind;
  double rate = 0, shape = 0, scale = 0;
  std::string description;
  switch (synthetic.source_case()) {
    case WorkloadSpec::kPoisson: {
      kind = SyntheticSource::Kind::kPoisson;
      rate = synthetic.poisson().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.poisson.rate_rps", rate));
      description = absl::StrCat("poisson ", Num(rate), " req/s");
      break;
    }
    case WorkloadSpec::kGamma: {
      kind = SyntheticSource::Kind::kGamma;
      rate = synthetic.gamma().rate_rps();
      const double cv = synthetic.gamma().cv();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.gamma.rate_rps", rate));
      RETURN_IF_ERROR(CheckPositiveRate("workload.gamma.cv", cv));
      // Gamma(k, theta) has mean k*theta and CV 1/sqrt(k): k = 1/cv^2 and
      // theta = cv^2/rate give mean gap 1/rate with the requested CV.
      shape = 1.0 / (cv * cv);
      scale = cv * cv / rate;
      description = absl::StrCat("gamma ", Num(rate), " req/s cv ", Num(cv));
      break;
    }
    case WorkloadSpec::kConstant: {
      kind = SyntheticSource::Kind::kConstant;
      rate = synthetic.constant().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.constant.rate_rps", rate));
      description = absl::StrCat("constant ", Num(rate), " req/s");
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "workload has no arrival process; expected one of "
          "poisson, gamma, constant");
  }

  // Lengths after arrivals, so a bad rate is reported before a lengths file
  // is read.
  std::vector<LengthPair> samples;
  std::string lengths_text;
  switch (synthetic.lengths().kind_case()) {
    case servesim::v1::LengthSpec::kFixed: {
      const auto& fixed = synthetic.lengths().fixed();
      RETURN_IF_ERROR(
          CheckTokens("workload.lengths.fixed.input_tokens",
                      fixed.input_tokens()));
      RETURN_IF_ERROR(
          CheckTokens("workload.lengths.fixed.output_tokens",
                      fixed.output_tokens()));
      samples.push_back({fixed.input_tokens(), fixed.output_tokens()});
      lengths_text = absl::StrCat("lengths ", fixed.input_tokens(), " in / ",
                                  fixed.output_tokens(), " out tokens");
      break;
    }
    case servesim::v1::LengthSpec::kSampledFrom: {
      if (synthetic.lengths().sampled_from().empty()) {
        return absl::InvalidArgumentError(
            "workload.lengths.sampled_from is empty; expected the "
            "path of a CSV with num_prefill_tokens,num_decode_tokens columns");
      }
      const std::string path =
          ResolvePath(base_dir, synthetic.lengths().sampled_from());
      auto read = ReadLengthCsv(path);
      if (!read.ok()) {
        return absl::Status(read.status().code(), absl::StrCat("workload.lengths.sampled_from \"",
                                                               synthetic.lengths().sampled_from(),
                                                               "\": ", read.status().message()));
      }
      samples = std::move(*read);
      lengths_text = absl::StrCat("lengths from ", path);
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "workload.lengths is not set; expected fixed { "
          "input_tokens output_tokens } or sampled_from: \"<csv path>\"");
  }
  absl::StrAppend(&description, ", ", n, " requests, ", lengths_text);
  const bool fixed =
      synthetic.lengths().kind_case() == servesim::v1::LengthSpec::kFixed;
  return std::unique_ptr<SortedSource>(std::make_unique<SyntheticSource>(
      kind, rate, shape, scale, n, std::move(samples), fixed,
      std::move(description), seed, rate_scale));
}

absl::StatusOr<std::unique_ptr<SortedSource>> OpenSaturated(
    const servesim::v1::SaturatedSource& spec) {
  RETURN_IF_ERROR(CheckCount("workload.saturated.num_requests", spec.num_requests(),
                             kMaxGeneratedRequests));
  RETURN_IF_ERROR(CheckTokens("workload.saturated.input_tokens", spec.input_tokens()));
  RETURN_IF_ERROR(CheckTokens("workload.saturated.output_tokens", spec.output_tokens()));
  return std::unique_ptr<SortedSource>(std::make_unique<SaturatedSource>(spec));
}

}  // namespace servesim::workload
