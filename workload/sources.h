// Where a workload's rows come from, in time order, before the window and
// the other shaping of stream.cc (internal to workload/): a trace through its
// reorder buffer (trace_source.cc), or a generator (synthetic.cc).
#ifndef SERVESIM_WORKLOAD_SOURCES_H_
#define SERVESIM_WORKLOAD_SOURCES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "servesim/v1/scenario.pb.h"
#include "workload/trace_formats.h"

namespace servesim::workload {

// A typo such as num_requests: 1000000000000 should be an error rather than
// a run that never ends. Ten million requests is far beyond what a run
// simulates (workload.repeat replays more).
inline constexpr int64_t kMaxGeneratedRequests = 10'000'000;

class SortedSource {
 public:
  virtual ~SortedSource() = default;
  // `row.timestamp_s` is rate-scaled. False at the end.
  virtual absl::StatusOr<bool> Next(TraceRow& row) = 0;
  // Rows read so far, failed ones included.
  virtual int64_t rows_read() const = 0;
  virtual int64_t skipped_failed() const { return 0; }
  // For Workload::description; complete at the end.
  virtual std::string Describe() const = 0;
  // Called at the end when no row came out at all.
  virtual absl::Status CheckNotEmpty() const { return absl::OkStatus(); }
};

// A trace file; `format` UNSPECIFIED infers it from the name and header.
// `hash_block_tokens`: Mooncake's tokens per hash id.
absl::StatusOr<std::unique_ptr<SortedSource>> OpenTrace(const std::string& path,
                                                        servesim::v1::TraceFormat format,
                                                        double rate_scale,
                                                        int64_t hash_block_tokens);
// Poisson, gamma or constant arrivals of `spec` (lengths files resolved
// against `base_dir`).
absl::StatusOr<std::unique_ptr<SortedSource>> OpenSynthetic(const servesim::v1::WorkloadSpec& spec,
                                                            const std::string& base_dir,
                                                            uint64_t seed, double rate_scale);
// AttAcc's static batch: N identical requests at t = 0 (spec checked).
absl::StatusOr<std::unique_ptr<SortedSource>> OpenSaturated(
    const servesim::v1::SaturatedSource& spec);

// `path` relative to `base_dir` (an absolute `path` stays as it is).
std::string ResolvePath(const std::string& base_dir, const std::string& path);
// "%g" of a value, for messages and descriptions.
std::string Num(double value);
// INVALID_ARGUMENT naming `field` unless `rate` is finite and > 0.
absl::Status CheckPositiveRate(absl::string_view field, double rate);
// INVALID_ARGUMENT naming `field` unless 1 <= value <= max.
absl::Status CheckCount(absl::string_view field, int64_t value, int64_t max);
// INVALID_ARGUMENT naming `field` unless 1 <= value <= kMaxTokens.
absl::Status CheckTokens(absl::string_view field, int64_t value);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_SOURCES_H_
