// The stream a run pulls its requests from: a source (trace or generator)
// shaped by the workload's window, request limit and repeat.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sim_time.h"
#include "common/status_macros.h"
#include "workload/prefix.h"
#include "workload/sources.h"
#include "workload/text_reader.h"
#include "workload/workload.h"

namespace servesim::workload {

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (base_dir.empty()) return path;
  // operator/ keeps an absolute `path` as it is.
  return (std::filesystem::path(base_dir) / path).string();
}

std::string Num(double value) { return absl::StrFormat("%g", value); }

absl::Status CheckPositiveRate(absl::string_view field, double rate) {
  if (!(std::isfinite(rate) && rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", Num(rate), "; expected > 0 (finite)"));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(absl::string_view field, int64_t value, int64_t max) {
  if (value < 1 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, "; expected 1..", max));
  }
  return absl::OkStatus();
}

absl::Status CheckTokens(absl::string_view field, int64_t value) {
  if (value < 1 || value > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, "; expected 1..", kMaxTokens));
  }
  return absl::OkStatus();
}

namespace {

using scheduler::RequestSpec;

constexpr int64_t kMaxRepeat = 10'000;

// The shaping LoadWorkload always applied (window, max_requests, shift to
// 0, ids), then workload.repeat. Each pass opens a fresh source, so the
// passes are the same sequence (same file rows, same random streams).
class WorkloadStream : public RequestStream {
 public:
  using Opener =
      std::function<absl::StatusOr<std::unique_ptr<SortedSource>>()>;
  struct Shape {
    const servesim::v1::WorkloadSpec* spec = nullptr;  // for the text, in Create
    double rate_scale = 1;
    double window_start = -std::numeric_limits<double>::infinity();
    double window_end = std::numeric_limits<double>::infinity();
    int64_t max_requests = std::numeric_limits<int64_t>::max();
    int64_t repeat = 1;
    int64_t prefix_block_tokens = 0;  // > 0: hash prompt contents per block
  };

  static absl::StatusOr<std::unique_ptr<RequestStream>> Create(Shape shape,
                                                               Opener open) {
    auto stream = std::unique_ptr<WorkloadStream>(new WorkloadStream(shape, std::move(open)));
    ASSIGN_OR_RETURN(stream->source_, stream->open_());
    // The shaping suffix, known before any row is read.
    const servesim::v1::WorkloadSpec& spec = *shape.spec;
    if (shape.rate_scale != 1.0) {
      absl::StrAppend(&stream->suffix_, "; rate_scale ", Num(shape.rate_scale));
    }
    if (spec.has_window_start_s() || spec.has_window_end_s()) {
      absl::StrAppend(&stream->suffix_, "; window [",
                      Num(spec.has_window_start_s() ? shape.window_start : 0),
                      ", ", Num(shape.window_end), ") s");
    }
    if (spec.has_max_requests()) {
      absl::StrAppend(&stream->suffix_, "; max_requests ", shape.max_requests);
    }
    stream->has_window_start_ = spec.has_window_start_s();
    stream->shape_.spec = nullptr;  // the caller's; not needed past here
    return std::unique_ptr<RequestStream>(std::move(stream));
  }

  absl::StatusOr<bool> Next(RequestSpec* out) override {
    while (true) {
      if (source_ == nullptr) {
        if (pass_ >= shape_.repeat) return false;
        ASSIGN_OR_RETURN(source_, open_());
      }
      TraceRow row;
      ASSIGN_OR_RETURN(const bool more, source_->Next(row));
      if (!more) {
        RETURN_IF_ERROR(EndPass());
        continue;
      }
      if (pass_total_ == 0) first_seen_ = row.timestamp_s;
      last_seen_ = row.timestamp_s;
      ++pass_total_;
      if (!(row.timestamp_s >= shape_.window_start &&
            row.timestamp_s < shape_.window_end) ||
          pass_kept_ >= shape_.max_requests) {
        continue;
      }
      if (pass_kept_ == 0) shift_ = row.timestamp_s;
      ++pass_kept_;
      *out = RequestSpec{};
      out->id = summary_.num_requests;
      out->arrival_s = row.timestamp_s - shift_;
      if (pass_ > 0) out->arrival_s += static_cast<double>(pass_) * period_s_;
      if (!(out->arrival_s <= kMaxSimulatedSeconds)) {
        return absl::OutOfRangeError(absl::StrFormat(
            "workload: request %d arrives at t = %g s (its time in the trace or the arrival "
            "process, after workload.rate_scale %g%s), past the simulated-time limit of %g s, "
            "beyond which "
            "time loses sub-microsecond resolution; raise the arrival rate, or end the "
            "workload sooner (workload.window_end_s, workload.max_requests)",
            summary_.num_requests, out->arrival_s, shape_.rate_scale,
            shape_.repeat > 1 ? absl::StrCat(", repeat ", shape_.repeat) : "",
            kMaxSimulatedSeconds));
      }
      out->input_tokens = row.input_tokens;
      out->output_tokens = row.output_tokens;
      if (shape_.prefix_block_tokens > 0 && row.content.kind != PromptContent::Kind::kNone) {
        out->block_hashes = std::make_shared<const std::vector<uint64_t>>(
            PromptBlockHashes(row.content, row.input_tokens, shape_.prefix_block_tokens,
                              static_cast<uint64_t>(out->id)));
      }
      ++summary_.num_requests;
      summary_.last_arrival_s = out->arrival_s;
      return true;
    }
  }

 private:
  WorkloadStream(Shape shape, Opener open)
      : shape_(shape), open_(std::move(open)) {}

  absl::Status EndPass() {
    if (pass_total_ == 0) RETURN_IF_ERROR(source_->CheckNotEmpty());
    if (pass_kept_ == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "workload.window_start_s/window_end_s [%g, %g) kept none of the %d "
          "requests (they arrive between %g and %g s, after rate_scale %g)",
          has_window_start_ ? shape_.window_start : 0.0, shape_.window_end,
          pass_total_, first_seen_, last_seen_, shape_.rate_scale));
    }
    summary_.rows_read += source_->rows_read();
    summary_.skipped_failed += source_->skipped_failed();
    summary_.outside_window += pass_total_ - pass_kept_;
    if (pass_ == 0) {
      // Pass k is pass 0 shifted by k periods: its span plus one mean gap,
      // so the seam between passes looks like any other gap.
      const double span = summary_.last_arrival_s;
      period_s_ = pass_kept_ > 1
                      ? span + span / static_cast<double>(pass_kept_ - 1)
                      : 0.0;
      summary_.description = absl::StrCat(source_->Describe(), suffix_);
      if (shape_.repeat > 1) {
        absl::StrAppend(&summary_.description, "; repeat ", shape_.repeat,
                        " (period ", Num(period_s_), " s)");
      }
    }
    source_.reset();
    ++pass_;
    pass_total_ = 0;
    pass_kept_ = 0;
    return absl::OkStatus();
  }

  Shape shape_;
  Opener open_;
  std::unique_ptr<SortedSource> source_;
  std::string suffix_;
  bool has_window_start_ = false;
  int64_t pass_ = 0;
  int64_t pass_total_ = 0;  // rows of this pass that reached the window
  int64_t pass_kept_ = 0;
  double first_seen_ = 0, last_seen_ = 0;
  double shift_ = 0;
  double period_s_ = 0;
};

// Replays a materialised workload.
class VectorStream : public RequestStream {
 public:
  explicit VectorStream(const Workload& workload) : workload_(workload) {
    summary_.num_requests = static_cast<int64_t>(workload.requests.size());
    summary_.last_arrival_s =
        workload.requests.empty() ? 0 : workload.requests.back().arrival_s;
    summary_.rows_read = workload.rows_read;
    summary_.skipped_failed = workload.skipped_failed;
    summary_.outside_window = workload.outside_window;
    summary_.description = workload.description;
  }
  absl::StatusOr<bool> Next(RequestSpec* out) override {
    if (next_ >= workload_.requests.size()) return false;
    *out = workload_.requests[next_++];
    return true;
  }

 private:
  const Workload& workload_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RequestStream>> OpenWorkload(
    const servesim::v1::WorkloadSpec& spec, const std::string& base_dir,
    const std::string& trace_override, uint64_t seed, int64_t prefix_block_tokens) {
  // The shaping knobs are checked first, so a bad one is reported before a
  // trace is read.
  WorkloadStream::Shape shape;
  shape.spec = &spec;
  shape.prefix_block_tokens = prefix_block_tokens;
  if (spec.has_rate_scale()) {
    shape.rate_scale = spec.rate_scale();
    RETURN_IF_ERROR(CheckPositiveRate("workload.rate_scale", shape.rate_scale));
  }
  // An unset start keeps every arrival, including the negative times of an
  // Azure file whose later rows precede its first; an explicit 0 drops them.
  if (spec.has_window_start_s()) {
    shape.window_start = spec.window_start_s();
    if (!std::isfinite(shape.window_start)) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.window_start_s = ", Num(shape.window_start),
                       "; expected a finite number of seconds"));
    }
  }
  if (spec.has_window_end_s()) {
    shape.window_end = spec.window_end_s();
    const double start = spec.has_window_start_s() ? shape.window_start : 0.0;
    if (!(shape.window_end > start)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.window_end_s = ", Num(shape.window_end),
          "; expected > workload.window_start_s (", Num(start), ")"));
    }
  }
  if (spec.has_max_requests()) {
    shape.max_requests = spec.max_requests();
    if (shape.max_requests < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.max_requests = ", shape.max_requests, "; expected >= 1"));
    }
  }
  if (spec.has_repeat()) {
    shape.repeat = spec.repeat();
    RETURN_IF_ERROR(CheckCount("workload.repeat", shape.repeat, kMaxRepeat));
  }
  if (spec.max_in_flight() != 0) {
    RETURN_IF_ERROR(CheckCount("workload.max_in_flight", spec.max_in_flight(), 10'000'000));
    if (spec.has_saturated()) {
      return absl::InvalidArgumentError(
          "workload.max_in_flight is set with the saturated source, which sends its whole "
          "batch at once; set one or the other");
    }
  }

  const double rate_scale = shape.rate_scale;
  if (spec.has_trace() || !trace_override.empty()) {
    std::string path;
    servesim::v1::TraceFormat format = servesim::v1::TRACE_FORMAT_UNSPECIFIED;
    if (spec.has_trace()) format = spec.trace().format();
    if (!trace_override.empty()) {
      // A command-line path: relative to the working folder, as the user
      // typed it, not to the scenario file.
      path = trace_override;
    } else {
      if (spec.trace().path().empty()) {
        return absl::InvalidArgumentError(
            "workload.trace.path is empty; expected the path of a trace file");
      }
      path = ResolvePath(base_dir, spec.trace().path());
    }
    const int64_t hash_block_tokens =
        spec.has_trace() && spec.trace().has_hash_block_tokens() ? spec.trace().hash_block_tokens()
                                                                 : 512;
    RETURN_IF_ERROR(CheckCount("workload.trace.hash_block_tokens", hash_block_tokens, 1 << 20));
    return WorkloadStream::Create(shape, [path, format, rate_scale, hash_block_tokens] {
      return OpenTrace(path, format, rate_scale, hash_block_tokens);
    });
  }
  if (spec.has_poisson() || spec.has_gamma() || spec.has_constant()) {
    return WorkloadStream::Create(shape, [spec, base_dir, seed, rate_scale] {
      return OpenSynthetic(spec, base_dir, seed, rate_scale);
    });
  }
  if (spec.has_saturated()) {
    const servesim::v1::SaturatedSource saturated = spec.saturated();
    // Checked now, before any row is asked for.
    RETURN_IF_ERROR(OpenSaturated(saturated).status());
    return WorkloadStream::Create(shape, [saturated] { return OpenSaturated(saturated); });
  }
  return absl::InvalidArgumentError(
      "workload has no source; expected one of trace, poisson, gamma, "
      "constant, saturated");
}

std::unique_ptr<RequestStream> StreamOf(const Workload& workload) {
  return std::make_unique<VectorStream>(workload);
}

absl::StatusOr<Workload> ScanWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed) {
  // Every pass of workload.repeat is the same sequence shifted by one
  // period, so one pass is read and the rest follow by arithmetic: a long
  // trace repeated 10,000 times is read once, and a repeat that would pass
  // the simulated-time limit is refused after that one pass.
  ASSIGN_OR_RETURN(std::unique_ptr<RequestStream> stream,
                   OpenWorkload(spec, base_dir, trace_override, seed, 0));
  const int64_t repeat = spec.has_repeat() ? spec.repeat() : 1;
  if (repeat > 1) {
    servesim::v1::WorkloadSpec one = spec;
    one.clear_repeat();
    ASSIGN_OR_RETURN(stream, OpenWorkload(one, base_dir, trace_override, seed, 0));
  }
  RequestSpec request;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, stream->Next(&request));
    if (!more) break;
  }
  Workload w = stream->summary();
  if (repeat == 1) return w;
  // As WorkloadStream counts them: the span plus one mean gap.
  const double span = w.last_arrival_s;
  const double period =
      w.num_requests > 1 ? span + span / static_cast<double>(w.num_requests - 1) : 0.0;
  const double last = span + static_cast<double>(repeat - 1) * period;
  if (!(last <= kMaxSimulatedSeconds)) {
    // One pass fitted (it was read), so the period is positive here; the
    // passes 0 .. fit - 1 end within the limit.
    const int64_t fit = static_cast<int64_t>(std::floor((kMaxSimulatedSeconds - span) / period)) + 1;
    return absl::OutOfRangeError(absl::StrFormat(
        "workload: with workload.repeat %d (period %g s, %d requests a pass) the last request "
        "arrives at t = %g s, past the simulated-time limit of %g s, beyond which time loses "
        "sub-microsecond resolution; lower workload.repeat to at most %d, or end the workload "
        "sooner (workload.window_end_s, workload.max_requests)",
        repeat, period, w.num_requests, last, kMaxSimulatedSeconds, std::max<int64_t>(1, fit)));
  }
  w.num_requests *= repeat;
  w.rows_read *= repeat;
  w.skipped_failed *= repeat;
  w.outside_window *= repeat;
  w.last_arrival_s = last;
  absl::StrAppend(&w.description, "; repeat ", repeat, " (period ", Num(period), " s)");
  return w;
}

absl::StatusOr<Workload> LoadWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed, int64_t prefix_block_tokens) {
  ASSIGN_OR_RETURN(std::unique_ptr<RequestStream> stream,
                   OpenWorkload(spec, base_dir, trace_override, seed, prefix_block_tokens));
  std::vector<RequestSpec> requests;
  RequestSpec request;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, stream->Next(&request));
    if (!more) break;
    requests.push_back(request);
  }
  Workload workload = stream->summary();
  workload.requests = std::move(requests);
  return workload;
}

}  // namespace servesim::workload
