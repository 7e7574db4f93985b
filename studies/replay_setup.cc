// Mapping a measured vLLM run to a scenario (PrepareReplay, studies/
// replay.h): setup.json's engine, model, dtype, GPU, parallelism and engine
// knobs become the scenario's model and xPU presets (or the recorded
// architecture), its cluster and vLLM v1 scheduler; the workload step
// (studies/replay_workload.h) then points it at the trace.
//
// Each step checks its part of setup.json in the order a reader meets it
// and fails naming the file and the field; what the run did not record and
// the replay assumed is noted in ReplaySetup::assumptions. --set overrides
// for model.preset, model.dtype or cluster.xpu.preset stand in for the
// fields they replace.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

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
#include "servesim/v1/scenario.pb.h"
#include "studies/replay.h"
#include "studies/replay_files.h"
#include "studies/replay_workload.h"

namespace servesim::studies {
namespace {

namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;
using replay_internal::ReadFile;

// -------------------------------------------------------------- setup.json ----

const Value* Field(const Struct& s, absl::string_view path) {
  return replay_internal::JsonField(s, path);
}

std::string Describe(const Value* v) {
  if (v == nullptr) return "absent";
  switch (v->kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return absl::StrFormat("%g", v->number_value());
    case Value::kStringValue:
      return absl::StrCat("\"", v->string_value(), "\"");
    case Value::kBoolValue:
      return v->bool_value() ? "true" : "false";
    default:
      return "an object";
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

// The JSON type each field servesim reads must have; null (or absent)
// always means "not recorded". A value of another type is an error naming
// the field, never taken for "not recorded".
enum Kind { kNumber, kString, kBool };
struct Typed {
  const char* path;
  Kind kind;
};
constexpr Typed kSetupTypes[] = {
    {"engine", kString},
    {"run", kString},
    {"dtype", kString},
    {"kv_cache_dtype", kString},
    {"workload_profile_yaml", kString},
    {"workload.profile_yaml", kString},
    {"workload.file", kString},
    {"model.name", kString},
    {"model.hidden_act", kString},
    {"model.moe", kBool},
    {"model.tie_word_embeddings", kBool},
    {"model.qk_norm", kBool},
    {"model.max_position_embeddings", kNumber},
    {"model.num_layers", kNumber},
    {"model.hidden_size", kNumber},
    {"model.num_attention_heads", kNumber},
    {"model.num_kv_heads", kNumber},
    {"model.head_dim", kNumber},
    {"model.ffn_intermediate_size", kNumber},
    {"model.vocab_size", kNumber},
    {"model.num_experts", kNumber},
    {"model.n_routed_experts", kNumber},
    {"model.num_local_experts", kNumber},
    {"model.num_experts_per_tok", kNumber},
    {"model.experts_per_token", kNumber},
    {"model.top_k", kNumber},
    {"model.moe_intermediate_size", kNumber},
    {"model.expert_intermediate_size", kNumber},
    {"model.n_shared_experts", kNumber},
    {"model.shared_experts", kNumber},
    {"model.first_k_dense_replace", kNumber},
    {"model.dense_layers", kNumber},
    {"hardware.gpu.name", kString},
    {"hardware.gpu.note", kString},
    {"hardware.gpu.memory_GB", kNumber},
    {"hardware.gpu_count", kNumber},
    {"parallelism.tp", kNumber},
    {"parallelism.dp", kNumber},
    {"parallelism.pp", kNumber},
    {"parallelism.ep", kNumber},
    {"parallelism.enable_expert_parallel", kBool},
};
// engine_knobs.NAME: a scalar, or {"value": scalar, "recorded": bool, "basis":
// string}, where an unrecorded value may be a note in words.
constexpr Typed kKnobTypes[] = {
    {"enforce_eager", kBool},   {"cudagraph_capture_max", kNumber},
    {"max_num_seqs", kNumber},  {"max_num_batched_tokens", kNumber},
    {"block_size", kNumber},    {"gpu_memory_utilization", kNumber},
    {"prefix_caching", kBool},  {"num_gpu_blocks", kNumber},
    {"max_model_len", kNumber}, {"long_prefill_token_threshold", kNumber},
    {"chunked_prefill", kBool}, {"scheduler_policy", kString},
    {"disable_custom_all_reduce", kBool},
};

absl::Status CheckType(const Value* v, Kind kind, absl::string_view path,
                       const std::string& setup_path) {
  if (v == nullptr || v->kind_case() == Value::kNullValue) return absl::OkStatus();
  const Value::KindCase want = kind == kNumber   ? Value::kNumberValue
                               : kind == kString ? Value::kStringValue
                                                 : Value::kBoolValue;
  if (v->kind_case() == want) {
    if (kind == kNumber && !std::isfinite(v->number_value())) {
      return absl::InvalidArgumentError(
          absl::StrCat(setup_path, ": ", path, " is not a finite number"));
    }
    return absl::OkStatus();
  }
  const char* name = kind == kNumber ? "a number" : kind == kString ? "a string" : "true or false";
  return absl::InvalidArgumentError(absl::StrCat(setup_path, ": ", path, " is ", Describe(v),
                                                 "; expected ", name, " (or null: not recorded)"));
}

absl::Status CheckSetupTypes(const Struct& setup, const std::string& setup_path) {
  for (const Typed& t : kSetupTypes) {
    RETURN_IF_ERROR(CheckType(Field(setup, t.path), t.kind, t.path, setup_path));
  }
  for (const Typed& t : kKnobTypes) {
    const std::string path = absl::StrCat("engine_knobs.", t.path);
    const Value* v = Field(setup, path);
    if (v != nullptr && v->kind_case() == Value::kStructValue) {
      // An unrecorded knob's value may be a note ("model max (not
      // recorded)"): read as not recorded.
      const Value* recorded = Field(setup, path + ".recorded");
      const Value* value = Field(setup, path + ".value");
      const bool note = recorded != nullptr && recorded->kind_case() == Value::kBoolValue &&
                        !recorded->bool_value() && value != nullptr &&
                        value->kind_case() == Value::kStringValue;
      if (!note) RETURN_IF_ERROR(CheckType(value, t.kind, path + ".value", setup_path));
      RETURN_IF_ERROR(
          CheckType(Field(setup, path + ".recorded"), kBool, path + ".recorded", setup_path));
      RETURN_IF_ERROR(
          CheckType(Field(setup, path + ".basis"), kString, path + ".basis", setup_path));
    } else {
      RETURN_IF_ERROR(CheckType(v, t.kind, path, setup_path));
    }
  }
  return absl::OkStatus();
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

// Recorded architecture fields -> ModelSpec setters.
struct Dim {
  const char* field;
  int64_t (servesim::v1::ModelSpec::*get)() const;
  void (servesim::v1::ModelSpec::*set)(int64_t);
};
const Dim kModelDims[] = {
    {"num_layers", &servesim::v1::ModelSpec::num_layers, &servesim::v1::ModelSpec::set_num_layers},
    {"hidden_size", &servesim::v1::ModelSpec::d_model, &servesim::v1::ModelSpec::set_d_model},
    {"num_attention_heads", &servesim::v1::ModelSpec::num_heads,
     &servesim::v1::ModelSpec::set_num_heads},
    {"num_kv_heads", &servesim::v1::ModelSpec::num_kv_heads,
     &servesim::v1::ModelSpec::set_num_kv_heads},
    {"head_dim", &servesim::v1::ModelSpec::d_head, &servesim::v1::ModelSpec::set_d_head},
    {"ffn_intermediate_size", &servesim::v1::ModelSpec::d_ff, &servesim::v1::ModelSpec::set_d_ff},
    {"vocab_size", &servesim::v1::ModelSpec::vocab_size, &servesim::v1::ModelSpec::set_vocab_size},
};

// The model preset whose hf_name is `hf` (case aside); "" if none.
std::string PresetOfHfName(const std::string& hf) {
  std::string preset;
  for (const std::string& p : devices::ModelPresetNames()) {
    auto spec = devices::ModelPreset(p);
    if (spec.ok() && absl::EqualsIgnoreCase(spec->hf_name(), hf)) preset = p;
  }
  return preset;
}

// The recorded architecture must agree with the preset's.
absl::Status CheckAgainstPreset(const Struct& setup, const std::string& setup_path,
                                const std::string& hf, bool moe, const std::string& preset) {
  const servesim::v1::ModelSpec spec = *devices::ModelPreset(preset);
  for (const Dim& d : kModelDims) {
    const Value* v = Field(setup, absl::StrCat("model.", d.field));
    if (v == nullptr || v->kind_case() != Value::kNumberValue) continue;
    // An MoE model's FF width may be recorded as its experts'.
    const bool expert_width = spec.num_experts() > 0 &&
                              d.set == &servesim::v1::ModelSpec::set_d_ff &&
                              static_cast<int64_t>(v->number_value()) == spec.expert_d_ff();
    if (static_cast<int64_t>(v->number_value()) != (spec.*d.get)() && !expert_width) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": model.", d.field, " is ", Describe(v), " but preset ", preset, " (", hf,
          ") has ", (spec.*d.get)(), "; give the model explicitly with --set model.*"));
    }
  }
  if (moe != (spec.num_experts() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(setup_path, ": model.moe is ", moe ? "true" : "false", " but preset ", preset,
                     " (", hf, ") is ", spec.num_experts() > 0 ? "a mixture of experts" : "dense"));
  }
  return absl::OkStatus();
}

// The recorded dimensions; an error lists every one missing.
absl::Status SetRecordedDims(const Struct& setup, const std::string& setup_path,
                             const std::string& hf, servesim::v1::ModelSpec* out) {
  std::vector<std::string> missing;
  for (const Dim& d : kModelDims) {
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
        ") and ", absl::StrJoin(missing, ", "), missing.size() == 1 ? " is" : " are",
        " not recorded; give --set model.preset=NAME or the model's dimensions"));
  }
  return absl::OkStatus();
}

// The feed-forward kind from model.hidden_act (silu when absent).
absl::Status SetFfKind(const Struct& setup, const std::string& setup_path,
                       servesim::v1::ModelSpec* out) {
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
  return absl::OkStatus();
}

// A mixture of experts' experts as recorded.
absl::Status SetRecordedExperts(const Struct& setup, const std::string& setup_path,
                                servesim::v1::ModelSpec* out) {
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
  return absl::OkStatus();
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
  const std::string preset = PresetOfHfName(hf);
  if (!preset.empty()) {
    RETURN_IF_ERROR(CheckAgainstPreset(setup, setup_path, hf, moe, preset));
    out->set_preset(preset);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(SetRecordedDims(setup, setup_path, hf, out));
  out->set_name(hf);
  out->set_hf_name(hf);
  RETURN_IF_ERROR(SetFfKind(setup, setup_path, out));
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
  if (moe) RETURN_IF_ERROR(SetRecordedExperts(setup, setup_path, out));
  notes->push_back(
      absl::StrCat("model ", hf, ": no preset; dimensions from setup.json's model block"));
  return absl::OkStatus();
}

// ------------------------------------------------------ PrepareReplay's steps ----

// The engine (vLLM's alone) and the scenario's name.
absl::Status MapEngine(const Struct& setup, const std::string& setup_path,
                       const std::string& run_dir, servesim::v1::Scenario* sc) {
  const Value* engine = Field(setup, "engine");
  if (engine == nullptr || !absl::EqualsIgnoreCase(engine->string_value(), "vllm")) {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": engine is ", Describe(engine),
                                                   "; servesim replays vLLM runs (\"vLLM\")"));
  }
  const Value* run_name = Field(setup, "run");
  sc->set_name(absl::StrCat("replay of ", run_name != nullptr && !run_name->string_value().empty()
                                              ? run_name->string_value()
                                              : fs::path(run_dir).filename().string()));
  return absl::OkStatus();
}

// The model (from setup.json unless --set model.preset names it), its
// dtype and the KV cache's.
absl::Status MapModelAndDtype(const Struct& setup, const std::string& setup_path,
                              const std::vector<std::string>& sets, servesim::v1::ModelSpec* model,
                              std::vector<std::string>* assumptions) {
  if (!SetsUnder(sets, "model.preset="))
    RETURN_IF_ERROR(MapModel(setup, setup_path, model, assumptions));
  const Value* dtype = Field(setup, "dtype");
  const std::string dt = dtype != nullptr ? absl::AsciiStrToLower(dtype->string_value()) : "";
  if (dt == "bfloat16" || dt == "bf16") {
    model->set_dtype(servesim::v1::DTYPE_BF16);
  } else if (dt == "float16" || dt == "fp16" || dt == "half") {
    model->set_dtype(servesim::v1::DTYPE_FP16);
  } else if (!SetsUnder(sets, "model.dtype")) {
    return absl::InvalidArgumentError(
        absl::StrCat(setup_path, ": dtype is ", Describe(dtype),
                     "; expected bfloat16 or float16 (or give --set model.dtype=DTYPE_BF16)"));
  }
  if (const Value* kv = Field(setup, "kv_cache_dtype");
      kv != nullptr && kv->kind_case() == Value::kStringValue && kv->string_value() != "auto") {
    return absl::UnimplementedError(
        absl::StrCat(setup_path, ": kv_cache_dtype is ", Describe(kv),
                     "; only \"auto\" (the model's dtype) is modelled"));
  }
  return absl::OkStatus();
}

// The GPU's xPU preset, unless --set cluster.xpu.preset names it.
absl::Status MapGpu(const Struct& setup, const std::string& setup_path,
                    const std::vector<std::string>& sets, servesim::v1::ClusterSpec* cluster) {
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
        gpu->string_value(),
        mem != nullptr && mem->kind_case() == Value::kNumberValue ? mem->number_value() : 0.0);
    if (preset.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(setup_path, ": hardware.gpu.name \"", gpu->string_value(),
                       "\" is no xPU preset's; give --set cluster.xpu.preset=PRESET (known: ",
                       absl::StrJoin(devices::XpuPresetNames(), ", "), ") or the xPU's figures"));
    }
    cluster->mutable_xpu()->set_preset(preset);
  }
  return absl::OkStatus();
}

// One parallelism degree as recorded: 1, and an assumption, when absent.
absl::Status ReadParallelism(const Struct& setup, const std::string& setup_path, const char* name,
                             int64_t* v, std::vector<std::string>* assumptions) {
  const Value* p = Field(setup, absl::StrCat("parallelism.", name));
  *v = 1;
  if (p == nullptr || p->kind_case() == Value::kNullValue) {
    assumptions->push_back(absl::StrCat("parallelism.", name, " not recorded: 1"));
    return absl::OkStatus();
  }
  if (p->kind_case() != Value::kNumberValue || !(p->number_value() >= 1) ||
      p->number_value() != std::floor(p->number_value())) {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": parallelism.", name, " is ",
                                                   Describe(p), "; expected an integer >= 1"));
  }
  *v = static_cast<int64_t>(p->number_value());
  return absl::OkStatus();
}

// The CUDA-graph padding of an MoE model's data-parallel ranks.
void MapCudaGraphPadding(const Struct& setup, servesim::v1::Scenario* sc,
                         std::vector<std::string>* assumptions) {
  // The ranks pad to one token count when the step runs under CUDA
  // graphs (vLLM's default unless enforce_eager).
  const Knob eager = ReadKnob(setup, "enforce_eager");
  if (eager.value != nullptr && eager.value->kind_case() == Value::kBoolValue &&
      eager.value->bool_value()) {
    sc->mutable_scheduler()->set_cuda_graph_max_tokens(0);
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
      assumptions->push_back(absl::StrCat(
          "engine_knobs.cudagraph_capture_max not recorded: ", v,
          " (vLLM's default, min(2 x max_num_seqs, 512)); data-parallel ranks pad to one "
          "token count under CUDA graphs"));
    }
    if (eager.value == nullptr) {
      assumptions->push_back(
          "engine_knobs.enforce_eager not recorded: false (vLLM's default: CUDA graphs)");
    }
    sc->mutable_scheduler()->set_cuda_graph_max_tokens(v);
  }
}

// Tensor, data and expert parallelism as vLLM runs them (no pipeline
// parallelism), checked against the GPU count.
absl::Status MapParallelism(const Struct& setup, const std::string& setup_path,
                            servesim::v1::Scenario* sc, std::vector<std::string>* assumptions) {
  auto* cluster = sc->mutable_cluster();
  const servesim::v1::ModelSpec& model = sc->model();
  int64_t tp = 1, dp = 1, pp = 1, ep = 1;
  RETURN_IF_ERROR(ReadParallelism(setup, setup_path, "tp", &tp, assumptions));
  RETURN_IF_ERROR(ReadParallelism(setup, setup_path, "dp", &dp, assumptions));
  RETURN_IF_ERROR(ReadParallelism(setup, setup_path, "pp", &pp, assumptions));
  RETURN_IF_ERROR(ReadParallelism(setup, setup_path, "ep", &ep, assumptions));
  if (pp > 1) {
    return absl::UnimplementedError(absl::StrCat(setup_path, ": parallelism.pp is ", pp,
                                                 "; pipeline parallelism is not modelled"));
  }
  bool moe_model = false;
  if (const Value* moe = Field(setup, "model.moe");
      moe != nullptr && moe->kind_case() == Value::kBoolValue) {
    moe_model = moe->bool_value();
  } else if (!model.preset().empty()) {
    moe_model = devices::ModelPreset(model.preset()).ok() &&
                devices::ModelPreset(model.preset())->num_experts() > 0;
  }
  const Value* ep_flag = Field(setup, "parallelism.enable_expert_parallel");
  const bool expert_parallel =
      ep > 1 ||
      (ep_flag != nullptr && ep_flag->kind_case() == Value::kBoolValue && ep_flag->bool_value());
  cluster->set_tensor_parallel(static_cast<int32_t>(tp));
  if (tp * dp > 1) {
    // Collectives as vLLM calls them (docs/collectives.md): the measured
    // tables of the GPUs' link class, and its custom all-reduce unless the
    // run turned it off (--disable-custom-all-reduce).
    cluster->mutable_collectives()->set_preset("auto");
    const Knob custom = ReadKnob(setup, "disable_custom_all_reduce");
    if (custom.value != nullptr && custom.value->kind_case() == Value::kBoolValue) {
      cluster->mutable_collectives()->set_custom_all_reduce(!custom.value->bool_value());
    } else {
      assumptions->push_back(
          "engine_knobs.disable_custom_all_reduce not recorded: false (vLLM's default: its "
          "custom all-reduce where the GPUs reach each other)");
    }
  }
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
    if (dp > 1) MapCudaGraphPadding(setup, sc, assumptions);
  } else {
    if (expert_parallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          setup_path, ": expert parallelism is on but the model is dense (model.moe false)"));
    }
    cluster->set_replicas(static_cast<int32_t>(dp));  // data-parallel ranks, one engine each
  }
  if (const Value* n = Field(setup, "hardware.gpu_count"); n != nullptr &&
                                                           n->kind_case() == Value::kNumberValue &&
                                                           n->number_value() != double(tp * dp)) {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": hardware.gpu_count is ",
                                                   Describe(n), " but parallelism tp x dp is ",
                                                   tp * dp));
  }
  return absl::OkStatus();
}

// An engine knob's number, within [lo, hi].
absl::Status KnobNumber(const std::string& setup_path, const char* name, const Knob& k, double lo,
                        double hi, double* v) {
  if (k.value->kind_case() != Value::kNumberValue || !(k.value->number_value() >= lo) ||
      !(k.value->number_value() <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat(setup_path, ": engine_knobs.", name, " is ",
                                                   Describe(k.value), "; allowed range [", lo, ", ",
                                                   hi, "]"));
  }
  *v = k.value->number_value();
  return absl::OkStatus();
}

// Notes a knob's value that the run did not record itself.
void NoteUnrecorded(const char* name, const Knob& k, const std::string& value,
                    std::vector<std::string>* assumptions) {
  if (!k.recorded) {
    assumptions->push_back(absl::StrCat("engine_knobs.", name, " = ", value,
                                        " assumed (not recorded by the run",
                                        k.basis.empty() ? "" : "; " + k.basis, ")"));
  }
}

// max_num_seqs and max_num_batched_tokens: the replay needs them.
absl::Status MapBatchLimits(const Struct& setup, const std::string& setup_path,
                            servesim::v1::SchedulerSpec* s, std::vector<std::string>* assumptions) {
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
    RETURN_IF_ERROR(KnobNumber(setup_path, name, k, lo, hi, &v));
    (s->*setter)(static_cast<int64_t>(v));
    NoteUnrecorded(name, k, absl::StrCat(v), assumptions);
  }
  return absl::OkStatus();
}

// The knobs with vLLM's defaults, each noted when assumed.
absl::Status MapDefaultedKnobs(const Struct& setup, const std::string& setup_path,
                               servesim::v1::Scenario* sc, std::vector<std::string>* assumptions) {
  auto* s = sc->mutable_scheduler();
  auto* model = sc->mutable_model();
  auto* cluster = sc->mutable_cluster();
  {
    const Knob k = ReadKnob(setup, "block_size");
    double v = 16;
    if (k.value != nullptr) {
      RETURN_IF_ERROR(KnobNumber(setup_path, "block_size", k, 1, 1024, &v));
      NoteUnrecorded("block_size", k, absl::StrCat(v), assumptions);
    } else {
      assumptions->push_back("engine_knobs.block_size not recorded: 16 (vLLM's default)");
    }
    s->set_kv_block_tokens(static_cast<int64_t>(v));
  }
  {
    const Knob k = ReadKnob(setup, "gpu_memory_utilization");
    double v = 0.9;
    if (k.value != nullptr) {
      RETURN_IF_ERROR(KnobNumber(setup_path, "gpu_memory_utilization", k, 0.01, 1, &v));
      NoteUnrecorded("gpu_memory_utilization", k, absl::StrCat(v), assumptions);
    } else {
      assumptions->push_back(
          "engine_knobs.gpu_memory_utilization not recorded: 0.9 (vLLM's default)");
    }
    cluster->set_memory_utilization(v);
  }
  {
    const Knob k = ReadKnob(setup, "prefix_caching");
    bool on = true;
    if (k.value != nullptr && k.value->kind_case() == Value::kBoolValue) {
      on = k.value->bool_value();
      NoteUnrecorded("prefix_caching", k, on ? "true" : "false", assumptions);
    } else if (k.value != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(setup_path, ": engine_knobs.prefix_caching is ", Describe(k.value),
                       "; expected true or false"));
    } else {
      assumptions->push_back("engine_knobs.prefix_caching not recorded: true (vLLM v1's default)");
    }
    s->set_prefix_caching(on);
  }
  {
    const Knob k = ReadKnob(setup, "num_gpu_blocks");
    if (k.value != nullptr && k.value->kind_case() == Value::kNumberValue && k.recorded) {
      double v = 0;
      RETURN_IF_ERROR(KnobNumber(setup_path, "num_gpu_blocks", k, 1, 1e9, &v));
      s->set_num_kv_blocks(static_cast<int64_t>(v));
    } else {
      assumptions->push_back(
          "engine_knobs.num_gpu_blocks not recorded: KV blocks from memory (weights, the "
          "profiling peak and the runtime reserve subtracted)");
    }
  }
  {
    const Knob k = ReadKnob(setup, "max_model_len");
    if (k.value != nullptr && k.value->kind_case() == Value::kNumberValue) {
      double v = 0;
      RETURN_IF_ERROR(KnobNumber(setup_path, "max_model_len", k, 1, 1e8, &v));
      model->set_max_context_tokens(static_cast<int64_t>(v));
      NoteUnrecorded("max_model_len", k, absl::StrCat(v), assumptions);
    } else {
      assumptions->push_back(
          "engine_knobs.max_model_len not recorded: the model's max_position_embeddings");
    }
  }
  {
    const Knob k = ReadKnob(setup, "long_prefill_token_threshold");
    if (k.value != nullptr) {
      double v = 0;
      RETURN_IF_ERROR(KnobNumber(setup_path, "long_prefill_token_threshold", k, 0, 1e9, &v));
      s->set_long_prefill_token_threshold(static_cast<int64_t>(v));
    }
  }
  return absl::OkStatus();
}

// Knobs set to what servesim does not model.
absl::Status CheckUnmodelledKnobs(const Struct& setup, const std::string& setup_path) {
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
  return absl::OkStatus();
}

// The one shared prefix GuideLLM's synthetic data prepends to every prompt
// (workload_profile_yaml's prefix_tokens); 0: none.
int64_t SharedPrefixTokens(const Struct& setup) {
  int64_t shared_prefix = 0;
  const Value* yaml = Field(setup, "workload_profile_yaml");
  if (yaml == nullptr) yaml = Field(setup, "workload.profile_yaml");
  if (yaml != nullptr && yaml->kind_case() == Value::kStringValue) {
    for (absl::string_view line : absl::StrSplit(yaml->string_value(), '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (absl::ConsumePrefix(&line, "prefix_tokens:")) {
        (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &shared_prefix);
      }
    }
  }
  return shared_prefix;
}

}  // namespace

absl::StatusOr<ReplaySetup> PrepareReplay(const std::string& run_dir, const std::string& out_dir,
                                          const std::vector<std::string>& sets,
                                          const ReplayOptions& options) {
  const BuiltWorkload* built = options.built;
  const std::string setup_path = (fs::path(run_dir) / "setup.json").string();
  ASSIGN_OR_RETURN(const std::string json, ReadFile(setup_path));
  Struct setup;
  if (auto st = google::protobuf::util::JsonStringToMessage(json, &setup); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(setup_path, ": not a JSON object: ", std::string(st.message())));
  }
  RETURN_IF_ERROR(CheckSetupTypes(setup, setup_path));
  ReplaySetup out;
  servesim::v1::Scenario sc;

  RETURN_IF_ERROR(MapEngine(setup, setup_path, run_dir, &sc));
  RETURN_IF_ERROR(MapModelAndDtype(setup, setup_path, sets, sc.mutable_model(), &out.assumptions));
  RETURN_IF_ERROR(MapGpu(setup, setup_path, sets, sc.mutable_cluster()));
  RETURN_IF_ERROR(MapParallelism(setup, setup_path, &sc, &out.assumptions));

  // The engine: vLLM's v1 scheduler with its knobs.
  sc.mutable_scheduler()->set_batching(servesim::v1::BATCHING_POLICY_VLLM_V1);
  RETURN_IF_ERROR(MapBatchLimits(setup, setup_path, sc.mutable_scheduler(), &out.assumptions));
  RETURN_IF_ERROR(MapDefaultedKnobs(setup, setup_path, &sc, &out.assumptions));
  RETURN_IF_ERROR(CheckUnmodelledKnobs(setup, setup_path));

  // The workload: trace.csv, with the prompts' token ids when the run's
  // workload file is beside the run, or the client's shared prefix.
  replay_internal::WorkloadSource source;
  source.run_dir = run_dir;
  source.out_dir = out_dir;
  const Value* wfile = Field(setup, "workload.file");
  source.workload_file = wfile != nullptr ? wfile->string_value() : std::string();
  source.shared_prefix = SharedPrefixTokens(setup);
  source.workloads_dir = options.workloads_dir;
  if (built != nullptr) {
    source.trace_path = built->trace_path;
    source.trace_note = built->note;
    if (built->max_in_flight > 0) sc.mutable_workload()->set_max_in_flight(built->max_in_flight);
  }
  RETURN_IF_ERROR(replay_internal::PrepareWorkload(source, &sc, &out));

  // Outputs the comparison reads.
  auto* o = sc.mutable_output();
  o->set_requests_csv(true);
  o->set_iterations_csv(true);

  std::error_code ec;
  const std::string truth = (fs::path(run_dir) / "truth.csv").string();
  if (fs::is_regular_file(truth, ec)) out.truth_path = truth;
  for (const char* ts : {"timeseries.csv", "raw/timeseries.csv"}) {
    const std::string p = (fs::path(run_dir) / ts).string();
    if (out.timeseries_path.empty() && fs::is_regular_file(p, ec)) out.timeseries_path = p;
  }

  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.PrintToString(sc, &text);
  std::string header =
      absl::StrCat("# Written by `servesim replay ", run_dir, "` from its setup.json.\n");
  if (!out.workload_note.empty()) absl::StrAppend(&header, "# workload: ", out.workload_note, "\n");
  for (const std::string& a : out.assumptions) absl::StrAppend(&header, "# assumed: ", a, "\n");
  out.scenario_text = header + text;
  return out;
}

}  // namespace servesim::studies
