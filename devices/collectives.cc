#include "devices/collectives.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace servesim::devices {
namespace {

using servesim::v1::CollectiveCurve;

std::atomic<int64_t> g_measured{0}, g_below{0}, g_above{0}, g_other{0};

constexpr absl::string_view kNames[kNumCollectiveOps] = {"all_reduce", "all_gather",
                                                         "reduce_scatter", "alltoall", "sendrecv"};

std::vector<absl::string_view> Tokens(absl::string_view line) {
  return absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

// The collective a file name or a "Collective test starting" line names.
bool CollectiveIn(absl::string_view text, CollectiveOp* op) {
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    if (absl::StrContains(text, kNames[i])) {
      *op = static_cast<CollectiveOp>(i);
      return true;
    }
  }
  return false;
}

// ".g<N>." in a file name.
int GpusInName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  absl::string_view name = slash == absl::string_view::npos ? path : path.substr(slash + 1);
  for (size_t at = name.find(".g"); at != absl::string_view::npos; at = name.find(".g", at + 1)) {
    size_t end = at + 2;
    while (end < name.size() && absl::ascii_isdigit(name[end])) ++end;
    int n = 0;
    if (end > at + 2 && end < name.size() && name[end] == '.' &&
        absl::SimpleAtoi(name.substr(at + 2, end - at - 2), &n) && n > 0) {
      return n;
    }
  }
  return 0;
}

// A size label of a reduced table ("1K", "65K", "1G", "8"): the power of
// two nearest to its value (nccl-tests sweeps powers of two with -f 2; the
// published labels round them: 65536 as "65K", 131072 as "132K").
bool SizeLabel(absl::string_view label, double* bytes) {
  double scale = 1;
  if (!label.empty()) {
    switch (absl::ascii_toupper(label.back())) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'G':
        scale = 1e9;
        break;
      default:
        break;
    }
    if (scale != 1) label.remove_suffix(1);
  }
  double v = 0;
  if (!absl::SimpleAtod(label, &v) || !(v > 0) || !std::isfinite(v)) return false;
  *bytes = std::exp2(std::round(std::log2(v * scale)));
  return true;
}

// The reduced form some vendors publish: a markdown table of message size
// and bus bandwidth (GB/s), one row per size; each time follows from
// nccl-tests' definition busbw = size / time x the ring's traffic factor
// (nccl-tests doc/PERFORMANCE.md).
absl::Status ParseReduced(absl::string_view text, absl::string_view path, CollectiveCurve* curve,
                          int* first_row) {
  int line_no = 0;
  bool header = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] != '|') continue;
    std::vector<absl::string_view> cells = absl::StrSplit(line, '|');
    // "| a | b |" splits into "", " a ", " b ", "".
    std::vector<absl::string_view> c;
    for (absl::string_view cell : cells) {
      cell = absl::StripAsciiWhitespace(cell);
      if (!cell.empty()) c.push_back(cell);
    }
    if (!header) {
      if (c.size() < 2 || !absl::StrContains(c[0], "Size") || !absl::StrContains(c[1], "GB/s")) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no,
                         ": a reduced table's header names the message size and the bus "
                         "bandwidth in GB/s (\"| Message Size (Bytes) | ... (GB/s) |\")"));
      }
      header = true;
      continue;
    }
    if (absl::StartsWith(c.empty() ? "" : c[0], "-")) continue;  // the rule under the header
    double bytes = 0, busbw = 0;
    if (c.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": column busbw missing"));
    }
    if (!SizeLabel(c[0], &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": column size: \"", c[0],
                                                     "\" does not parse (a number, K, M or G)"));
    }
    if (!absl::SimpleAtod(c[1], &busbw) || !(busbw > 0) || !std::isfinite(busbw)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": column busbw: \"", c[1],
                                                     "\" is not a positive bandwidth"));
    }
    if (curve->bytes_size() > 0 && bytes <= curve->bytes(curve->bytes_size() - 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": column size: ", c[0], " does not increase"));
    }
    if (*first_row == 0) *first_row = line_no;
    curve->add_bytes(bytes);
    curve->add_time_s(busbw);  // a bandwidth until the GPU count is known
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view CollectiveName(CollectiveOp op) { return kNames[static_cast<int>(op)]; }

bool ParseCollectiveName(absl::string_view name, CollectiveOp* op) {
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    if (name == kNames[i]) {
      *op = static_cast<CollectiveOp>(i);
      return true;
    }
  }
  return false;
}

double RingTrafficFactor(CollectiveOp op, int gpus) {
  const double n = std::max(1, gpus);
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2 * (n - 1) / n;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return (n - 1) / n;
    case CollectiveOp::kSendRecv:
      return 1;
  }
  return 1;
}

absl::StatusOr<CollectiveCurve> ParseNcclTests(absl::string_view text, absl::string_view path) {
  CollectiveCurve curve;
  CollectiveOp op{};
  bool have_op = false;
  int rank_lines = 0, threads = 0, gpus_per_thread = 0;
  // Column positions from the header; -1 until it is read.
  int size_col = -1, time_col = -1, columns = 0;
  double time_unit = 0;  // seconds per printed unit, from the units line
  int line_no = 0, first_row = 0;
  auto where = [&](int line) { return absl::StrCat(path, ":", line, ": "); };
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripTrailingAsciiWhitespace(line);
    absl::string_view body = absl::StripLeadingAsciiWhitespace(line);
    if (body.empty()) continue;
    if (body[0] == '#') {
      body = absl::StripLeadingAsciiWhitespace(body.substr(1));
      if (absl::StartsWith(body, "Collective test starting:")) {
        have_op = CollectiveIn(body, &op);
        continue;
      }
      const std::vector<absl::string_view> t = Tokens(body);
      if (t.empty()) continue;
      if (t[0] == "Rank" && t.size() > 1) {
        ++rank_lines;
      } else if (t[0] == "nThread" && t.size() >= 4 && t[2] == "nGpus") {
        if (!absl::SimpleAtoi(t[1], &threads) || !absl::SimpleAtoi(t[3], &gpus_per_thread)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(line_no), "\"nThread T nGpus G\" with numbers expected"));
        }
      } else if (t[0] == "size") {
        if (first_row > 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(line_no), "a second table; one nccl-tests table per file (split it)"));
        }
        columns = static_cast<int>(t.size());
        for (int i = 0; i < columns; ++i) {
          if (t[i] == "time" && time_col < 0) time_col = i;
        }
        size_col = 0;
        if (time_col < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(line_no),
                           "the header has no \"time\" column (expected nccl-tests' \"size "
                           "count type redop root time algbw busbw ...\")"));
        }
      } else if (t[0] == "(B)" || (size_col >= 0 && time_unit == 0 && t[0][0] == '(')) {
        // The units line: (B) for the size, then (elements), then the
        // time's unit.
        if (t[0] != "(B)") {
          return absl::InvalidArgumentError(absl::StrCat(where(line_no), "column size: unit ", t[0],
                                                         " does not parse; expected (B)"));
        }
        for (size_t i = 1; i < t.size(); ++i) {
          if (t[i] == "(elements)") continue;
          if (t[i] == "(us)") {
            time_unit = 1e-6;
          } else if (t[i] == "(ms)") {
            time_unit = 1e-3;
          } else {
            return absl::InvalidArgumentError(
                absl::StrCat(where(line_no), "column time: unit ", t[i],
                             " does not parse; expected (us) or (ms)"));
          }
          break;
        }
      }
      continue;
    }
    // A data row starts with its size; other lines (NCCL INFO logs) do not.
    if (!absl::ascii_isdigit(body[0])) continue;
    if (size_col < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(line_no), "a row before the header (\"#  size  count  type ... time ...\")"));
    }
    const std::vector<absl::string_view> t = Tokens(body);
    if (static_cast<int>(t.size()) <= time_col) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(line_no), "column time (column ", time_col + 1, ") missing: the row has ", t.size(),
          " of the header's ", columns, " columns"));
    }
    double bytes = 0, time = 0;
    if (!absl::SimpleAtod(t[size_col], &bytes) || !std::isfinite(bytes) || bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where(line_no), "column size: \"", t[size_col],
                                                     "\" is not a size in bytes"));
    }
    if (!absl::SimpleAtod(t[time_col], &time) || !std::isfinite(time) || time <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where(line_no), "column time: \"", t[time_col],
                                                     "\" is not a positive time"));
    }
    if (curve.bytes_size() > 0 && bytes <= curve.bytes(curve.bytes_size() - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(where(line_no), "column size: ", t[size_col],
                                                     " does not increase (the row before has ",
                                                     curve.bytes(curve.bytes_size() - 1), ")"));
    }
    if (first_row == 0) first_row = line_no;
    curve.add_bytes(bytes);
    curve.add_time_s(time * (time_unit > 0 ? time_unit : 1e-6));
  }
  bool reduced = false;
  if (curve.bytes_size() == 0 && absl::StrContains(text, "\n|")) {
    RETURN_IF_ERROR(ParseReduced(text, path, &curve, &first_row));
    reduced = curve.bytes_size() > 0;
  }
  if (curve.bytes_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no nccl-tests rows (a header line \"#  size  count ... time ...\" ",
                     "and rows of numbers below it)"));
  }
  if (!have_op && !CollectiveIn(path.substr(std::min(path.size(), path.rfind('/') + 1)), &op)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": which collective is not said: no \"# Collective test starting:\" line and the "
        "file name names none of all_reduce, all_gather, reduce_scatter, alltoall, sendrecv"));
  }
  int gpus = rank_lines;
  if (gpus == 0 && threads > 0 && gpus_per_thread > 0) gpus = threads * gpus_per_thread;
  if (gpus == 0) gpus = GpusInName(path);
  if (gpus <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": the GPU count is not said: no \"#  Rank\" device lines, no \"nThread "
                     "T nGpus G\" line, and no .g<N>. in the file name"));
  }
  if (reduced) {
    for (int i = 0; i < curve.bytes_size(); ++i) {
      const double factor = RingTrafficFactor(op, gpus);
      curve.set_time_s(i, curve.bytes(i) * (factor > 0 ? factor : 1) / (curve.time_s(i) * 1e9));
    }
  }
  curve.set_op(std::string(CollectiveName(op)));
  curve.set_gpus(gpus);
  curve.set_source(absl::StrCat(path, ":", first_row));
  return curve;
}

absl::StatusOr<CollectiveTable> CollectiveTable::Create(
    const google::protobuf::RepeatedPtrField<CollectiveCurve>& curves) {
  CollectiveTable table;
  for (const CollectiveCurve& c : curves) {
    Curve out;
    if (!ParseCollectiveName(c.op(), &out.op)) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.source(), ": collective \"", c.op(),
          "\" is not one of all_reduce, all_gather, reduce_scatter, alltoall, sendrecv"));
    }
    if (c.gpus() < 1 || c.gpus() > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.source(), ": gpus ", c.gpus(), " is outside 1..65536"));
    }
    if (c.bytes_size() == 0 || c.bytes_size() != c.time_s_size()) {
      return absl::InvalidArgumentError(absl::StrCat(c.source(), ": ", c.bytes_size(),
                                                     " sizes and ", c.time_s_size(),
                                                     " times; expected as many, at least one"));
    }
    for (int i = 0; i < c.bytes_size(); ++i) {
      if (!(c.time_s(i) > 0) || !std::isfinite(c.time_s(i)) || !std::isfinite(c.bytes(i)) ||
          c.bytes(i) < 0 || (i > 0 && !(c.bytes(i) > c.bytes(i - 1)))) {
        return absl::InvalidArgumentError(
            absl::StrCat(c.source(), ": row ", i + 1, " (", c.bytes(i), " B, ", c.time_s(i),
                         " s): sizes must increase from 0 and times be positive"));
      }
    }
    out.gpus = c.gpus();
    out.bytes.assign(c.bytes().begin(), c.bytes().end());
    out.time_s.assign(c.time_s().begin(), c.time_s().end());
    // A later curve for the same collective and count replaces an earlier
    // one (files over the preset).
    auto same = std::find_if(table.curves_.begin(), table.curves_.end(),
                             [&](const Curve& k) { return k.op == out.op && k.gpus == out.gpus; });
    if (same != table.curves_.end()) {
      *same = std::move(out);
    } else {
      table.curves_.push_back(std::move(out));
    }
  }
  return table;
}

CollectiveTable::CollectiveTable(const CollectiveTable& o) : curves_(o.curves_) {}

CollectiveTable& CollectiveTable::operator=(const CollectiveTable& o) {
  curves_ = o.curves_;
  return *this;
}

bool CollectiveTable::Has(CollectiveOp op) const {
  return std::any_of(curves_.begin(), curves_.end(), [op](const Curve& c) { return c.op == op; });
}

std::vector<int> CollectiveTable::GpuCounts(CollectiveOp op) const {
  std::vector<int> out;
  for (const Curve& c : curves_) {
    if (c.op == op) out.push_back(c.gpus);
  }
  std::sort(out.begin(), out.end());
  return out;
}

double CollectiveTable::Interpolate(const Curve& c, double bytes, int* outside) {
  const std::vector<double>& x = c.bytes;
  const std::vector<double>& y = c.time_s;
  const size_t n = x.size();
  if (bytes <= x[0]) {
    *outside = bytes < x[0] ? -1 : 0;
    return y[0];
  }
  if (bytes >= x[n - 1]) {
    *outside = bytes > x[n - 1] ? 1 : 0;
    if (n == 1 || bytes == x[n - 1]) return y[n - 1];
    const double slope = (y[n - 1] - y[n - 2]) / (x[n - 1] - x[n - 2]);
    // A last segment measured faster than the one before it (noise) must
    // not make larger messages cheaper: its average bandwidth instead.
    const double rate = slope > 0 ? slope : y[n - 1] / x[n - 1];
    return y[n - 1] + (bytes - x[n - 1]) * rate;
  }
  *outside = 0;
  const size_t hi = static_cast<size_t>(std::upper_bound(x.begin(), x.end(), bytes) - x.begin());
  const size_t lo = hi - 1;
  if (bytes == x[lo]) return y[lo];
  const double f = (bytes - x[lo]) / (x[hi] - x[lo]);
  return y[lo] + f * (y[hi] - y[lo]);
}

double CollectiveTable::Time(CollectiveOp op, int gpus, double bytes) const {
  const Curve* exact = nullptr;
  const Curve* nearest = nullptr;
  for (const Curve& c : curves_) {
    if (c.op != op) continue;
    if (c.gpus == gpus) exact = &c;
    // Nearest count; a tie goes to the larger (its ring is the closer
    // stand-in for a group between two measured ones).
    if (nearest == nullptr || std::abs(c.gpus - gpus) < std::abs(nearest->gpus - gpus) ||
        (std::abs(c.gpus - gpus) == std::abs(nearest->gpus - gpus) && c.gpus > nearest->gpus)) {
      nearest = &c;
    }
  }
  if (nearest == nullptr) return -1;
  int outside = 0;
  double t;
  if (exact != nullptr) {
    t = Interpolate(*exact, bytes, &outside);
  } else {
    other_.fetch_add(1, std::memory_order_relaxed);
    g_other.fetch_add(1, std::memory_order_relaxed);
    t = Interpolate(*nearest, bytes, &outside);
    const double from = RingTrafficFactor(op, nearest->gpus);
    if (from > 0) t *= RingTrafficFactor(op, gpus) / from;
  }
  if (outside < 0) {
    below_.fetch_add(1, std::memory_order_relaxed);
    g_below.fetch_add(1, std::memory_order_relaxed);
  } else if (outside > 0) {
    above_.fetch_add(1, std::memory_order_relaxed);
    g_above.fetch_add(1, std::memory_order_relaxed);
  } else if (exact != nullptr) {
    measured_.fetch_add(1, std::memory_order_relaxed);
    g_measured.fetch_add(1, std::memory_order_relaxed);
  }
  return t;
}

namespace {

CollectiveCounts Load(const std::atomic<int64_t>& measured, const std::atomic<int64_t>& below,
                      const std::atomic<int64_t>& above, const std::atomic<int64_t>& other) {
  return {measured.load(std::memory_order_relaxed), below.load(std::memory_order_relaxed),
          above.load(std::memory_order_relaxed), other.load(std::memory_order_relaxed)};
}

}  // namespace

CollectiveCounts CollectiveTable::ProcessCounts() {
  return Load(g_measured, g_below, g_above, g_other);
}

CollectiveCounts CollectiveTable::counts() const { return Load(measured_, below_, above_, other_); }

}  // namespace servesim::devices

namespace servesim::devices {
namespace {

// Every table under devices/gpu/collectives/<preset>/, as {path, text}
// (generated at configure time by devices/CMakeLists.txt).
struct TableFile {
  const char* path;
  const char* text;
};
constexpr TableFile kTables[] = {
#include "collective_tables.inc"
    {nullptr, nullptr},
};

absl::string_view PresetOf(absl::string_view path) { return path.substr(0, path.find('/')); }

}  // namespace

std::vector<std::string> CollectivePresetNames() {
  std::vector<std::string> names;
  for (const TableFile& f : kTables) {
    if (f.path == nullptr) break;
    std::string name(PresetOf(f.path));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

absl::StatusOr<std::vector<CollectiveCurve>> CollectivePreset(absl::string_view name) {
  std::vector<CollectiveCurve> out;
  for (const TableFile& f : kTables) {
    if (f.path == nullptr) break;
    if (PresetOf(f.path) != name) continue;
    absl::StatusOr<CollectiveCurve> c =
        ParseNcclTests(f.text, absl::StrCat("devices/gpu/collectives/", f.path));
    // Compiled in and parsed by every test run: a failure is a bad table.
    if (!c.ok()) return absl::InternalError(c.status().message());
    out.push_back(*std::move(c));
  }
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no collectives preset \"", name,
                     "\"; known: ", absl::StrJoin(CollectivePresetNames(), ", "), ", analytic"));
  }
  return out;
}

}  // namespace servesim::devices
