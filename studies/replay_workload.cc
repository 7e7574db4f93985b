// The replay's workload (studies/replay_workload.h): trace.csv as it is,
// or rewritten with the prompts' token ids or the client's shared prefix.
#include "studies/replay_workload.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "studies/replay_files.h"

namespace servesim::studies::replay_internal {
namespace {

namespace fs = std::filesystem;

// The run's workload file (token ids), looked for beside the run.
// The file setup.json's workload.file names, as the run names it: relative
// to the run's folder or a folder above it (a bundle of runs beside their
// workloads), then in `workloads_dir` (as named, then by file name), then
// by its file name beside the run or up to two folders above. Empty when
// none is there; `looked` lists where it looked.
std::string FindWorkloadFile(const std::string& run_dir, const std::string& file,
                             const std::string& workloads_dir, std::vector<std::string>* looked) {
  if (file.empty()) return "";
  const fs::path named(file);
  const std::string base = named.filename().string();
  std::vector<fs::path> candidates;
  if (named.is_absolute()) {
    candidates.push_back(named);
  } else {
    fs::path dir = fs::absolute(run_dir);
    for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
      candidates.push_back(dir / named);
    }
  }
  if (!workloads_dir.empty()) {
    if (!named.is_absolute()) candidates.push_back(fs::path(workloads_dir) / named);
    candidates.push_back(fs::path(workloads_dir) / base);
  }
  fs::path dir = fs::absolute(run_dir);
  for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
    candidates.push_back(dir / base);
  }
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.lexically_normal().string();
    looked->push_back(c.lexically_normal().string());
  }
  return "";
}

// The integer after "key": in a JSON line (flat objects of numbers and
// arrays, as the workload format writes them).
bool JsonInt(absl::string_view line, absl::string_view key, int64_t* out) {
  const std::string k = absl::StrCat("\"", key, "\"");
  size_t p = line.find(k);
  if (p == absl::string_view::npos) return false;
  p = line.find(':', p + k.size());
  if (p == absl::string_view::npos) return false;
  size_t e = p + 1;
  while (e < line.size() && (line[e] == ' ')) ++e;
  size_t end = e;
  while (end < line.size() && (absl::ascii_isdigit(line[end]) || line[end] == '-')) ++end;
  return absl::SimpleAtoi(line.substr(e, end - e), out);
}

absl::string_view JsonArray(absl::string_view line, absl::string_view key) {
  const std::string k = absl::StrCat("\"", key, "\"");
  const size_t p = line.find(k);
  if (p == absl::string_view::npos) return {};
  const size_t open = line.find('[', p + k.size());
  if (open == absl::string_view::npos) return {};
  const size_t close = line.find(']', open);
  if (close == absl::string_view::npos) return {};
  return line.substr(open, close - open + 1);
}

// trace.csv merged with the workload file's token ids, line by line: the
// workload file must list the trace's requests, in its order.
absl::StatusOr<std::string> MergeTokenIds(const std::string& ids_path, const Table& trace,
                                          const std::string& trace_path, size_t t_arr, size_t t_in,
                                          size_t t_out) {
  ASSIGN_OR_RETURN(const std::string ids_text, ReadMaybeGzip(ids_path));
  std::string merged;
  size_t r = 0;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(ids_text, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (r >= trace.rows.size()) {
      return absl::InvalidArgumentError(absl::StrCat(ids_path, ":", line_no,
                                                     ": more requests "
                                                     "than ",
                                                     trace_path, "'s ", trace.rows.size()));
    }
    int64_t in = 0;
    ASSIGN_OR_RETURN(const double want_in, trace.Number(r, t_in));
    if (!JsonInt(line, "input_toks", &in) || in != static_cast<int64_t>(want_in)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ids_path, ":", line_no, ": input_toks ", in, " but ", trace_path, ":",
                       trace.lines[r], " has input_tokens ", trace.rows[r][t_in],
                       "; the workload file does not match the run's trace"));
    }
    const absl::string_view ids = JsonArray(line, "input_tok_ids");
    ASSIGN_OR_RETURN(const double arrival, trace.Number(r, t_arr));
    ASSIGN_OR_RETURN(const double outputs, trace.Number(r, t_out));
    absl::StrAppendFormat(
        &merged, "{\"input_toks\": %d, \"output_toks\": %d, \"arrival_time_ns\": %d%s%s}\n", in,
        static_cast<int64_t>(outputs), static_cast<int64_t>(std::llround(arrival * 1e9)),
        ids.empty() ? "" : ", \"input_tok_ids\": ", ids);
    ++r;
  }
  if (r != trace.rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids_path, ": ", r, " requests but ", trace_path, " has ", trace.rows.size()));
  }
  return merged;
}

// trace.csv with every prompt starting with the one shared prefix.
absl::StatusOr<std::string> SharedPrefixCsv(const Table& trace, size_t t_arr, size_t t_in,
                                            size_t t_out, int64_t shared_prefix) {
  // GuideLLM's synthetic data prepends one prefix of prefix_tokens tokens
  // to every prompt.
  std::string csv = "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n";
  for (size_t r = 0; r < trace.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double in, trace.Number(r, t_in));
    absl::StrAppend(&csv, trace.rows[r][t_arr], ",", trace.rows[r][t_in], ",", trace.rows[r][t_out],
                    ",0,", std::min<int64_t>(shared_prefix, static_cast<int64_t>(in)), "\n");
  }
  return csv;
}

}  // namespace

absl::Status PrepareWorkload(const WorkloadSource& source, servesim::v1::Scenario* sc,
                             ReplaySetup* out) {
  const std::string& run_dir = source.run_dir;
  const std::string& out_dir = source.out_dir;
  const int64_t shared_prefix = source.shared_prefix;
  const bool prefix_caching = sc->scheduler().prefix_caching();
  const std::string trace_path =
      fs::absolute(source.trace_path.empty() ? fs::path(run_dir) / "trace.csv"
                                             : fs::path(source.trace_path))
          .string();
  ASSIGN_OR_RETURN(const Table trace, ReadTable(trace_path));
  ASSIGN_OR_RETURN(const size_t t_arr, trace.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t t_in, trace.Column("input_tokens"));
  ASSIGN_OR_RETURN(const size_t t_out, trace.Column("output_tokens"));
  out->requests = static_cast<int64_t>(trace.rows.size());
  if (out->requests == 0) {
    return absl::InvalidArgumentError(absl::StrCat(trace_path, ": no requests"));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  auto* tr = sc->mutable_workload()->mutable_trace();
  out->workload_path = trace_path;
  tr->set_format(servesim::v1::TRACE_FORMAT_CSV);
  std::vector<std::string> looked;
  const std::string ids_path =
      FindWorkloadFile(run_dir, source.workload_file, source.workloads_dir, &looked);
  if (!source.trace_path.empty()) {
    // Built by the replay with its prefix groups: read as it is.
    out->workload_note = source.trace_note;
  } else if (!ids_path.empty() && prefix_caching) {
    ASSIGN_OR_RETURN(const std::string merged,
                     MergeTokenIds(ids_path, trace, trace_path, t_arr, t_in, t_out));
    out->workload_path = fs::absolute(fs::path(out_dir) / "workload.jsonl").string();
    RETURN_IF_ERROR(WriteFile(out->workload_path, merged));
    tr->set_format(servesim::v1::TRACE_FORMAT_TOKEN_IDS);
    out->token_ids = true;
  } else if (shared_prefix > 0 && prefix_caching) {
    ASSIGN_OR_RETURN(const std::string csv,
                     SharedPrefixCsv(trace, t_arr, t_in, t_out, shared_prefix));
    out->workload_path = fs::absolute(fs::path(out_dir) / "trace.csv").string();
    RETURN_IF_ERROR(WriteFile(out->workload_path, csv));
    out->assumptions.push_back(absl::StrCat(
        "workload: every prompt starts with the one shared prefix of ", shared_prefix,
        " tokens (workload_profile_yaml prefix_tokens; GuideLLM prepends it to each prompt)"));
  } else if (prefix_caching) {
    out->assumptions.push_back(
        !source.workload_file.empty()
            ? absl::StrCat("workload: ", source.workload_file,
                           " (the prompts' token ids, setup.json workload.file) not found (looked "
                           "in ",
                           absl::StrJoin(looked, ", "),
                           "; --workloads DIR names another folder): prefix caching sees no "
                           "shared prompts")
            : "workload: no token ids recorded: prefix caching sees no shared prompts");
  }
  tr->set_path(out->workload_path);
  return absl::OkStatus();
}

}  // namespace servesim::studies::replay_internal
