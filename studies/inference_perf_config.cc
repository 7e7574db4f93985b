// Reading an inference-perf run: its config, its stage reports, and where
// they are in a run folder (inference_perf.h).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/read_text.h"
#include "common/status_macros.h"
#include "studies/inference_perf.h"
#include "studies/replay_files.h"
#include "studies/yaml_subset.h"

namespace servesim::studies {
namespace {

namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMaxRequests = 10'000'000;  // what a replay may plan in all
constexpr int64_t kMaxReportBytes = 64 << 20;

absl::Status FieldError(const std::string& path, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

// ------------------------------------------------------------- the config ----

// A length: an integer (a fixed value) or a distribution mapping
// (inference-perf's Distribution: min 10, max 1024, mean 512, std_dev 200,
// type normal by default).
absl::StatusOr<LengthDistribution> ReadLength(const YamlNode& node, const std::string& path,
                                              const std::string& name) {
  LengthDistribution d;
  if (!node.is_map()) {
    ASSIGN_OR_RETURN(const int64_t v, YamlInteger(node, path, name));
    if (v < 0) return FieldError(path, node.line, absl::StrCat(name, " is ", v, "; expected >= 0"));
    d.mean = static_cast<double>(v);
    d.min = d.max = v;
    return d;
  }
  d.type = "normal";
  d.min = 10;
  d.max = 1024;
  d.mean = 512;
  d.std_dev = 200;
  for (const auto& [key, value] : node.map) {
    const std::string field = absl::StrCat(name, ".", key);
    if (key == "min") {
      ASSIGN_OR_RETURN(d.min, YamlInteger(value, path, field));
    } else if (key == "max") {
      ASSIGN_OR_RETURN(d.max, YamlInteger(value, path, field));
    } else if (key == "mean") {
      ASSIGN_OR_RETURN(d.mean, YamlNumber(value, path, field));
    } else if (key == "std_dev") {
      ASSIGN_OR_RETURN(d.std_dev, YamlNumber(value, path, field));
    } else if (key == "variance") {
      ASSIGN_OR_RETURN(const double var, YamlNumber(value, path, field));
      if (var < 0) return FieldError(path, value.line, absl::StrCat(field, " is negative"));
      d.std_dev = std::sqrt(var);
    } else if (key == "type") {
      ASSIGN_OR_RETURN(d.type, YamlString(value, path, field));
      if (d.type != "normal" && d.type != "lognormal" && d.type != "uniform" && d.type != "fixed") {
        return absl::UnimplementedError(
            absl::StrCat(path, ":", value.line, ": ", field, " is ", d.type,
                         "; the replay draws normal, lognormal, uniform and fixed lengths"));
      }
    } else if (key == "total_count") {
      // Read by the caller where it matters.
    } else if (key == "skew") {
      // Only for skew_normal, refused above.
    } else {
      return FieldError(path, value.line,
                        absl::StrCat("unknown field ", field,
                                     " (a distribution has min, max, mean, std_dev, variance, "
                                     "type, total_count)"));
    }
  }
  if (d.min < 0 || d.min > d.max) {
    return FieldError(
        path, node.line,
        absl::StrCat(name, ": min ", d.min, " and max ", d.max, "; expected 0 <= min <= max"));
  }
  if (d.std_dev < 0) return FieldError(path, node.line, absl::StrCat(name, ".std_dev is negative"));
  if (d.type == "normal" &&
      (d.mean < static_cast<double>(d.min) || d.mean > static_cast<double>(d.max))) {
    return FieldError(path, node.line,
                      absl::StrCat(name, ".mean ", d.mean, " is outside [min, max] = [", d.min,
                                   ", ", d.max, "] (inference-perf refuses it too)"));
  }
  return d;
}

absl::StatusOr<int64_t> TotalCount(const YamlNode& node, const std::string& path,
                                   const std::string& name) {
  const YamlNode* n = node.Find("total_count");
  if (n == nullptr || n->is_null()) {
    return FieldError(path, node.line,
                      absl::StrCat(name, ".total_count is missing (inference-perf requires it)"));
  }
  ASSIGN_OR_RETURN(const int64_t v, YamlInteger(*n, path, name + ".total_count"));
  if (v < 1 || v > kMaxRequests) {
    return FieldError(path, n->line,
                      absl::StrCat(name, ".total_count is ", v, "; expected 1..", kMaxRequests));
  }
  return v;
}

absl::Status ReadLoad(const YamlNode& load, const std::string& path, InferencePerfConfig* c) {
  c->load_type = "constant";
  if (const YamlNode* t = load.Find("type"); t != nullptr && !t->is_null()) {
    ASSIGN_OR_RETURN(c->load_type, YamlString(*t, path, "load.type"));
    if (c->load_type != "constant" && c->load_type != "poisson") {
      return absl::UnimplementedError(
          absl::StrCat(path, ":", t->line, ": load.type is ", c->load_type,
                       "; the replay reads constant and poisson loads (stages of rate and "
                       "duration)"));
    }
  }
  if (const YamlNode* n = load.Find("interval"); n != nullptr && !n->is_null()) {
    ASSIGN_OR_RETURN(c->interval_s, YamlNumber(*n, path, "load.interval"));
    if (c->interval_s < 0 || c->interval_s > 86400) {
      return FieldError(path, n->line,
                        absl::StrCat("load.interval is ", c->interval_s, "; expected 0..86400"));
    }
  }
  if (const YamlNode* sweep = load.Find("sweep"); sweep != nullptr && !sweep->is_null()) {
    c->sweep_stage_duration_s = 180;  // SweepConfig's default
    if (const YamlNode* d = sweep->Find("stage_duration"); d != nullptr) {
      ASSIGN_OR_RETURN(c->sweep_stage_duration_s,
                       YamlNumber(*d, path, "load.sweep.stage_duration"));
      if (c->sweep_stage_duration_s <= 0) {
        return FieldError(path, d->line, "load.sweep.stage_duration must be > 0");
      }
    }
  } else if (const YamlNode* stages = load.Find("stages"); stages != nullptr && stages->is_seq()) {
    for (size_t k = 0; k < stages->seq.size(); ++k) {
      const YamlNode& s = stages->seq[k];
      const std::string name = absl::StrCat("load.stages[", k, "]");
      if (!s.is_map()) return FieldError(path, s.line, absl::StrCat(name, " is not a mapping"));
      for (const char* f : {"num_requests", "concurrency_level"}) {
        if (s.Find(f) != nullptr) {
          return FieldError(path, s.line,
                            absl::StrCat(name, ".", f,
                                         " is set; constant and poisson stages "
                                         "take rate and duration only"));
        }
      }
      const YamlNode* rate = s.Find("rate");
      const YamlNode* duration = s.Find("duration");
      if (rate == nullptr || duration == nullptr) {
        return FieldError(path, s.line, absl::StrCat(name, " needs rate and duration"));
      }
      InferencePerfStage st;
      ASSIGN_OR_RETURN(st.rate, YamlNumber(*rate, path, name + ".rate"));
      ASSIGN_OR_RETURN(st.duration_s, YamlNumber(*duration, path, name + ".duration"));
      if (st.rate <= 0 || st.rate > 1e6) {
        return FieldError(path, rate->line,
                          absl::StrCat(name, ".rate is ", st.rate, "; expected (0, 1e6]"));
      }
      if (st.duration_s <= 0 || st.duration_s > 1e6) {
        return FieldError(
            path, duration->line,
            absl::StrCat(name, ".duration is ", st.duration_s, "; expected (0, 1e6]"));
      }
      c->stages.push_back(st);
    }
  }
  if (c->stages.empty() && c->sweep_stage_duration_s == 0) {
    return FieldError(path, load.line, "load has no stages and no sweep: nothing was sent");
  }
  // Each worker holds at most worker_max_concurrency requests (a semaphore
  // taken before it pulls a request off the queue; LoadGenerator's worker
  // loop), so the client has at most num_workers x that in flight.
  int64_t per_worker = 100;  // LoadConfig's default
  if (const YamlNode* n = load.Find("worker_max_concurrency"); n != nullptr && !n->is_null()) {
    ASSIGN_OR_RETURN(per_worker, YamlInteger(*n, path, "load.worker_max_concurrency"));
    if (per_worker < 1 || per_worker > 1'000'000) {
      return FieldError(
          path, n->line,
          absl::StrCat("load.worker_max_concurrency is ", per_worker, "; expected 1..1000000"));
    }
  }
  if (const YamlNode* n = load.Find("num_workers"); n != nullptr && !n->is_null()) {
    ASSIGN_OR_RETURN(const int64_t workers, YamlInteger(*n, path, "load.num_workers"));
    if (workers < 1 || workers > 100'000) {
      return FieldError(path, n->line,
                        absl::StrCat("load.num_workers is ", workers, "; expected 1..100000"));
    }
    c->max_in_flight = std::min<int64_t>(workers * per_worker, 10'000'000);
  } else {
    c->notes.push_back(
        "load.num_workers not given: the client's CPU count (not recorded) times "
        "worker_max_concurrency limits its requests in flight; no limit applied");
  }
  if (load.Find("lora_traffic_split") != nullptr) {
    c->notes.push_back(
        "load.lora_traffic_split: LoRA adapters are not modelled (one model serves all)");
  }
  if (load.Find("request_timeout") != nullptr) {
    c->notes.push_back(
        "load.request_timeout: requests past it are not cut short (the client counts them as "
        "failures)");
  }
  if (load.Find("circuit_breakers") != nullptr) {
    c->notes.push_back("load.circuit_breakers: not modelled (a stage always runs to its end)");
  }
  return absl::OkStatus();
}

absl::Status ReadData(const YamlNode& data, const std::string& path, InferencePerfConfig* c) {
  c->data_type = "mock";  // DataConfig's default
  const YamlNode* t = data.Find("type");
  if (t != nullptr && !t->is_null()) {
    ASSIGN_OR_RETURN(c->data_type, YamlString(*t, path, "data.type"));
  }
  const int line = t != nullptr ? t->line : data.line;
  if (c->data_type != "shared_prefix" && c->data_type != "random" && c->data_type != "synthetic") {
    return absl::UnimplementedError(absl::StrCat(
        path, ":", line, ": data.type is ", c->data_type,
        "; the replay reads shared_prefix, random and synthetic data (the others take their "
        "prompts from a dataset or trace the config does not hold)"));
  }
  if (data.Find("multimodal") != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(path, ":", data.Find("multimodal")->line,
                     ": data.multimodal: images, video and audio are not modelled"));
  }
  if (c->data_type == "shared_prefix") {
    const YamlNode* sp = data.Find("shared_prefix");
    if (sp == nullptr || !sp->is_map()) {
      return FieldError(path, line, "data.type is shared_prefix but data.shared_prefix is missing");
    }
    c->groups = 10;
    c->prompts_per_group = 10;
    c->system_prompt = {"fixed", 100, 0, 100, 100};
    c->question = {"fixed", 50, 0, 50, 50};
    c->output = {"fixed", 50, 0, 50, 50};
    const YamlNode* legacy_q = nullptr;
    const YamlNode* legacy_o = nullptr;
    for (const auto& [key, value] : sp->map) {
      const std::string field = absl::StrCat("data.shared_prefix.", key);
      if (key == "num_groups" || key == "num_unique_system_prompts") {
        ASSIGN_OR_RETURN(c->groups, YamlInteger(value, path, field));
      } else if (key == "num_prompts_per_group" || key == "num_users_per_system_prompt") {
        ASSIGN_OR_RETURN(c->prompts_per_group, YamlInteger(value, path, field));
      } else if (key == "system_prompt_len") {
        ASSIGN_OR_RETURN(c->system_prompt, ReadLength(value, path, field));
      } else if (key == "question_len") {
        ASSIGN_OR_RETURN(c->question, ReadLength(value, path, field));
      } else if (key == "output_len") {
        ASSIGN_OR_RETURN(c->output, ReadLength(value, path, field));
      } else if (key == "question_distribution") {
        legacy_q = &value;
      } else if (key == "output_distribution") {
        legacy_o = &value;
      } else if (key == "enable_multi_turn_chat") {
        ASSIGN_OR_RETURN(const bool on, YamlBool(value, path, field));
        if (on) {
          return absl::UnimplementedError(absl::StrCat(
              path, ":", value.line, ": ", field,
              " is true; multi-turn sessions (each prompt grown by the last answer) are not "
              "replayed"));
        }
      } else if (key == "seed") {
        // The client's own prompt order; the replay draws its own.
      } else if (key == "multimodal") {
        return absl::UnimplementedError(absl::StrCat(path, ":", value.line, ": ", field,
                                                     ": images, video and audio are not modelled"));
      } else {
        return FieldError(path, value.line, absl::StrCat("unknown field ", field));
      }
    }
    // The legacy distributions win over a plain number (inference-perf's
    // _resolve_distribution).
    if (legacy_q != nullptr && !legacy_q->is_null()) {
      ASSIGN_OR_RETURN(c->question,
                       ReadLength(*legacy_q, path, "data.shared_prefix.question_distribution"));
    }
    if (legacy_o != nullptr && !legacy_o->is_null()) {
      ASSIGN_OR_RETURN(c->output,
                       ReadLength(*legacy_o, path, "data.shared_prefix.output_distribution"));
    }
    if (c->groups < 1 || c->prompts_per_group < 1 ||
        c->groups * c->prompts_per_group > kMaxRequests) {
      return FieldError(
          path, sp->line,
          absl::StrCat("data.shared_prefix: ", c->groups, " groups of ", c->prompts_per_group,
                       " prompts; expected >= 1 each and ", kMaxRequests, " prompts at most"));
    }
    return absl::OkStatus();
  }
  for (const char* which : {"input_distribution", "output_distribution"}) {
    const YamlNode* d = data.Find(which);
    const std::string field = absl::StrCat("data.", which);
    if (d == nullptr || !d->is_map()) {
      return FieldError(path, line,
                        absl::StrCat("data.type is ", c->data_type, " but ", field, " is missing"));
    }
    ASSIGN_OR_RETURN(LengthDistribution dist, ReadLength(*d, path, field));
    ASSIGN_OR_RETURN(const int64_t count, TotalCount(*d, path, field));
    if (which[0] == 'i') {
      c->input = dist;
      c->input_count = count;
    } else {
      c->output = dist;
      c->output_count = count;
    }
  }
  if (data.Find("trace") != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(path, ":", data.Find("trace")->line,
                     ": data.trace: prompts from a trace file are not replayed from the config"));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- reports ----

const Value* Field(const Struct& s, absl::string_view path) {
  return replay_internal::JsonField(s, path);
}

// A number at `field`; NaN when absent or null; an error for anything else.
absl::StatusOr<double> ReportNumber(const Struct& s, const std::string& path,
                                    absl::string_view field) {
  const Value* v = Field(s, field);
  if (v == nullptr || v->kind_case() == Value::kNullValue) return kNaN;
  if (v->kind_case() != Value::kNumberValue || !std::isfinite(v->number_value())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " is not a finite number"));
  }
  return v->number_value();
}

std::string StagePath(const std::string& dir, int k) {
  return (fs::path(dir) / absl::StrCat("stage_", k, "_lifecycle_metrics.json")).string();
}

}  // namespace

// ------------------------------------------------------------- public ----

absl::StatusOr<InferencePerfConfig> ParseInferencePerfConfig(absl::string_view yaml,
                                                             const std::string& path) {
  ASSIGN_OR_RETURN(const YamlNode root, ParseYaml(yaml, path));
  if (!root.is_map()) return FieldError(path, 1, "not a mapping of settings");
  InferencePerfConfig c;
  c.path = path;
  const YamlNode* load = root.Find("load");
  const YamlNode* data = root.Find("data");
  if (load == nullptr || !load->is_map()) return FieldError(path, root.line, "load: missing");
  if (data == nullptr || !data->is_map()) return FieldError(path, root.line, "data: missing");
  RETURN_IF_ERROR(ReadLoad(*load, path, &c));
  RETURN_IF_ERROR(ReadData(*data, path, &c));
  if (const YamlNode* server = root.Find("server"); server != nullptr && server->is_map()) {
    if (const YamlNode* e = server->Find("ignore_eos"); e != nullptr && !e->is_null()) {
      ASSIGN_OR_RETURN(c.ignore_eos, YamlBool(*e, path, "server.ignore_eos"));
    }
  }
  if (!c.ignore_eos) {
    c.notes.push_back(
        "server.ignore_eos is not true: the model may have stopped before the output length "
        "asked; each request runs to it (the reports' output_len shows what was generated)");
  }
  if (const YamlNode* api = root.Find("api"); api != nullptr && api->is_map()) {
    if (const YamlNode* t = api->Find("type");
        t != nullptr && t->is_scalar() && t->scalar != "completion") {
      c.notes.push_back(absl::StrCat("api.type ", t->scalar,
                                     ": the chat template's tokens are not added to the prompts"));
    }
    if (const YamlNode* s = api->Find("streaming"); s != nullptr && !s->is_null()) {
      ASSIGN_OR_RETURN(const bool streaming, YamlBool(*s, path, "api.streaming"));
      if (!streaming) {
        c.notes.push_back("api.streaming is false: the reports hold no TTFT, TPOT or ITL");
      }
    }
  }
  int64_t total = 0;
  for (const InferencePerfStage& s : c.stages) total += s.requests();
  if (total > kMaxRequests) {
    return FieldError(path, load->line,
                      absl::StrCat("the stages send ", total, " requests; the replay plans ",
                                   kMaxRequests, " at most"));
  }
  return c;
}

bool LooksLikeInferencePerf(absl::string_view yaml) {
  auto root = ParseYaml(yaml, "");
  return root.ok() && root->Find("load") != nullptr && root->Find("data") != nullptr;
}

absl::StatusOr<std::vector<StageReport>> ReadStageReports(const std::string& dir) {
  std::vector<StageReport> out;
  for (int k = 0;; ++k) {
    const std::string path = StagePath(dir, k);
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      if (k == 0) {
        return absl::NotFoundError(absl::StrCat(dir, ": no stage_0_lifecycle_metrics.json"));
      }
      // A later stage's report past a gap is a numbering error.
      if (fs::exists(StagePath(dir, k + 1), ec)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": missing, though stage ", k + 1, "'s report is there"));
      }
      break;
    }
    ASSIGN_OR_RETURN(const std::string json,
                     ReadTextFile(path, kMaxReportBytes, "an inference-perf stage report"));
    Struct s;
    if (auto st = google::protobuf::util::JsonStringToMessage(json, &s); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a JSON object: ", std::string(st.message())));
    }
    StageReport r;
    r.stage = k;
    r.path = path;
    ASSIGN_OR_RETURN(r.requested_rate, ReportNumber(s, path, "load_summary.requested_rate"));
    ASSIGN_OR_RETURN(r.achieved_rate, ReportNumber(s, path, "load_summary.achieved_rate"));
    ASSIGN_OR_RETURN(const double ok, ReportNumber(s, path, "successes.count"));
    ASSIGN_OR_RETURN(const double failed, ReportNumber(s, path, "failures.count"));
    if (std::isnan(ok)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": successes.count is missing"));
    }
    r.successes = static_cast<int64_t>(ok);
    r.failures = std::isnan(failed) ? 0 : static_cast<int64_t>(failed);
    const std::pair<const char*, const char*> metrics[] = {{"e2e_s", "request_latency"},
                                                           {"ttft_s", "time_to_first_token"},
                                                           {"tpot_s", "time_per_output_token"},
                                                           {"itl_s", "inter_token_latency"}};
    for (const auto& [name, key] : metrics) {
      std::array<double, 4> v{};
      const std::string base = absl::StrCat("successes.latency.", key, ".");
      ASSIGN_OR_RETURN(v[0], ReportNumber(s, path, base + "mean"));
      ASSIGN_OR_RETURN(v[1], ReportNumber(s, path, base + "median"));
      if (std::isnan(v[1])) {
        ASSIGN_OR_RETURN(v[1], ReportNumber(s, path, base + "p50"));
      }
      ASSIGN_OR_RETURN(v[2], ReportNumber(s, path, base + "p90"));
      ASSIGN_OR_RETURN(v[3], ReportNumber(s, path, base + "p99"));
      r.latency[name] = v;
    }
    ASSIGN_OR_RETURN(r.output_tokens_per_s,
                     ReportNumber(s, path, "successes.throughput.output_tokens_per_sec"));
    ASSIGN_OR_RETURN(r.requests_per_s,
                     ReportNumber(s, path, "successes.throughput.requests_per_sec"));
    ASSIGN_OR_RETURN(r.prompt_len_mean, ReportNumber(s, path, "successes.prompt_len.mean"));
    ASSIGN_OR_RETURN(r.output_len_mean, ReportNumber(s, path, "successes.output_len.mean"));
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status FillStagesFromReports(const std::vector<StageReport>& reports,
                                   InferencePerfConfig* config) {
  if (config->sweep_stage_duration_s == 0) {
    if (config->stages.size() != reports.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config->path, ": ", config->stages.size(), " stages in load.stages but ", reports.size(),
          " stage reports (", reports.empty() ? "" : reports.back().path, ")"));
    }
    return absl::OkStatus();
  }
  config->stages.clear();
  for (const StageReport& r : reports) {
    if (!(r.requested_rate > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.path, ": load_summary.requested_rate is missing; a sweep's stage rates come from it"));
    }
    config->stages.push_back({r.requested_rate, config->sweep_stage_duration_s});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<InferencePerfRun>> FindInferencePerfRun(const std::string& run_dir) {
  std::error_code ec;
  if (fs::exists(fs::path(run_dir) / "trace.csv", ec)) return std::nullopt;
  // The reports: in the folder, results/, reports/, inference-perf-data/,
  // or the one reports-* folder the client names by its start time.
  std::vector<std::string> report_dirs = {run_dir, (fs::path(run_dir) / "results").string(),
                                          (fs::path(run_dir) / "reports").string(),
                                          (fs::path(run_dir) / "inference-perf-data").string()};
  std::vector<std::string> stamped;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (e.is_directory(ec) && absl::StartsWith(e.path().filename().string(), "reports-")) {
      stamped.push_back(e.path().string());
    }
  }
  std::sort(stamped.begin(), stamped.end());
  if (stamped.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(run_dir, ": ", stamped.size(), " reports-* folders (",
                     absl::StrJoin(stamped, ", "), "); keep the one run to replay"));
  }
  report_dirs.insert(report_dirs.end(), stamped.begin(), stamped.end());
  std::string reports_dir;
  for (const std::string& d : report_dirs) {
    if (fs::exists(StagePath(d, 0), ec)) {
      reports_dir = d;
      break;
    }
  }
  // The config: in setup.json (workload.profile_yaml or
  // workload_profile_yaml), or a file beside the run or its reports.
  InferencePerfRun run;
  std::string yaml;
  const std::string setup_path = (fs::path(run_dir) / "setup.json").string();
  if (fs::exists(setup_path, ec)) {
    ASSIGN_OR_RETURN(const std::string json,
                     ReadTextFile(setup_path, kMaxReportBytes, "setup.json"));
    Struct setup;
    if (google::protobuf::util::JsonStringToMessage(json, &setup).ok()) {
      for (const char* key : {"workload.profile_yaml", "workload_profile_yaml"}) {
        const Value* v = Field(setup, key);
        if (v != nullptr && v->kind_case() == Value::kStringValue &&
            LooksLikeInferencePerf(v->string_value())) {
          yaml = v->string_value();
          run.config_source = absl::StrCat(setup_path, " ", key);
          break;
        }
      }
    }
  }
  if (yaml.empty()) {
    std::vector<std::string> files;
    for (const char* name : {"config.yml", "config.yaml", "profile.yaml", "profile.yml"}) {
      files.push_back((fs::path(run_dir) / name).string());
    }
    if (!reports_dir.empty()) files.push_back((fs::path(reports_dir) / "config.yaml").string());
    for (const std::string& f : files) {
      if (!fs::exists(f, ec)) continue;
      ASSIGN_OR_RETURN(std::string text, ReadTextFile(f, 16 << 20, "an inference-perf config"));
      if (!LooksLikeInferencePerf(text)) continue;
      yaml = std::move(text);
      run.config_source = f;
      break;
    }
  }
  if (yaml.empty() && reports_dir.empty()) return std::nullopt;
  if (yaml.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        reports_dir,
        ": inference-perf stage reports but no config beside them (config.yml, "
        "config.yaml, profile.yaml, or setup.json's workload.profile_yaml): the stages' load "
        "and data come from it"));
  }
  ASSIGN_OR_RETURN(run.config, ParseInferencePerfConfig(yaml, run.config_source));
  if (!reports_dir.empty()) {
    ASSIGN_OR_RETURN(run.reports, ReadStageReports(reports_dir));
    RETURN_IF_ERROR(FillStagesFromReports(run.reports, &run.config));
  } else if (run.config.stages.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(run.config_source,
                     ": a sweep's stages are found by the client at run time and read "
                     "from its stage reports, and there are none in ",
                     run_dir));
  }
  return run;
}

}  // namespace servesim::studies
