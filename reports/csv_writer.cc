#include "reports/csv_writer.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace servesim::reports {
namespace {

using metrics::IterationRecord;
using metrics::RequestRecord;
using metrics::RequestStatus;
using scenario::ResolvedScenario;

const char* StatusName(RequestStatus s) {
  switch (s) {
    case RequestStatus::kDone: return "done";
    case RequestStatus::kRejectedTooLong: return "rejected_too_long";
    case RequestStatus::kRejectedKv: return "rejected_kv_capacity";
    case RequestStatus::kRejectedLate:
      return "rejected_late";
    case RequestStatus::kPending: return "pending";
  }
  return "unknown";
}

std::string RequestRow(const RequestRecord& r) {
  if (r.status == RequestStatus::kDone) {
    const double tpot =
        r.output_tokens > 1 ? (r.finish_s - r.first_token_s) / double(r.output_tokens - 1)
                            : 0.0;
    return absl::StrFormat("%d,%.6f,%.6f,%.6f,%d,%d,%.6f,%.6f,%.6f,%d,%d,%s\n", r.id,
                           r.arrival_s, r.first_token_s, r.finish_s, r.input_tokens,
                           r.output_tokens, r.first_token_s - r.arrival_s, tpot,
                           r.finish_s - r.arrival_s, r.replica, r.preemptions,
                           StatusName(r.status));
  }
  return absl::StrFormat("%d,%.6f,,,%d,%d,,,,%d,%d,%s\n", r.id, r.arrival_s,
                         r.input_tokens, r.output_tokens, r.replica, r.preemptions,
                         StatusName(r.status));
}

// One iteration's row, appended to `out`: what
// StrFormat("%d,%.9f,%.9f,%d,%d,%d,%d,%.6g,%s,%d\n", ...) gives, written
// with std::to_chars (specified as printf's conversions, without parsing a
// format string): a row per iteration, half a million an hour.
void AppendIterationRow(const IterationRecord& it, std::string* out) {
  char buf[512];
  char* p = buf;
  char* const end = buf + sizeof(buf);
  auto sep = [&](char c) {
    if (p != end) *p++ = c;  // (a row needs under 200 bytes)
  };
  auto int_ = [&](int64_t v) { p = std::to_chars(p, end, v).ptr; };
  auto fixed = [&](double v, int digits) {
    p = std::to_chars(p, end, v, std::chars_format::fixed, digits).ptr;
  };
  int_(it.replica);
  sep(',');
  fixed(it.start_s, 9);
  sep(',');
  fixed(it.duration_s, 9);
  sep(',');
  int_(it.batch_size);
  sep(',');
  int_(it.prefill_tokens);
  sep(',');
  int_(it.decode_tokens);
  sep(',');
  int_(it.kv_blocks_used);
  sep(',');
  p = std::to_chars(p, end, it.energy_j, std::chars_format::general, 6).ptr;
  sep(',');
  out->append(buf, p);
  out->append(scheduler::BatchBoundName(it.bound));
  p = buf;
  sep(',');
  int_(it.batch_cap);
  sep(',');
  int_(it.waiting);
  sep('\n');
  out->append(buf, p);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CsvRecordWriter>> CsvRecordWriter::Open(const OutputDir& dir,
                                                                       const ResolvedScenario& sc) {
  const auto& o = sc.proto.output();
  if (!o.requests_csv() && !o.iterations_csv()) return nullptr;
  auto w = std::unique_ptr<CsvRecordWriter>(new CsvRecordWriter(dir));
  auto open = [&](File& f, const char* name, const char* header) -> absl::Status {
    f.name = name;
    f.path = dir.TempPath(name);
    f.file = std::fopen(f.path.c_str(), "wb");
    if (f.file == nullptr) {
      return absl::UnavailableError(
          absl::StrCat(dir.Path(name), ": cannot write: ", std::strerror(errno)));
    }
    f.buffer = header;
    return absl::OkStatus();
  };
  if (o.requests_csv()) {
    w->disaggregated_ = sc.disaggregated();
    if (absl::Status st =
            open(w->requests_, "requests.csv",
                 w->disaggregated_ ? "id,arrival_s,first_token_s,finish_s,input_tokens,"
                                     "output_tokens,ttft_s,tpot_s,e2e_s,replica,preemptions,"
                                     "status,prefill_replica,prefill_end_s,kv_ready_s\n"
                                   : "id,arrival_s,first_token_s,finish_s,input_tokens,"
                                     "output_tokens,ttft_s,tpot_s,e2e_s,replica,preemptions,"
                                     "status\n");
        !st.ok()) {
      return st;
    }
  }
  if (o.iterations_csv()) {
    if (absl::Status st = open(w->iterations_, "iterations.csv",
                               "replica,start_s,duration_s,batch_size,prefill_tokens,"
                               "decode_tokens,kv_blocks_used,energy_j,batch_bound,batch_cap,waiting\n");
        !st.ok()) {
      return st;
    }
  }
  return w;
}

CsvRecordWriter::~CsvRecordWriter() { Close().IgnoreError(); }

void CsvRecordWriter::Append(File& f, const std::string& row) {
  if (f.file == nullptr) return;
  f.buffer += row;
  if (f.buffer.size() >= (size_t{1} << 20)) Flush(f);
}

void CsvRecordWriter::Flush(File& f) {
  if (f.file == nullptr || f.buffer.empty()) return;
  if (std::fwrite(f.buffer.data(), 1, f.buffer.size(), f.file) != f.buffer.size() &&
      status_.ok()) {
    status_ = absl::UnavailableError(
        absl::StrCat(dir_.Path(f.name), ": cannot write: ", std::strerror(errno)));
  }
  f.buffer.clear();
}

void CsvRecordWriter::OnRequest(const RequestRecord& r) {
  if (requests_.file == nullptr) return;
  std::string row = RequestRow(r);
  if (disaggregated_) {
    // The hand-off's columns (empty for a request the prefill pool never
    // handed off, or whose KV never arrived).
    row.pop_back();
    absl::StrAppend(&row, ",", r.prefill_replica >= 0 ? absl::StrCat(r.prefill_replica) : "", ",",
                    r.prefill_end_s >= 0 ? absl::StrFormat("%.6f", r.prefill_end_s) : "", ",",
                    r.kv_ready_s >= 0 ? absl::StrFormat("%.6f", r.kv_ready_s) : "", "\n");
  }
  Append(requests_, row);
}

void CsvRecordWriter::OnIteration(const IterationRecord& it) {
  if (iterations_.file == nullptr) return;
  AppendIterationRow(it, &iterations_.buffer);
  if (iterations_.buffer.size() >= (size_t{1} << 20)) Flush(iterations_);
}

absl::Status CsvRecordWriter::Close() {
  for (File* f : {&requests_, &iterations_}) {
    if (f->file == nullptr) continue;
    Flush(*f);
    if (std::fclose(f->file) != 0 && status_.ok()) {
      status_ = absl::UnavailableError(
          absl::StrCat(dir_.Path(f->name), ": cannot write: ", std::strerror(errno)));
    }
    f->file = nullptr;
    if (status_.ok()) status_ = dir_.Commit(f->name);
  }
  return status_;
}

}  // namespace servesim::reports
