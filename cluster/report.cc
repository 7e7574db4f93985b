#include "cluster/report.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/report_html.h"
#include "devices/prune_common.h"
#include "cluster/timeline.h"

namespace servesim::cluster {
namespace {

// Shortest round-trip form is not needed; 9 significant digits keep every
// figure meaningful and the text stable.
std::string Num(double v) { return absl::StrFormat("%.9g", v); }


std::string Dist(const Distribution& d) {
  return absl::StrCat("{\"count\": ", d.count, ", \"mean\": ", Num(d.mean),
                      ", \"p50\": ", Num(d.p50), ", \"p90\": ", Num(d.p90),
                      ", \"p99\": ", Num(d.p99), ", \"max\": ", Num(d.max), "}");
}

const char* StatusName(RequestStatus s) {
  switch (s) {
    case RequestStatus::kDone: return "done";
    case RequestStatus::kRejectedTooLong: return "rejected_too_long";
    case RequestStatus::kRejectedKv: return "rejected_kv_capacity";
    case RequestStatus::kPending: return "pending";
  }
  return "unknown";
}

absl::Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    return absl::UnavailableError(absl::StrCat(
        path.string(), ": cannot write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string Ms(double s) { return absl::StrFormat("%10.2f", s * 1e3); }

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
  sep('\n');
  out->append(buf, p);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CsvRecordWriter>> CsvRecordWriter::Open(
    const std::string& dir, const ResolvedScenario& sc) {
  const auto& o = sc.proto.output();
  if (!o.requests_csv() && !o.iterations_csv()) return nullptr;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot create output folder: ", ec.message()));
  }
  auto w = std::unique_ptr<CsvRecordWriter>(new CsvRecordWriter());
  auto open = [&](File& f, const char* name, const char* header) -> absl::Status {
    f.path = (std::filesystem::path(dir) / name).string();
    f.file = std::fopen(f.path.c_str(), "wb");
    if (f.file == nullptr) {
      return absl::UnavailableError(
          absl::StrCat(f.path, ": cannot write: ", std::strerror(errno)));
    }
    f.buffer = header;
    return absl::OkStatus();
  };
  if (o.requests_csv()) {
    if (absl::Status st = open(w->requests_, "requests.csv",
                               "id,arrival_s,first_token_s,finish_s,input_tokens,output_tokens,"
                               "ttft_s,tpot_s,e2e_s,replica,preemptions,status\n");
        !st.ok()) {
      return st;
    }
  }
  if (o.iterations_csv()) {
    if (absl::Status st = open(w->iterations_, "iterations.csv",
                               "replica,start_s,duration_s,batch_size,prefill_tokens,"
                               "decode_tokens,kv_blocks_used,energy_j,batch_bound,batch_cap\n");
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
        absl::StrCat(f.path, ": cannot write: ", std::strerror(errno)));
  }
  f.buffer.clear();
}

void CsvRecordWriter::OnRequest(const RequestRecord& r) {
  if (requests_.file == nullptr) return;
  Append(requests_, RequestRow(r));
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
          absl::StrCat(f->path, ": cannot write: ", std::strerror(errno)));
    }
    f->file = nullptr;
  }
  return status_;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string SummaryJson(const ResolvedScenario& sc, const Workload& wl,
                        const Summary& s, double simulated_s, bool partial) {
  const auto& p = sc.proto;
  std::string j = partial ? "{\n  \"partial\": true,\n" : "{\n";
  auto kv = [&](const std::string& k, const std::string& v, bool last = false) {
    absl::StrAppend(&j, "  ", JsonString(k), ": ", v, last ? "\n" : ",\n");
  };
  kv("scenario", JsonString(p.name()));
  kv("model", JsonString(sc.model.name));
  kv("xpu", JsonString(p.cluster().xpu().preset()));
  kv("replicas", absl::StrCat(sc.replicas));
  kv("tensor_parallel", absl::StrCat(sc.tensor_parallel));
  if (sc.has_attention_device) {
    kv("attention_device", JsonString(sc.attention_label));
    kv("overlap_policy", JsonString(scheduler::OverlapPolicyName(sc.planner.overlap)));
  }
  if (sc.tbt_slo_s > 0) kv("slo_tbt_s", Num(sc.tbt_slo_s));
  kv("seed", absl::StrCat(sc.seed));
  kv("workload", JsonString(wl.description));
  kv("kv_capacity_blocks_per_replica", absl::StrCat(sc.kv.blocks));
  kv("kv_capacity_tokens_per_replica", absl::StrCat(sc.kv.tokens));
  kv("requests", absl::StrCat(s.requests));
  kv("requests_completed", absl::StrCat(s.completed));
  kv("requests_rejected", absl::StrCat(s.rejected));
  kv("requests_rejected_too_long", absl::StrCat(s.rejected_too_long));
  kv("requests_rejected_kv_capacity", absl::StrCat(s.rejected_kv_capacity));
  kv("trace_rows_skipped_failed", absl::StrCat(wl.skipped_failed));
  kv("trace_rows_outside_window", absl::StrCat(wl.outside_window));
  kv("preemptions", absl::StrCat(s.preemptions));
  kv("iterations", absl::StrCat(s.iterations));
  kv("input_tokens", absl::StrCat(s.input_tokens));
  kv("output_tokens", absl::StrCat(s.output_tokens));
  kv("makespan_s", Num(s.makespan_s));
  kv("simulated_time_s", Num(simulated_s));
  kv("throughput_tokens_per_s", Num(s.throughput_tokens_per_s));
  kv("throughput_requests_per_s", Num(s.throughput_requests_per_s));
  kv("ttft_s", Dist(s.ttft_s));
  kv("tbt_s", Dist(s.tbt_s));
  kv("tpot_s", Dist(s.tpot_s));
  kv("e2e_s", Dist(s.e2e_s));
  // Only when a sketch answered (runs whose percentiles are all exact keep
  // the file they always had, as complete runs have no "partial" key).
  if (!s.ttft_s.exact || !s.tbt_s.exact || !s.tpot_s.exact || !s.e2e_s.exact) {
    auto method = [](const Distribution& d) {
      return d.exact ? std::string("\"exact\"")
                     : absl::StrFormat("\"sketch(rel_err=%g)\"", kSketchRelativeError);
    };
    kv("percentiles", absl::StrCat("{\"ttft_s\": ", method(s.ttft_s), ", \"tbt_s\": ",
                                   method(s.tbt_s), ", \"tpot_s\": ", method(s.tpot_s),
                                   ", \"e2e_s\": ", method(s.e2e_s), "}"));
  }
  kv("slo_ttft_s", Num(s.slo_ttft_s));
  kv("slo_tpot_s", Num(s.slo_tpot_s));
  kv("slo_met_requests", absl::StrCat(s.slo_met));
  kv("slo_attainment", Num(s.slo_attainment));
  kv("goodput_requests_per_s", Num(s.goodput_requests_per_s));
  kv("batch_size_mean", Num(s.batch_size_mean));
  kv("batch_size_max", absl::StrCat(s.batch_size_max));
  kv("kv_utilization_mean", Num(s.kv_utilization_mean));
  kv("kv_utilization_max", Num(s.kv_utilization_max));
  {
    std::string b = "{";
    for (int i = 0; i < 5; ++i) {
      absl::StrAppend(&b, i ? ", " : "", "\"",
                      scheduler::BatchBoundName(static_cast<scheduler::BatchBound>(i)),
                      "\": ", s.bound_iterations[i]);
    }
    kv("batch_bound_iterations", b + "}");
  }
  kv("energy_j", Num(s.energy_j));
  if (sc.has_attention_device) {
    if (sc.attention_device.has_topick() || sc.attention_device.has_spatten() ||
        sc.attention_device.has_cta() || sc.attention_device.has_lad()) {
      const v1::DeviceSpec& d = sc.attention_device;
      kv("attention_device_fidelity",
         JsonString(devices::FidelityName(d.has_topick()    ? d.topick().fidelity()
                                          : d.has_spatten() ? d.spatten().fidelity()
                                          : d.has_cta()     ? d.cta().fidelity()
                                                            : d.lad().fidelity())));
    }
    kv("attention_device_busy_s", Num(s.device_busy_s));
    kv("attention_device_dram_bytes", Num(s.device_dram_bytes));
    std::string d = "{";
    for (size_t i = 0; i < s.device_parameters.size(); ++i) {
      absl::StrAppend(&d, i ? ", " : "", JsonString(s.device_parameters[i].first), ": ",
                      Num(s.device_parameters[i].second));
    }
    kv("attention_device_parameters", d + "}");
  }
  kv("energy_per_token_j", Num(s.energy_per_token_j), true);
  j += "}\n";
  return j;
}

std::string FormatSummaryTable(const ResolvedScenario& sc, const Workload& wl,
                               const Summary& s, const RunInfo& info) {
  std::string t;
  absl::StrAppendFormat(&t, "servesim: %s\n", sc.proto.name());
  absl::StrAppendFormat(&t, "  model      %s (%s)\n", sc.model.name,
                        sc.model.bytes_per_element == 1 ? "int8" : "fp16");
  absl::StrAppendFormat(&t, "  cluster    %d replica(s) x %d %s (TP=%d), KV %d tokens/replica\n",
                        sc.replicas, sc.tensor_parallel,
                        sc.proto.cluster().xpu().preset(), sc.tensor_parallel,
                        sc.kv.tokens);
  absl::StrAppendFormat(&t, "  workload   %s\n\n", wl.description);
  absl::StrAppendFormat(&t, "  requests   %d arrived, %d done, %d rejected (%d too long, %d over KV capacity), %d preemptions\n",
                        s.requests, s.completed, s.rejected, s.rejected_too_long,
                        s.rejected_kv_capacity, s.preemptions);
  absl::StrAppendFormat(&t, "  throughput %.1f tokens/s, %.3f requests/s over %.1f s\n",
                        s.throughput_tokens_per_s, s.throughput_requests_per_s,
                        s.makespan_s);
  absl::StrAppendFormat(&t, "\n  latency (ms)     p50        p90        p99       mean\n");
  auto row = [&](const char* name, const Distribution& d) {
    absl::StrAppendFormat(&t, "  %-6s   %s %s %s %s\n", name, Ms(d.p50), Ms(d.p90),
                          Ms(d.p99), Ms(d.mean));
  };
  row("TTFT", s.ttft_s);
  row("TBT", s.tbt_s);
  row("TPOT", s.tpot_s);
  row("E2E", s.e2e_s);
  absl::StrAppendFormat(&t, "\n  SLO        TTFT <= %.3g s and TPOT <= %.3g s: %.2f%% attained, goodput %.3f requests/s\n",
                        s.slo_ttft_s, s.slo_tpot_s, 100 * s.slo_attainment,
                        s.goodput_requests_per_s);
  absl::StrAppendFormat(&t, "  batch      mean %.2f, max %d over %d iterations\n",
                        s.batch_size_mean, s.batch_size_max, s.iterations);
  absl::StrAppendFormat(&t, "  KV cache   mean %.1f%%, max %.1f%% used\n",
                        100 * s.kv_utilization_mean, 100 * s.kv_utilization_max);
  absl::StrAppendFormat(&t, "  energy     %.1f kJ, %.3f J per output token\n",
                        s.energy_j / 1e3, s.energy_per_token_j);
  absl::StrAppendFormat(&t, "  time       %.1f s simulated in %.2f s wall (%.0fx real time)\n",
                        info.simulated_s, info.wall_s,
                        info.wall_s > 0 ? info.simulated_s / info.wall_s : 0.0);
  return t;
}

absl::Status WriteOutputs(const std::string& dir, const ResolvedScenario& sc,
                          const Workload& wl, const MetricsCollector& metrics,
                          const Summary& s, const RunInfo& info) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot create output folder: ", ec.message()));
  }
  const fs::path base(dir);
  if (absl::Status st = WriteFile(base / "summary.json",
                                  SummaryJson(sc, wl, s, info.simulated_s, info.partial));
      !st.ok()) {
    return st;
  }
  if (absl::Status st = WriteFile(
          base / "run_info.json",
          absl::StrCat("{\n  \"wall_time_s\": ", Num(info.wall_s),
                       ",\n  \"realtime_factor\": ",
                       Num(info.wall_s > 0 ? info.simulated_s / info.wall_s : 0),
                       info.partial ? absl::StrCat(",\n  \"partial\": true,\n  \"error\": ",
                                                   JsonString(info.error))
                                    : "",
                       info.agents_json.empty() ? "" : ",\n  \"agents\": " + info.agents_json,
                       "\n}\n"));
      !st.ok()) {
    return st;
  }
  if (sc.proto.output().timeline()) {
    if (absl::Status st = WriteFile(base / "timeline.json", TimelineJson(sc, metrics));
        !st.ok()) {
      return st;
    }
  }
  if (sc.proto.output().report_html()) {
    if (absl::Status st =
            WriteFile(base / "report.html", ReportHtml(sc, metrics, s, info.simulated_s));
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace servesim::cluster
