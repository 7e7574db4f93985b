// libFuzzer target: one trace reader (workload/trace_formats.h) on arbitrary file
// contents. Built once per format (tests/fuzz/CMakeLists.txt defines
// SERVESIM_TRACE_FORMAT): 1 Azure CSV, 2 Mooncake JSONL, 3 BurstGPT CSV,
// 4 length CSV, 5 plain CSV, 6 token-id JSONL. Any input must give rows or an error status naming the file;
// rows that parse must hold the sizes the readers promise.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "workload/workload.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view content(reinterpret_cast<const char*>(data), size);
  const std::string name = "fuzz.trace";
#if SERVESIM_TRACE_FORMAT == 4
  auto pairs = servesim::workload::ParseLengthCsvContent(content, name);
  if (pairs.ok()) {
    for (const auto& p : *pairs) Check(p.input_tokens >= 1 && p.output_tokens >= 1);
  } else {
    Check(pairs.status().message().find(name) != absl::string_view::npos);
  }
#else
#if SERVESIM_TRACE_FORMAT == 1
  auto trace = servesim::workload::ParseAzureTrace(content, name);
#elif SERVESIM_TRACE_FORMAT == 2
  auto trace = servesim::workload::ParseMooncakeTrace(content, name);
#elif SERVESIM_TRACE_FORMAT == 3
  auto trace = servesim::workload::ParseBurstGptTrace(content, name);
#elif SERVESIM_TRACE_FORMAT == 5
  auto trace = servesim::workload::ParseCsvTrace(content, name);
#elif SERVESIM_TRACE_FORMAT == 6
  auto trace = servesim::workload::ParseTokenIdsTrace(content, name);
#else
#error "SERVESIM_TRACE_FORMAT must be 1..6"
#endif
  if (trace.ok()) {
    Check(trace->skipped_failed >= 0);
    for (const auto& r : trace->rows) {
      Check(r.input_tokens >= 0 && r.output_tokens >= 0 && std::isfinite(r.timestamp_s));
    }
  } else {
    Check(trace.status().message().find(name) != absl::string_view::npos);
  }
#endif
  return 0;
}
