#include "studies/replay.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "devices/presets.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "metrics/quantiles.h"
#include "reports/report_html.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::studies {
namespace {

namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  if (!absl::EndsWith(path, ".gz")) return ReadFile(path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": not a readable gzip file"));
  return out;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

// ------------------------------------------------------------ csv table ----

// A small CSV table with a header (no quoting), its rows and line numbers.
struct Table {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> lines;

  // The column's index; an error lists the header.
  absl::StatusOr<size_t> Column(absl::string_view name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no column ", name, "; columns: ",
                                                     absl::StrJoin(header, ",")));
    }
    return static_cast<size_t>(it - header.begin());
  }
  bool Has(absl::string_view name) const {
    return std::find(header.begin(), header.end(), name) != header.end();
  }
  // Row r's value in column c as a finite number.
  absl::StatusOr<double> Number(size_t r, size_t c) const {
    double v = 0;
    if (!absl::SimpleAtod(rows[r][c], &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lines[r], ": column ", header[c],
                                                     " is \"", rows[r][c],
                                                     "\"; expected a number"));
    }
    return v;
  }
};

absl::StatusOr<Table> ReadTable(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  Table t;
  t.path = path;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripSuffix(line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (t.header.empty()) {
      t.header = std::move(f);
      continue;
    }
    if (f.size() != t.header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", f.size(),
                                                     " fields; the header has ", t.header.size()));
    }
    t.rows.push_back(std::move(f));
    t.lines.push_back(line_no);
  }
  if (t.header.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
  return t;
}

// -------------------------------------------------------------- setup.json ----

const Value* Field(const Struct& s, absl::string_view path) {
  const Struct* cur = &s;
  const Value* v = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (cur == nullptr) return nullptr;
    auto it = cur->fields().find(std::string(part));
    if (it == cur->fields().end()) return nullptr;
    v = &it->second;
    cur = v->kind_case() == Value::kStructValue ? &v->struct_value() : nullptr;
  }
  return v;
}

std::string Describe(const Value* v) {
  if (v == nullptr) return "absent";
  switch (v->kind_case()) {
    case Value::kNullValue: return "null";
    case Value::kNumberValue: return absl::StrFormat("%g", v->number_value());
    case Value::kStringValue: return absl::StrCat("\"", v->string_value(), "\"");
    case Value::kBoolValue: return v->bool_value() ? "true" : "false";
    default: return "an object";
  }
}

// An engine knob as setup.json gives it: a scalar, or {"value": ...,
// "recorded": false, "basis": "..."}.
struct Knob {
  const Value* value = nullptr;  // null: absent or null
  bool recorded = true;
  std::string basis;
};

Knob ReadKnob(const Struct& setup, absl::string_view name) {
  Knob k;
  const Value* v = Field(setup, absl::StrCat("engine_knobs.", name));
  if (v != nullptr && v->kind_case() == Value::kStructValue) {
    const Struct& s = v->struct_value();
    if (auto it = s.fields().find("recorded"); it != s.fields().end()) {
      k.recorded = it->second.kind_case() != Value::kBoolValue || it->second.bool_value();
    }
    if (auto it = s.fields().find("basis"); it != s.fields().end()) {
      k.basis = it->second.string_value();
    }
    auto it = s.fields().find("value");
    v = it == s.fields().end() ? nullptr : &it->second;
  }
  if (v != nullptr && v->kind_case() != Value::kNullValue) k.value = v;
  return k;
}

// The xPU preset of a GPU name as engines and nvidia-smi print it.
std::string XpuPresetOf(const std::string& gpu_name, double memory_gb) {
  std::string n = absl::AsciiStrToLower(gpu_name);
  std::replace(n.begin(), n.end(), '-', ' ');
  std::replace(n.begin(), n.end(), '_', ' ');
  auto has = [&](absl::string_view s) { return absl::StrContains(n, s); };
  if (has("rtx pro 6000") || has("rtxpro6000")) return "rtx-pro-6000";
  if (has("4090")) return "rtx-4090";
  if (has("l40s")) return "l40s";
  if (has("mi300x")) return "mi300x";
  if (has("b200")) return "b200-180gb";
  if (has("h200")) return "h200-sxm-141gb";
  if (has("h100")) return has("pcie") ? "h100-pcie-80gb" : "h100-sxm-80gb";
  if (has("a100")) {
    return has("40gb") || (memory_gb > 0 && memory_gb < 60) ? "a100-40gb" : "a100-80gb";
  }
  return "";
}

// Whether a --set override starts with `prefix` (e.g. "model.preset=").
bool SetsUnder(const std::vector<std::string>& sets, absl::string_view prefix) {
  return std::any_of(sets.begin(), sets.end(),
                     [&](const std::string& s) { return absl::StartsWith(s, prefix); });
}

// The model: the preset whose hf_name is setup's model.name (its recorded
// architecture must agree), else the recorded architecture itself.
absl::Status MapModel(const Struct& setup, const std::string& setup_path,
                      servesim::v1::ModelSpec* out, std::vector<std::string>* notes) {
  const Value* name = Field(setup, "model.name");
  if (name == nullptr || name->kind_case() != Value::kStringValue || name->string_value().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(setup_path, ": model.name is ", Describe(name),
                     "; expected the model's Hugging Face name (or give --set model.preset=NAME)"));
  }
  const std::string& hf = name->string_value();
  const Value* moe_flag = Field(setup, "model.moe");
  const bool moe =
      moe_flag != nullptr && moe_flag->kind_case() == Value::kBoolValue && moe_flag->bool_value();
  // Recorded architecture fields -> ModelSpec setters.
  struct Dim {
    const char* field;
    int64_t (servesim::v1::ModelSpec::*get)() const;
    void (servesim::v1::ModelSpec::*set)(int64_t);
  };
  const Dim dims[] = {
      {"num_layers", &servesim::v1::ModelSpec::num_layers, &servesim::v1::ModelSpec::set_num_layers},
      {"hidden_size", &servesim::v1::ModelSpec::d_model, &servesim::v1::ModelSpec::set_d_model},
      {"num_attention_heads", &servesim::v1::ModelSpec::num_heads,
       &servesim::v1::ModelSpec::set_num_heads},
      {"num_kv_heads", &servesim::v1::ModelSpec::num_kv_heads,
       &servesim::v1::ModelSpec::set_num_kv_heads},
      {"head_dim", &servesim::v1::ModelSpec::d_head, &servesim::v1::ModelSpec::set_d_head},
      {"ffn_intermediate_size", &servesim::v1::ModelSpec::d_ff, &servesim::v1::ModelSpec::set_d_ff},
      {"vocab_size", &servesim::v1::ModelSpec::vocab_size,
       &servesim::v1::ModelSpec::set_vocab_size},
  };
  std::string preset;
  for (const std::string& p : devices::ModelPresetNames()) {
    auto spec = devices::ModelPreset(p);
    if (spec.ok() && absl::EqualsIgnoreCase(spec->hf_name(), hf)) preset = p;
  }
  if (!preset.empty()) {
    const servesim::v1::ModelSpec spec = *devices::ModelPreset(preset);
    for (const Dim& d : dims) {
      const Value* v = Field(setup, absl::StrCat("model.", d.field));
      if (v == nullptr || v->kind_case() != Value::kNumberValue) continue;
      // An MoE model's FF width may be recorded as its experts'.
      const bool expert_width = spec.num_experts() > 0 &&
                                d.set == &servesim::v1::ModelSpec::set_d_ff &&
                                static_cast<int64_t>(v->number_value()) == spec.expert_d_ff();
      if (static_cast<int64_t>(v->number_value()) != (spec.*d.get)() && !expert_width) {
        return absl::InvalidArgumentError(absl::StrCat(
            setup_path, ": model.", d.field, " is ", Describe(v), " but preset ", preset, " (",
            hf, ") has ", (spec.*d.get)(), "; give the model explicitly with --set model.*"));
      }
    }
    if (moe != (spec.num_experts() > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": model.moe is ", moe ? "true" : "false", " but preset ", preset, " (", hf,
          ") is ", spec.num_experts() > 0 ? "a mixture of experts" : "dense"));
    }
    out->set_preset(preset);
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  for (const Dim& d : dims) {
    const Value* v = Field(setup, absl::StrCat("model.", d.field));
    if (v == nullptr || v->kind_case() != Value::kNumberValue || !(v->number_value() >= 1)) {
      missing.push_back(absl::StrCat("model.", d.field));
      continue;
    }
    (out->*d.set)(static_cast<int64_t>(v->number_value()));
  }
  if (!missing.empty()) {
    std::vector<std::string> known;
    for (const std::string& p : devices::ModelPresetNames()) {
      auto spec = devices::ModelPreset(p);
      if (spec.ok() && !spec->hf_name().empty()) known.push_back(spec->hf_name());
    }
    return absl::InvalidArgumentError(absl::StrCat(
        setup_path, ": model.name \"", hf, "\" is no preset's (known: ", absl::StrJoin(known, ", "),
        ") and ", absl::StrJoin(missing, ", "),
        missing.size() == 1 ? " is" : " are",
        " not recorded; give --set model.preset=NAME or the model's dimensions"));
  }
  out->set_name(hf);
  out->set_hf_name(hf);
  const Value* act = Field(setup, "model.hidden_act");
  const std::string a = act != nullptr ? absl::AsciiStrToLower(act->string_value()) : "silu";
  if (a == "silu" || a == "swish" || a == "swiglu") {
    out->set_ff_kind(servesim::v1::FF_KIND_SWIGLU);
  } else if (absl::StartsWith(a, "gelu") || a == "relu") {
    out->set_ff_kind(servesim::v1::FF_KIND_GELU);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": model.hidden_act is ",
                                                   Describe(act),
                                                   "; expected silu (gated) or gelu/relu"));
  }
  if (const Value* v = Field(setup, "model.max_position_embeddings");
      v != nullptr && v->kind_case() == Value::kNumberValue) {
    out->set_max_context_tokens(static_cast<int64_t>(v->number_value()));
  }
  for (auto [field, set] :
       {std::pair{"tie_word_embeddings", &servesim::v1::ModelSpec::set_tied_embeddings},
        std::pair{"qk_norm", &servesim::v1::ModelSpec::set_qk_norm}}) {
    const Value* v = Field(setup, absl::StrCat("model.", field));
    (out->*set)(v != nullptr && v->kind_case() == Value::kBoolValue && v->bool_value());
  }
  if (moe) {
    // The experts, under the names Hugging Face configs use.
    auto first = [&](std::initializer_list<const char*> names) -> const Value* {
      for (const char* n : names) {
        const Value* v = Field(setup, absl::StrCat("model.", n));
        if (v != nullptr && v->kind_case() == Value::kNumberValue) return v;
      }
      return nullptr;
    };
    const Value* experts = first({"num_experts", "n_routed_experts", "num_local_experts"});
    const Value* top_k = first({"num_experts_per_tok", "experts_per_token", "top_k"});
    const Value* width = first({"moe_intermediate_size", "expert_intermediate_size"});
    if (experts == nullptr || top_k == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(setup_path,
                       ": model.moe is true but model.num_experts and model.num_experts_per_tok "
                       "are not recorded; give --set model.preset=NAME or model.num_experts, "
                       "model.experts_per_token and model.expert_d_ff"));
    }
    out->set_num_experts(static_cast<int64_t>(experts->number_value()));
    out->set_experts_per_token(static_cast<int64_t>(top_k->number_value()));
    out->set_expert_d_ff(width != nullptr ? static_cast<int64_t>(width->number_value())
                                          : out->d_ff());
    if (const Value* v = first({"n_shared_experts", "shared_experts"}); v != nullptr) {
      out->set_shared_experts(static_cast<int64_t>(v->number_value()));
    }
    if (const Value* v = first({"first_k_dense_replace", "dense_layers"}); v != nullptr) {
      out->set_dense_layers(static_cast<int64_t>(v->number_value()));
    }
  }
  notes->push_back(absl::StrCat("model ", hf,
                                ": no preset; dimensions from setup.json's model block"));
  return absl::OkStatus();
}

// The run's workload file (token ids), looked for beside the run.
std::string FindBeside(const std::string& run_dir, const std::string& file) {
  if (file.empty()) return "";
  const std::string base = fs::path(file).filename().string();
  fs::path dir = fs::absolute(run_dir);
  for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
    std::error_code ec;
    if (fs::is_regular_file(dir / base, ec)) return (dir / base).string();
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

// Percentiles as numpy's default (linear between closest ranks).
metrics::Distribution Dist(std::vector<double> v) { return metrics::Summarize(v); }

}  // namespace

double CompareRow::error_pct() const {
  return measured != 0 ? 100.0 * (simulated - measured) / measured : 0.0;
}

absl::StatusOr<ReplaySetup> PrepareReplay(const std::string& run_dir, const std::string& out_dir,
                                          const std::vector<std::string>& sets) {
  const std::string setup_path = (fs::path(run_dir) / "setup.json").string();
  ASSIGN_OR_RETURN(const std::string json, ReadFile(setup_path));
  Struct setup;
  if (auto st = google::protobuf::util::JsonStringToMessage(json, &setup); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(setup_path, ": not a JSON object: ", std::string(st.message())));
  }
  ReplaySetup out;
  servesim::v1::Scenario sc;

  // Engine.
  const Value* engine = Field(setup, "engine");
  if (engine == nullptr || !absl::EqualsIgnoreCase(engine->string_value(), "vllm")) {
    return absl::InvalidArgumentError(absl::StrCat(
        setup_path, ": engine is ", Describe(engine), "; servesim replays vLLM runs (\"vLLM\")"));
  }
  const Value* run_name = Field(setup, "run");
  sc.set_name(absl::StrCat("replay of ", run_name != nullptr && !run_name->string_value().empty()
                                             ? run_name->string_value()
                                             : fs::path(run_dir).filename().string()));

  // Model and dtype.
  auto* model = sc.mutable_model();
  if (!SetsUnder(sets, "model.preset=")) RETURN_IF_ERROR(MapModel(setup, setup_path, model, &out.assumptions));
  const Value* dtype = Field(setup, "dtype");
  const std::string dt = dtype != nullptr ? absl::AsciiStrToLower(dtype->string_value()) : "";
  if (dt == "bfloat16" || dt == "bf16") {
    model->set_dtype(servesim::v1::DTYPE_BF16);
  } else if (dt == "float16" || dt == "fp16" || dt == "half") {
    model->set_dtype(servesim::v1::DTYPE_FP16);
  } else if (!SetsUnder(sets, "model.dtype")) {
    return absl::InvalidArgumentError(absl::StrCat(
        setup_path, ": dtype is ", Describe(dtype),
        "; expected bfloat16 or float16 (or give --set model.dtype=DTYPE_BF16)"));
  }
  if (const Value* kv = Field(setup, "kv_cache_dtype");
      kv != nullptr && kv->kind_case() == Value::kStringValue && kv->string_value() != "auto") {
    return absl::UnimplementedError(absl::StrCat(
        setup_path, ": kv_cache_dtype is ", Describe(kv),
        "; only \"auto\" (the model's dtype) is modelled"));
  }

  // GPU and parallelism.
  auto* cluster = sc.mutable_cluster();
  const Value* gpu = Field(setup, "hardware.gpu.name");
  if (!SetsUnder(sets, "cluster.xpu.preset=")) {
    if (gpu == nullptr || gpu->kind_case() != Value::kStringValue || gpu->string_value().empty()) {
      const Value* note = Field(setup, "hardware.gpu.note");
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": hardware.gpu.name is ", Describe(gpu), " (the run did not record its GPU",
          note != nullptr && !note->string_value().empty() ? ": " + note->string_value() : "",
          "); name it with --set cluster.xpu.preset=PRESET (known: ",
          absl::StrJoin(devices::XpuPresetNames(), ", "), ")"));
    }
    const Value* mem = Field(setup, "hardware.gpu.memory_GB");
    const std::string preset = XpuPresetOf(
        gpu->string_value(), mem != nullptr && mem->kind_case() == Value::kNumberValue
                                 ? mem->number_value()
                                 : 0.0);
    if (preset.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": hardware.gpu.name \"", gpu->string_value(),
          "\" is no xPU preset's; give --set cluster.xpu.preset=PRESET (known: ",
          absl::StrJoin(devices::XpuPresetNames(), ", "), ") or the xPU's figures"));
    }
    cluster->mutable_xpu()->set_preset(preset);
  }
  auto par = [&](const char* name, int64_t* v) -> absl::Status {
    const Value* p = Field(setup, absl::StrCat("parallelism.", name));
    *v = 1;
    if (p == nullptr || p->kind_case() == Value::kNullValue) {
      out.assumptions.push_back(absl::StrCat("parallelism.", name, " not recorded: 1"));
      return absl::OkStatus();
    }
    if (p->kind_case() != Value::kNumberValue || !(p->number_value() >= 1) ||
        p->number_value() != std::floor(p->number_value())) {
      return absl::InvalidArgumentError(absl::StrCat(setup_path, ": parallelism.", name, " is ",
                                                     Describe(p), "; expected an integer >= 1"));
    }
    *v = static_cast<int64_t>(p->number_value());
    return absl::OkStatus();
  };
  int64_t tp = 1, dp = 1, pp = 1, ep = 1;
  RETURN_IF_ERROR(par("tp", &tp));
  RETURN_IF_ERROR(par("dp", &dp));
  RETURN_IF_ERROR(par("pp", &pp));
  RETURN_IF_ERROR(par("ep", &ep));
  if (pp > 1) {
    return absl::UnimplementedError(absl::StrCat(setup_path, ": parallelism.pp is ", pp,
                                                 "; pipeline parallelism is not modelled"));
  }
  bool moe_model = false;
  if (const Value* moe = Field(setup, "model.moe");
      moe != nullptr && moe->kind_case() == Value::kBoolValue) {
    moe_model = moe->bool_value();
  } else if (!model->preset().empty()) {
    moe_model = devices::ModelPreset(model->preset()).ok() &&
                devices::ModelPreset(model->preset())->num_experts() > 0;
  }
  const Value* ep_flag = Field(setup, "parallelism.enable_expert_parallel");
  const bool expert_parallel =
      ep > 1 ||
      (ep_flag != nullptr && ep_flag->kind_case() == Value::kBoolValue && ep_flag->bool_value());
  cluster->set_tensor_parallel(static_cast<int32_t>(tp));
  if (moe_model) {
    // vLLM with an MoE model: the data-parallel engines step together, the
    // MoE layers sharded over all dp x tp GPUs (by expert with
    // enable_expert_parallel, whose group is then dp x tp GPUs).
    if (expert_parallel && ep > 1 && ep != dp * tp) {
      return absl::InvalidArgumentError(
          absl::StrCat(setup_path, ": parallelism.ep is ", ep,
                       " but vLLM's expert-parallel group is dp x tp = ", dp * tp));
    }
    if (dp > 1) cluster->set_data_parallel(static_cast<int32_t>(dp));
    cluster->set_expert_parallel(expert_parallel);
    cluster->set_replicas(1);
    if (dp > 1) {
      // The ranks pad to one token count when the step runs under CUDA
      // graphs (vLLM's default unless enforce_eager).
      const Knob eager = ReadKnob(setup, "enforce_eager");
      if (eager.value != nullptr && eager.value->kind_case() == Value::kBoolValue &&
          eager.value->bool_value()) {
        sc.mutable_scheduler()->set_cuda_graph_max_tokens(0);
      } else {
        const Knob cap = ReadKnob(setup, "cudagraph_capture_max");
        const Knob seqs = ReadKnob(setup, "max_num_seqs");
        int64_t v = 512;
        if (cap.value != nullptr && cap.value->kind_case() == Value::kNumberValue &&
            cap.value->number_value() >= 1) {
          v = static_cast<int64_t>(cap.value->number_value());
        } else {
          if (seqs.value != nullptr && seqs.value->kind_case() == Value::kNumberValue) {
            v = std::min<int64_t>(512, 2 * static_cast<int64_t>(seqs.value->number_value()));
          }
          out.assumptions.push_back(absl::StrCat(
              "engine_knobs.cudagraph_capture_max not recorded: ", v,
              " (vLLM's default, min(2 x max_num_seqs, 512)); data-parallel ranks pad to one "
              "token count under CUDA graphs"));
        }
        if (eager.value == nullptr) {
          out.assumptions.push_back(
              "engine_knobs.enforce_eager not recorded: false (vLLM's default: CUDA graphs)");
        }
        sc.mutable_scheduler()->set_cuda_graph_max_tokens(v);
      }
    }
  } else {
    if (expert_parallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": expert parallelism is on but the model is dense (model.moe false)"));
    }
    cluster->set_replicas(static_cast<int32_t>(dp));  // data-parallel ranks, one engine each
  }
  if (const Value* n = Field(setup, "hardware.gpu_count");
      n != nullptr && n->kind_case() == Value::kNumberValue && n->number_value() != double(tp * dp)) {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": hardware.gpu_count is ",
                                                   Describe(n), " but parallelism tp x dp is ",
                                                   tp * dp));
  }

  // The engine: vLLM's v1 scheduler with its knobs.
  auto* s = sc.mutable_scheduler();
  s->set_batching(servesim::v1::BATCHING_POLICY_VLLM_V1);
  auto number = [&](const char* name, const Knob& k, double lo, double hi,
                    double* v) -> absl::Status {
    if (k.value->kind_case() != Value::kNumberValue || !(k.value->number_value() >= lo) ||
        !(k.value->number_value() <= hi)) {
      return absl::InvalidArgumentError(absl::StrCat(setup_path, ": engine_knobs.", name, " is ",
                                                     Describe(k.value), "; allowed range [", lo,
                                                     ", ", hi, "]"));
    }
    *v = k.value->number_value();
    return absl::OkStatus();
  };
  auto note_unrecorded = [&](const char* name, const Knob& k, const std::string& value) {
    if (!k.recorded) {
      out.assumptions.push_back(absl::StrCat("engine_knobs.", name, " = ", value,
                                             " assumed (not recorded by the run",
                                             k.basis.empty() ? "" : "; " + k.basis, ")"));
    }
  };
  for (auto [name, lo, hi, setter] :
       {std::tuple{"max_num_seqs", 1.0, 1e6, &servesim::v1::SchedulerSpec::set_max_batch_size},
        std::tuple{"max_num_batched_tokens", 1.0, 1e9,
                   &servesim::v1::SchedulerSpec::set_max_tokens_per_iteration}}) {
    const Knob k = ReadKnob(setup, name);
    if (k.value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": engine_knobs.", name,
          " is not recorded; the replay needs it (vLLM's default depends on the version and "
          "the GPU)"));
    }
    double v = 0;
    RETURN_IF_ERROR(number(name, k, lo, hi, &v));
    (s->*setter)(static_cast<int64_t>(v));
    note_unrecorded(name, k, absl::StrCat(v));
  }
  // Knobs with vLLM's defaults.
  {
    const Knob k = ReadKnob(setup, "block_size");
    double v = 16;
    if (k.value != nullptr) {
      RETURN_IF_ERROR(number("block_size", k, 1, 1024, &v));
      note_unrecorded("block_size", k, absl::StrCat(v));
    } else {
      out.assumptions.push_back("engine_knobs.block_size not recorded: 16 (vLLM's default)");
    }
    s->set_kv_block_tokens(static_cast<int64_t>(v));
  }
  {
    const Knob k = ReadKnob(setup, "gpu_memory_utilization");
    double v = 0.9;
    if (k.value != nullptr) {
      RETURN_IF_ERROR(number("gpu_memory_utilization", k, 0.01, 1, &v));
      note_unrecorded("gpu_memory_utilization", k, absl::StrCat(v));
    } else {
      out.assumptions.push_back(
          "engine_knobs.gpu_memory_utilization not recorded: 0.9 (vLLM's default)");
    }
    cluster->set_memory_utilization(v);
  }
  {
    const Knob k = ReadKnob(setup, "prefix_caching");
    bool on = true;
    if (k.value != nullptr && k.value->kind_case() == Value::kBoolValue) {
      on = k.value->bool_value();
      note_unrecorded("prefix_caching", k, on ? "true" : "false");
    } else if (k.value != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(setup_path, ": engine_knobs.prefix_caching is ",
                                                     Describe(k.value), "; expected true or false"));
    } else {
      out.assumptions.push_back(
          "engine_knobs.prefix_caching not recorded: true (vLLM v1's default)");
    }
    s->set_prefix_caching(on);
  }
  {
    const Knob k = ReadKnob(setup, "num_gpu_blocks");
    if (k.value != nullptr && k.value->kind_case() == Value::kNumberValue && k.recorded) {
      double v = 0;
      RETURN_IF_ERROR(number("num_gpu_blocks", k, 1, 1e9, &v));
      s->set_num_kv_blocks(static_cast<int64_t>(v));
    } else {
      out.assumptions.push_back(
          "engine_knobs.num_gpu_blocks not recorded: KV blocks from memory (weights, the "
          "profiling peak and the runtime reserve subtracted)");
    }
  }
  {
    const Knob k = ReadKnob(setup, "max_model_len");
    if (k.value != nullptr && k.value->kind_case() == Value::kNumberValue) {
      double v = 0;
      RETURN_IF_ERROR(number("max_model_len", k, 1, 1e8, &v));
      model->set_max_context_tokens(static_cast<int64_t>(v));
      note_unrecorded("max_model_len", k, absl::StrCat(v));
    } else {
      out.assumptions.push_back(
          "engine_knobs.max_model_len not recorded: the model's max_position_embeddings");
    }
  }
  {
    const Knob k = ReadKnob(setup, "long_prefill_token_threshold");
    if (k.value != nullptr) {
      double v = 0;
      RETURN_IF_ERROR(number("long_prefill_token_threshold", k, 0, 1e9, &v));
      s->set_long_prefill_token_threshold(static_cast<int64_t>(v));
    }
  }
  if (const Knob k = ReadKnob(setup, "chunked_prefill");
      k.value != nullptr && k.value->kind_case() == Value::kBoolValue && !k.value->bool_value()) {
    return absl::UnimplementedError(absl::StrCat(
        setup_path, ": engine_knobs.chunked_prefill is false; vLLM's v1 engine always chunks"));
  }
  if (const Knob k = ReadKnob(setup, "scheduler_policy");
      k.value != nullptr && k.value->kind_case() == Value::kStringValue &&
      k.value->string_value() != "fcfs") {
    return absl::UnimplementedError(absl::StrCat(setup_path, ": engine_knobs.scheduler_policy is ",
                                                 Describe(k.value), "; only fcfs is modelled"));
  }

  // The workload: trace.csv, with the prompts' token ids when the run's
  // workload file is beside the run, or the client's shared prefix.
  const std::string trace_path = fs::absolute(fs::path(run_dir) / "trace.csv").string();
  ASSIGN_OR_RETURN(const Table trace, ReadTable(trace_path));
  ASSIGN_OR_RETURN(const size_t t_arr, trace.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t t_in, trace.Column("input_tokens"));
  ASSIGN_OR_RETURN(const size_t t_out, trace.Column("output_tokens"));
  out.requests = static_cast<int64_t>(trace.rows.size());
  if (out.requests == 0) {
    return absl::InvalidArgumentError(absl::StrCat(trace_path, ": no requests"));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  auto* tr = sc.mutable_workload()->mutable_trace();
  out.workload_path = trace_path;
  tr->set_format(servesim::v1::TRACE_FORMAT_CSV);
  const Value* wfile = Field(setup, "workload.file");
  const std::string ids_path =
      FindBeside(run_dir, wfile != nullptr ? wfile->string_value() : std::string());
  int64_t shared_prefix = 0;
  if (const Value* yaml = Field(setup, "workload_profile_yaml");
      yaml != nullptr && yaml->kind_case() == Value::kStringValue) {
    for (absl::string_view line : absl::StrSplit(yaml->string_value(), '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (absl::ConsumePrefix(&line, "prefix_tokens:")) {
        (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &shared_prefix);
      }
    }
  }
  if (!ids_path.empty() && s->prefix_caching()) {
    ASSIGN_OR_RETURN(const std::string ids_text, ReadMaybeGzip(ids_path));
    std::string merged;
    size_t r = 0;
    int64_t line_no = 0;
    for (absl::string_view line : absl::StrSplit(ids_text, '\n')) {
      ++line_no;
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      if (r >= trace.rows.size()) {
        return absl::InvalidArgumentError(absl::StrCat(ids_path, ":", line_no, ": more requests "
                                                       "than ", trace_path, "'s ",
                                                       trace.rows.size()));
      }
      int64_t in = 0;
      ASSIGN_OR_RETURN(const double want_in, trace.Number(r, t_in));
      if (!JsonInt(line, "input_toks", &in) || in != static_cast<int64_t>(want_in)) {
        return absl::InvalidArgumentError(absl::StrCat(
            ids_path, ":", line_no, ": input_toks ", in, " but ", trace_path, ":", trace.lines[r],
            " has input_tokens ", trace.rows[r][t_in],
            "; the workload file does not match the run's trace"));
      }
      const absl::string_view ids = JsonArray(line, "input_tok_ids");
      ASSIGN_OR_RETURN(const double arrival, trace.Number(r, t_arr));
      ASSIGN_OR_RETURN(const double outputs, trace.Number(r, t_out));
      absl::StrAppendFormat(&merged,
                            "{\"input_toks\": %d, \"output_toks\": %d, \"arrival_time_ns\": %d%s%s}\n",
                            in, static_cast<int64_t>(outputs),
                            static_cast<int64_t>(std::llround(arrival * 1e9)),
                            ids.empty() ? "" : ", \"input_tok_ids\": ", ids);
      ++r;
    }
    if (r != trace.rows.size()) {
      return absl::InvalidArgumentError(absl::StrCat(ids_path, ": ", r, " requests but ",
                                                     trace_path, " has ", trace.rows.size()));
    }
    out.workload_path = fs::absolute(fs::path(out_dir) / "workload.jsonl").string();
    RETURN_IF_ERROR(WriteFile(out.workload_path, merged));
    tr->set_format(servesim::v1::TRACE_FORMAT_TOKEN_IDS);
    out.token_ids = true;
  } else if (shared_prefix > 0 && s->prefix_caching()) {
    // GuideLLM's synthetic data prepends one prefix of prefix_tokens tokens
    // to every prompt.
    std::string csv = "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n";
    for (size_t r = 0; r < trace.rows.size(); ++r) {
      ASSIGN_OR_RETURN(const double in, trace.Number(r, t_in));
      absl::StrAppend(&csv, trace.rows[r][t_arr], ",", trace.rows[r][t_in], ",",
                      trace.rows[r][t_out], ",0,",
                      std::min<int64_t>(shared_prefix, static_cast<int64_t>(in)), "\n");
    }
    out.workload_path = fs::absolute(fs::path(out_dir) / "trace.csv").string();
    RETURN_IF_ERROR(WriteFile(out.workload_path, csv));
    out.assumptions.push_back(absl::StrCat(
        "workload: every prompt starts with the one shared prefix of ", shared_prefix,
        " tokens (workload_profile_yaml prefix_tokens; GuideLLM prepends it to each prompt)"));
  } else if (s->prefix_caching()) {
    out.assumptions.push_back(
        wfile != nullptr && !wfile->string_value().empty()
            ? absl::StrCat("workload: ", fs::path(wfile->string_value()).filename().string(),
                           " (the prompts' token ids) not found beside the run: prefix caching "
                           "sees no shared prompts")
            : "workload: no token ids recorded: prefix caching sees no shared prompts");
  }
  tr->set_path(out.workload_path);

  // Outputs the comparison reads.
  auto* o = sc.mutable_output();
  o->set_requests_csv(true);
  o->set_iterations_csv(true);

  const std::string truth = (fs::path(run_dir) / "truth.csv").string();
  if (fs::is_regular_file(truth, ec)) out.truth_path = truth;
  for (const char* ts : {"timeseries.csv", "raw/timeseries.csv"}) {
    const std::string p = (fs::path(run_dir) / ts).string();
    if (out.timeseries_path.empty() && fs::is_regular_file(p, ec)) out.timeseries_path = p;
  }

  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.PrintToString(sc, &text);
  std::string header = absl::StrCat("# Written by `servesim replay ", run_dir,
                                    "` from its setup.json.\n");
  for (const std::string& a : out.assumptions) absl::StrAppend(&header, "# assumed: ", a, "\n");
  out.scenario_text = header + text;
  return out;
}

absl::StatusOr<std::vector<CompareRow>> CompareWithTruth(const std::string& truth_path,
                                                         const std::string& trace_path,
                                                         const std::string& requests_path) {
  ASSIGN_OR_RETURN(const Table truth, ReadTable(truth_path));
  ASSIGN_OR_RETURN(const Table trace, ReadTable(trace_path));
  ASSIGN_OR_RETURN(const Table sim, ReadTable(requests_path));
  if (truth.rows.size() != trace.rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(truth_path, ": ", truth.rows.size(),
                                                   " requests but ", trace_path, " has ",
                                                   trace.rows.size()));
  }
  ASSIGN_OR_RETURN(const size_t m_arr, truth.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t m_in, truth.Column("input_tokens"));
  ASSIGN_OR_RETURN(const size_t m_ttft, truth.Column("ttft_s"));
  ASSIGN_OR_RETURN(const size_t m_tpot, truth.Column("tpot_s"));
  ASSIGN_OR_RETURN(const size_t m_e2e, truth.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t m_tok, truth.Column("tokens"));
  ASSIGN_OR_RETURN(const size_t t_arr, trace.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t t_in, trace.Column("input_tokens"));
  ASSIGN_OR_RETURN(const size_t s_id, sim.Column("id"));
  ASSIGN_OR_RETURN(const size_t s_ttft, sim.Column("ttft_s"));
  ASSIGN_OR_RETURN(const size_t s_tpot, sim.Column("tpot_s"));
  ASSIGN_OR_RETURN(const size_t s_e2e, sim.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t s_out, sim.Column("output_tokens"));
  ASSIGN_OR_RETURN(const size_t s_fin, sim.Column("finish_s"));
  ASSIGN_OR_RETURN(const size_t s_status, sim.Column("status"));
  std::vector<double> mt, ms, me, st, ss, se;
  double m_tokens = 0, m_end = 0, s_tokens = 0, s_end = 0;
  for (size_t r = 0; r < truth.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double a, truth.Number(r, m_arr));
    ASSIGN_OR_RETURN(const double b, trace.Number(r, t_arr));
    ASSIGN_OR_RETURN(const double in_m, truth.Number(r, m_in));
    ASSIGN_OR_RETURN(const double in_t, trace.Number(r, t_in));
    if (std::fabs(a - b) > 1e-6 || in_m != in_t) {
      return absl::InvalidArgumentError(absl::StrCat(
          truth_path, ":", truth.lines[r], ": request ", truth.rows[r][0], " arrives at ",
          truth.rows[r][m_arr], " with ", truth.rows[r][m_in], " input tokens but ", trace_path,
          ":", trace.lines[r], " has ", trace.rows[r][t_arr], " and ", trace.rows[r][t_in],
          "; truth.csv must list the trace's requests in its order"));
    }
    ASSIGN_OR_RETURN(const double ttft, truth.Number(r, m_ttft));
    ASSIGN_OR_RETURN(const double e2e, truth.Number(r, m_e2e));
    ASSIGN_OR_RETURN(const double tokens, truth.Number(r, m_tok));
    mt.push_back(ttft);
    me.push_back(e2e);
    if (tokens > 1) {
      ASSIGN_OR_RETURN(const double tpot, truth.Number(r, m_tpot));
      ms.push_back(tpot);
    }
    m_tokens += tokens;
    m_end = std::max(m_end, a + e2e);
  }
  if (sim.rows.size() != truth.rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(requests_path, ": ", sim.rows.size(),
                                                   " requests but ", truth_path, " has ",
                                                   truth.rows.size()));
  }
  for (size_t r = 0; r < sim.rows.size(); ++r) {
    if (sim.rows[r][s_id] != absl::StrCat(r)) {
      return absl::InvalidArgumentError(absl::StrCat(requests_path, ":", sim.lines[r], ": id ",
                                                     sim.rows[r][s_id], "; expected ", r,
                                                     " (requests in arrival order)"));
    }
    if (sim.rows[r][s_status] != "done") {
      return absl::FailedPreconditionError(absl::StrCat(
          requests_path, ":", sim.lines[r], ": request ", r, " is ", sim.rows[r][s_status],
          " in the simulation but was served in the measured run"));
    }
    ASSIGN_OR_RETURN(const double ttft, sim.Number(r, s_ttft));
    ASSIGN_OR_RETURN(const double e2e, sim.Number(r, s_e2e));
    ASSIGN_OR_RETURN(const double tokens, sim.Number(r, s_out));
    ASSIGN_OR_RETURN(const double fin, sim.Number(r, s_fin));
    st.push_back(ttft);
    se.push_back(e2e);
    if (tokens > 1) {
      ASSIGN_OR_RETURN(const double tpot, sim.Number(r, s_tpot));
      ss.push_back(tpot);
    }
    s_tokens += tokens;
    s_end = std::max(s_end, fin);
  }
  std::vector<CompareRow> rows;
  for (auto [name, m, s] : {std::tuple{"ttft_s", &mt, &st}, std::tuple{"tpot_s", &ms, &ss},
                            std::tuple{"e2e_s", &me, &se}}) {
    const metrics::Distribution a = Dist(*m), b = Dist(*s);
    rows.push_back({name, "mean", a.mean, b.mean});
    rows.push_back({name, "p50", a.p50, b.p50});
    rows.push_back({name, "p90", a.p90, b.p90});
    rows.push_back({name, "p99", a.p99, b.p99});
  }
  rows.push_back({"makespan_s", "value", m_end, s_end});
  rows.push_back({"output_tokens_per_s", "value", m_end > 0 ? m_tokens / m_end : 0,
                  s_end > 0 ? s_tokens / s_end : 0});
  return rows;
}

std::string CompareCsv(const std::vector<CompareRow>& rows) {
  std::string out = "metric,stat,measured,simulated,error_pct\n";
  for (const CompareRow& r : rows) {
    absl::StrAppendFormat(&out, "%s,%s,%.6g,%.6g,%.2f\n", r.metric, r.stat, r.measured,
                          r.simulated, r.error_pct());
  }
  return out;
}

std::string CompareTable(const std::vector<CompareRow>& rows) {
  std::string out = absl::StrFormat("  %-20s %-6s %12s %12s %9s\n", "metric", "stat", "measured",
                                    "simulated", "error");
  for (const CompareRow& r : rows) {
    absl::StrAppendFormat(&out, "  %-20s %-6s %12.6g %12.6g %+8.1f%%\n", r.metric, r.stat,
                          r.measured, r.simulated, r.error_pct());
  }
  return out;
}

absl::StatusOr<std::string> E2eScatterSvg(const std::string& truth_path,
                                          const std::string& requests_path) {
  ASSIGN_OR_RETURN(const Table truth, ReadTable(truth_path));
  ASSIGN_OR_RETURN(const Table sim, ReadTable(requests_path));
  ASSIGN_OR_RETURN(const size_t m_e2e, truth.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t s_e2e, sim.Column("e2e_s"));
  reports::Series points{"requests", {}, {}, /*line=*/false};
  double hi = 0;
  for (size_t r = 0; r < truth.rows.size() && r < sim.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double m, truth.Number(r, m_e2e));
    ASSIGN_OR_RETURN(const double s, sim.Number(r, s_e2e));
    points.x.push_back(m);
    points.y.push_back(s);
    hi = std::max({hi, m, s});
  }
  reports::Series diagonal{"simulated = measured", {0, hi}, {0, hi}};
  return reports::LineChartSvg("End-to-end latency per request", "measured E2E (s)",
                               "simulated E2E (s)", {points, diagonal}, /*markers=*/true);
}

absl::StatusOr<std::string> QueueOverTimeSvg(const std::string& iterations_path,
                                             const std::string& timeseries_path) {
  ASSIGN_OR_RETURN(const Table it, ReadTable(iterations_path));
  ASSIGN_OR_RETURN(const Table ts, ReadTable(timeseries_path));
  ASSIGN_OR_RETURN(const size_t i_rep, it.Column("replica"));
  ASSIGN_OR_RETURN(const size_t i_start, it.Column("start_s"));
  ASSIGN_OR_RETURN(const size_t i_dur, it.Column("duration_s"));
  ASSIGN_OR_RETURN(const size_t i_batch, it.Column("batch_size"));
  ASSIGN_OR_RETURN(const size_t i_wait, it.Column("waiting"));
  ASSIGN_OR_RETURN(const size_t m_t, ts.Column("t"));
  ASSIGN_OR_RETURN(const size_t m_run, ts.Column("running"));
  ASSIGN_OR_RETURN(const size_t m_wait, ts.Column("waiting"));
  reports::Series m_running{"running, measured", {}, {}}, m_waiting{"waiting, measured", {}, {}};
  double t_end = 0;
  for (size_t r = 0; r < ts.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double t, ts.Number(r, m_t));
    ASSIGN_OR_RETURN(const double run, ts.Number(r, m_run));
    ASSIGN_OR_RETURN(const double wait, ts.Number(r, m_wait));
    m_running.x.push_back(t);
    m_running.y.push_back(run);
    m_waiting.x.push_back(t);
    m_waiting.y.push_back(wait);
    t_end = std::max(t_end, t);
  }
  // Per replica, the iterations' (start, end, running, waiting), in order.
  struct Step {
    double start, end, running, waiting;
  };
  std::map<std::string, std::vector<Step>> steps;
  for (size_t r = 0; r < it.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double start, it.Number(r, i_start));
    ASSIGN_OR_RETURN(const double dur, it.Number(r, i_dur));
    ASSIGN_OR_RETURN(const double batch, it.Number(r, i_batch));
    ASSIGN_OR_RETURN(const double wait, it.Number(r, i_wait));
    steps[it.rows[r][i_rep]].push_back({start, start + dur, batch, wait});
    t_end = std::max(t_end, start + dur);
  }
  reports::Series s_running{"running, simulated", {}, {}}, s_waiting{"waiting, simulated", {}, {}};
  for (double t = 1; t <= std::ceil(t_end); t += 1) {
    double run = 0, wait = 0;
    for (const auto& [replica, v] : steps) {
      // The step in progress at t (an idle engine holds no requests).
      auto after = std::upper_bound(v.begin(), v.end(), t,
                                    [](double x, const Step& s) { return x < s.start; });
      if (after == v.begin()) continue;
      const Step& s = *(after - 1);
      // Between steps: the last one's counts unless the engine went idle
      // (no step for longer than the last one took).
      const double next = after == v.end() ? INFINITY : after->start;
      if (t <= s.end || next - s.end <= std::max(s.end - s.start, 1e-3)) {
        run += s.running;
        wait += s.waiting;
      }
    }
    s_running.x.push_back(t);
    s_running.y.push_back(run);
    s_waiting.x.push_back(t);
    s_waiting.y.push_back(wait);
  }
  return reports::LineChartSvg("Requests running and waiting", "time (s)", "requests",
                               {m_running, s_running, m_waiting, s_waiting});
}

}  // namespace servesim::studies
