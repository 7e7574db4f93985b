// Trace file formats, read whole (for tests, fuzzing and tools that need
// every row; a run streams them through workload/workload.h instead, with
// the same parsing code). One source file per format:
//  - azure.cc: Azure LLM inference trace 2023 (CSV `TIMESTAMP,ContextTokens,
//    GeneratedTokens`, timestamps `YYYY-MM-DD HH:MM:SS.fffffff`). Arrival
//    times are seconds after the first row, computed from integer calendar
//    arithmetic plus the fractional part, so no time zone or libc enters.
//  - mooncake.cc: Mooncake JSONL (`timestamp` in ms, `input_length`,
//    `output_length`, optionally `hash_ids`: one id per block of
//    TraceSource.hash_block_tokens prompt tokens, 512 by default; other keys
//    are skipped). Timestamps are whole milliseconds, so several requests
//    can share one; the n requests of a bucket are spread evenly over it,
//    the k-th (0-based) arriving at timestamp + k/n ms, keeping file order.
//  - burstgpt.cc: BurstGPT CSV, columns found by header name (`Timestamp`,
//    `Request tokens`, `Response tokens`; other columns ignored). Rows with
//    0 response tokens are failed requests: skipped and counted in
//    `skipped_failed`.
//  - plain_csv.cc: CSV `arrival_s,input_tokens,output_tokens` (columns by
//    name, seconds as decimals), optionally `prefix_group,prefix_tokens`:
//    the first prefix_tokens tokens of the prompt are the group's.
//  - token_ids.cc: JSONL, optionally gzip-compressed (.gz), one request per
//    line: `input_toks`, `output_toks`, `arrival_time_ns` and optionally
//    `input_tok_ids`, the prompt's token ids (LLMServingSim's workload
//    format), which prefix caching hashes per block.
//  - length_csv.cc: length-only CSV (ShareGPT-style, columns
//    `num_prefill_tokens`, `num_decode_tokens` by name): the (input, output)
//    pairs synthetic workloads sample from.
// Every error names the file and the 1-based line of the bad row, the
// column, what it holds and what is allowed.
#ifndef SERVESIM_WORKLOAD_TRACE_FORMATS_H_
#define SERVESIM_WORKLOAD_TRACE_FORMATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workload/prefix.h"

namespace servesim::workload {

struct TraceRow {
  double timestamp_s = 0;  // as in the file, converted to seconds
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  PromptContent content;  // what the row says the prompt shares (prefix.h)
};

struct TraceFile {
  std::vector<TraceRow> rows;  // in file order
  int64_t skipped_failed = 0;  // rows the format defines as failed requests
};

absl::StatusOr<TraceFile> ReadAzureTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadBurstGptTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadCsvTrace(const std::string& path);
absl::StatusOr<TraceFile> ReadTokenIdsTrace(const std::string& path);

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
absl::StatusOr<TraceFile> ParseCsvTrace(absl::string_view content, const std::string& name);
absl::StatusOr<TraceFile> ParseTokenIdsTrace(absl::string_view content, const std::string& name);
absl::StatusOr<std::vector<LengthPair>> ParseLengthCsvContent(absl::string_view content,
                                                              const std::string& name);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_TRACE_FORMATS_H_
