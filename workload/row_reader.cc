#include "workload/row_reader.h"

#include "common/status_macros.h"

namespace servesim::workload {

absl::StatusOr<TraceFile> DrainRows(RowReader& rows) {
  TraceFile trace;
  RawRow raw;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, rows.Next(raw));
    if (!more) break;
    trace.rows.push_back({raw.timestamp_s, raw.input_tokens, raw.output_tokens, raw.content});
  }
  trace.skipped_failed = rows.skipped_failed();
  return trace;
}

}  // namespace servesim::workload
