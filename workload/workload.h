// Workload sources: real request traces and synthetic arrival processes,
// as one stream of requests in arrival order.
//
// Traces (one reader per format, workload/trace_formats.h): Azure 2023 CSV,
// Mooncake JSONL, BurstGPT CSV, plain CSV, token-id JSONL. Synthetic arrivals (synthetic.cc): Poisson
// (exponential gaps), gamma (gaps ~ Gamma with shape 1/cv^2, mean 1/rate),
// constant rate; first arrival at t=0 for constant, after one gap for the
// random ones; lengths fixed or sampled from a length CSV. Saturated: N
// requests at t=0. All randomness comes from common/rng.h streams of the
// scenario seed.
//
// Streaming (stream.cc, trace_source.cc): OpenWorkload returns a
// RequestStream that reads the trace file incrementally (a 64 KiB buffer
// plus the longest line) or generates the synthetic arrivals on the fly, so
// a run's memory does not grow with the trace. Traces are read in one pass:
// rows may be out of time order by at most kReorderWindowRows rows (a
// bounded reorder buffer sorts them, equal times in file order, as a
// whole-file stable sort would); a row further out of order is an error
// naming its file and line. LoadWorkload materialises the same stream into
// a vector, for the few users that need the whole list.
#ifndef SERVESIM_WORKLOAD_WORKLOAD_H_
#define SERVESIM_WORKLOAD_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/request.h"
#include "servesim/v1/scenario.pb.h"
#include "workload/trace_formats.h"

namespace servesim::workload {

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
// fields are checked here, before any row is read. With
// `prefix_block_tokens` > 0 (the engine's KV block size, when it caches
// prefixes) each request whose trace row says what its prompt holds gets
// the chained hashes of its full blocks (workload/prefix.h).
absl::StatusOr<std::unique_ptr<RequestStream>> OpenWorkload(
    const servesim::v1::WorkloadSpec& spec, const std::string& base_dir,
    const std::string& trace_override, uint64_t seed, int64_t prefix_block_tokens = 0);

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
                                      uint64_t seed, int64_t prefix_block_tokens = 0);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_WORKLOAD_H_
