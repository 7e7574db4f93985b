// Workload sources: real request traces and synthetic arrival processes.
//
// Readers (each names the file and 1-based line of any bad row):
//  - Azure LLM inference trace 2023 (CSV `TIMESTAMP,ContextTokens,
//    GeneratedTokens`, timestamps `YYYY-MM-DD HH:MM:SS.fffffff`). Arrival
//    times are seconds after the first row, computed from integer calendar
//    arithmetic plus the fractional part, so no time zone or libc enters.
//  - Mooncake JSONL (`timestamp` in ms, `input_length`, `output_length`,
//    `hash_ids`). Timestamps are whole milliseconds, so several requests can
//    share one; the n requests of a bucket are spread evenly over it, the
//    k-th (0-based) arriving at timestamp + k/n ms, keeping file order.
//  - BurstGPT CSV, columns found by header name (`Timestamp`, `Request
//    tokens`, `Response tokens`; other columns ignored). Rows with 0 response
//    tokens are failed requests: skipped and counted in `skipped_failed`.
//  - Length-only CSV (ShareGPT-style, columns `num_prefill_tokens`,
//    `num_decode_tokens` by name): a sampler of (input, output) pairs.
// Synthetic arrivals: Poisson (exponential gaps), gamma (gaps ~ Gamma with
// shape 1/cv^2, mean 1/rate), constant rate; first arrival at t=0 for
// constant, after one gap for the random ones. Saturated: N requests at t=0.
// All randomness comes from common/rng.h streams of the scenario seed.
//
// Streaming: OpenWorkload returns a RequestStream that reads the trace file
// incrementally (a 64 KiB buffer plus the longest line) or generates the
// synthetic arrivals on the fly, so a run's memory does not grow with the
// trace. Traces are read in one pass: rows may be out of time order by at
// most kReorderWindowRows rows (a bounded reorder buffer sorts them, equal
// times in file order, as the whole-file sort did); a row further out of
// order is an error naming its file and line. LoadWorkload materialises the
// same stream into a vector, for the few users that need the whole list.
#ifndef SERVESIM_CLUSTER_WORKLOAD_H_
#define SERVESIM_CLUSTER_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/request.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::cluster {

struct TraceRow {
  double timestamp_s = 0;  // as in the file, converted to seconds
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};

struct TraceFile {
  std::vector<TraceRow> rows;  // in file order
  int64_t skipped_failed = 0;  // rows the format defines as failed requests
};

absl::StatusOr<TraceFile> ReadAzureTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadBurstGptTrace(const std::string& path);

struct LengthPair {
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};
absl::StatusOr<std::vector<LengthPair>> ReadLengthCsv(const std::string& path);

// The readers above on a file's contents (already read); `name` stands for
// the file in messages. The Read* functions read the file and call these.
absl::StatusOr<TraceFile> ParseAzureTrace(absl::string_view content, const std::string& name);
absl::StatusOr<TraceFile> ParseMooncakeTrace(absl::string_view content, const std::string& name);
absl::StatusOr<TraceFile> ParseBurstGptTrace(absl::string_view content, const std::string& name);
absl::StatusOr<std::vector<LengthPair>> ParseLengthCsvContent(absl::string_view content,
                                                              const std::string& name);

// How far out of time order a trace's rows may be: a row that arrives
// earlier than a row this many rows before it is an error.
inline constexpr int64_t kReorderWindowRows = 4096;

struct Workload {
  // LoadWorkload only: every request, sorted by arrival, ids 0..n-1.
  // ScanWorkload and RequestStream::summary() leave it empty.
  std::vector<scheduler::RequestSpec> requests;
  int64_t num_requests = 0;      // requests the workload holds
  double last_arrival_s = 0;     // arrival of the last one (first is at 0)
  int64_t rows_read = 0;         // rows in the trace (or generated), all passes
  int64_t skipped_failed = 0;    // failed rows skipped (BurstGPT)
  int64_t outside_window = 0;    // dropped by the time window / request limit
  std::string description;       // e.g. "azure trace examples/traces/x.csv"
};

// A pull-based source of a workload's requests, in arrival order with ids
// 0, 1, 2, ... Memory is bounded by the reorder window, one Mooncake
// millisecond bucket and the line buffer, whatever the trace's length.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Writes the next request to `out` and returns true; false at the end.
  // Errors (a bad row, an out-of-order row, a window that kept nothing)
  // name the file, line or field, as LoadWorkload's do.
  virtual absl::StatusOr<bool> Next(scheduler::RequestSpec* out) = 0;
  // Counters and description so far; final once Next returned false.
  // `requests` stays empty.
  const Workload& summary() const { return summary_; }

 protected:
  Workload summary_;
};

// Opens the stream of the workload a resolved WorkloadSpec describes.
// Relative paths are resolved against `base_dir`; `trace_override`, when
// non-empty, replaces the trace path (servesim run --trace). Applies
// rate_scale, then the window, then max_requests, then shifts arrivals so
// the first is at 0 and numbers the ids; then, with workload.repeat = N,
// replays that sequence N times back to back (pass k shifted by k times the
// period: last arrival + mean inter-arrival gap; ids continue). The spec's
// fields are checked here, before any row is read.
absl::StatusOr<std::unique_ptr<RequestStream>> OpenWorkload(
    const servesim::v1::WorkloadSpec& spec, const std::string& base_dir,
    const std::string& trace_override, uint64_t seed);

// Replays a materialised workload (borrowed; must outlive the stream).
std::unique_ptr<RequestStream> StreamOf(const Workload& workload);

// Reads the whole stream once, keeping nothing but the counters: checks
// every row and returns the summary (num_requests, last_arrival_s,
// description) a run reports, with `requests` empty.
absl::StatusOr<Workload> ScanWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed);

// The same stream, materialised: `requests` holds every request.
absl::StatusOr<Workload> LoadWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_WORKLOAD_H_
