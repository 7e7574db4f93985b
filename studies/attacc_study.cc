#include "studies/attacc_study.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scenario/scenario.h"
#include "common/status_macros.h"
#include "devices/model.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "scheduler/placement.h"
#include "scheduler/planner.h"

namespace servesim::studies {
namespace {

using scenario::LoadedScenario;
using scenario::Normalize;
using scenario::ParseScenarioText;
using scenario::Resolve;
using scenario::ResolvedScenario;

struct System {
  const char* name;
  const char* policy;
  bool attacc;
  bool large;
  const char* overlap;
};

constexpr System kSystems[] = {
    {"dgx_base", "serial", false, false, ""},
    {"dgx_large", "serial", false, true, ""},
    {"dgx_attacc", "serial", true, false, "OVERLAP_POLICY_SERIAL"},
    {"dgx_attacc", "hl_pipe", true, false, "OVERLAP_POLICY_HEAD_LEVEL"},
    {"dgx_attacc", "hl_pipe_ff", true, false, "OVERLAP_POLICY_HEAD_LEVEL_FF"},
};

// Where the study follows the authors' simulator (scale-snu/
// attacc_simulator; docs/energy.md, "The AttAcc study"): the GPUs' on-die
// traffic and SM occupancy (src/devices.py; src/config.py ENERGY_TABLE['GPU']
// and the A100's geometry: L2 0.3 and L1 0.16 pJ/bit, 0.0675 pJ per
// register access, 108 SMs with 192 KiB of L1 each), no launch overhead on
// GEMMs and attention (their norm and activation fits keep fixed terms),
// 0.32 pJ per MAC (their ALU figure) at int8 as at fp16, and no busy power
// beyond the ops (the preset's active power and board-level FLOP energy,
// docs/energy.md, are not theirs).
constexpr const char* kAuthorsGpu =
    " flop_energy_pj: 0.16 int8_op_energy_pj: 0.16 active_power_w: 0"
    " roofline { op_class: \"gemm\" compute_utilization: 0.8 memory_utilization: 0.85 "
    "kernel_overhead_s: 0 }"
    " roofline { op_class: \"attention\" compute_utilization: 0.8 memory_utilization: 0.85 "
    "kernel_overhead_s: 0 }"
    " on_die { l2_pj_per_byte: 2.4 l1_pj_per_byte: 1.28 register_pj_per_access: 0.0675"
    " cores: 108 l1_bytes_per_core: 196608 occupancy_time: true }";

// MT-NLG 530B does not fit DGX_Base in fp16; the paper runs it in int8
// (§7.1).
bool Int8(const std::string& model) { return model == "mt-nlg-530b"; }

// The paper's DGX+AttAccs has 1,280 GB in all: the DGX's 640 GB hold the
// weights and the 40 AttAcc stacks "correspond to the rest" (§7.1), i.e.
// 1,280 GiB - weights. Rows per bank set each stack's capacity to that
// share (1,024 banks x 1 KiB rows per stack).
int64_t StackRowsForPaperCapacity(const std::string& model) {
  auto spec = devices::ModelPreset(model);
  if (!spec.ok()) return 16384;
  auto dims = devices::ModelDimsFromSpec(*spec);
  dims.bytes_per_element = Int8(model) ? 1 : 2;
  const double pool = 1280.0 * (1ull << 30) - dims.WeightBytes();
  return static_cast<int64_t>(pool / 40 / (1024.0 * 1024.0));
}

std::string ScenarioText(const std::string& model, const System& sys, int64_t max_batch,
                         const std::string& workload, const std::string& extra, bool authors,
                         int64_t ff_batch = 0) {
  std::string t = absl::StrCat("name: \"attacc study: ", model, " / ", sys.name, " / ", sys.policy,
                               "\"\n", "model { preset: \"", model,
                               "\" dtype: ", Int8(model) ? "DTYPE_INT8" : "DTYPE_FP16",
                               " max_context_tokens: 8192 }\n",
                               "cluster {\n  tensor_parallel: 8\n  memory_utilization: 1.0\n",
                               "  xpu { preset: \"a100-hbm3\"",
                               sys.large ? " memory_bytes: 171798691840" : "", kAuthorsGpu, " }\n");
  if (sys.attacc) {
    absl::StrAppend(&t, "  attacc { preset: \"attacc_bank\" stacks: 40 rows_per_bank: ",
                    StackRowsForPaperCapacity(model), " }\n  overlap: ", sys.overlap, "\n");
    if (authors) absl::StrAppend(&t, "  overlap_rule: OVERLAP_RULE_ATTACC_SIMULATOR\n");
    if (ff_batch > 0) {
      absl::StrAppend(&t, "  ff_min_batch: ", ff_batch, " ff_max_batch: ", ff_batch, "\n");
    }
  }
  absl::StrAppend(&t, "}\nscheduler { max_batch_size: ", max_batch, " }\n", workload, extra);
  return t;
}

absl::StatusOr<ResolvedScenario> ResolveText(const std::string& text) {
  ASSIGN_OR_RETURN(LoadedScenario sc, ParseScenarioText(text, "attacc-study"));
  RETURN_IF_ERROR(Normalize(&sc));
  return Resolve(sc);
}

// A point's devices and planner.
struct StudyPlanner {
  std::unique_ptr<devices::Device> xpu, attention;
  std::unique_ptr<scheduler::IterationPlanner> planner;

  static absl::StatusOr<std::unique_ptr<StudyPlanner>> Of(const ResolvedScenario& sc) {
    auto sp = std::make_unique<StudyPlanner>();
    ASSIGN_OR_RETURN(sp->xpu, devices::CreateDevice(sc.xpu_device));
    if (sc.has_attention_device) {
      ASSIGN_OR_RETURN(sp->attention, devices::CreateDevice(sc.attention_device));
    }
    scheduler::PlannerConfig pc = sc.planner;
    pc.xpu = sp->xpu.get();
    pc.attention = sp->attention.get();
    sp->planner = std::make_unique<scheduler::IterationPlanner>(sc.model, pc);
    return sp;
  }
};

// Requests of `tokens` tokens each that memory holds.
int64_t CapacityBatch(const ResolvedScenario& sc, int64_t tokens) {
  const int64_t per_request =
      (tokens + sc.batching.kv_block_tokens - 1) / sc.batching.kv_block_tokens;
  int64_t by_blocks = sc.kv.blocks / per_request;
  if (!sc.has_attention_device) return by_blocks;
  scheduler::StackPlacement placement(sc.batching.placement_stacks,
                                      sc.batching.placement_capacity_tokens,
                                      sc.batching.placement_kv_heads);
  int64_t n = 0;
  while (n < by_blocks && placement.Place(static_cast<int32_t>(n), tokens)) ++n;
  return n;
}

}  // namespace

int64_t AuthorsCapacityBatch(const std::string& model, const std::string& system, int64_t lin,
                             int64_t lout) {
  auto spec = devices::ModelPreset(model);
  if (!spec.ok()) return 0;
  const devices::ModelDims m = devices::ModelDimsFromSpec(*spec);
  const double b = Int8(model) ? 1 : 2;  // weights and activations (W8A8 or W16A16)
  const double h = static_cast<double>(m.d_model), heads = static_cast<double>(m.num_heads);
  const double ff = static_cast<double>(m.d_ff);
  const double weights = static_cast<double>(m.num_layers) * h *
                         (4 * h + (m.ff_kind == devices::FfKind::kSwiGlu ? 3 : 2) * ff) * b;
  const double l = static_cast<double>(lin + lout - 1);
  const double temp =
      std::max({(h + l * heads) * b, 2 * h * b, 2 * l * heads * b, (ff + h) * b}) + l * heads;
  const double kv = static_cast<double>(m.num_layers) * 2 * l * h * b;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  double capacity = 8 * 80 * gib;
  if (system == "dgx_large") capacity = 8 * 160 * gib;
  if (system == "dgx_attacc") capacity += 40 * 16 * gib;
  return std::max<int64_t>(0, static_cast<int64_t>(std::floor((capacity - weights) / (kv + temp))));
}

absl::StatusOr<std::vector<StudyPoint>> RunAttAccStudy(const StudyOptions& options) {
  const std::string saturated =
      "workload { saturated { num_requests: 1 input_tokens: 1 output_tokens: 1 } }\n";
  std::vector<StudyPoint> points;
  const bool authors = options.authors_rules;
  for (const std::string& model : options.models) {
    for (const System& sys : kSystems) {
      for (const auto& [lin, lout] : options.lengths) {
        // Capacity first, without FF partitions; with co-processing the
        // partitions are placed for the batch the point runs (its minimum
        // and maximum, §6.2), which costs the device some KV capacity:
        // iterate until the batch and the partitions agree.
        ASSIGN_OR_RETURN(ResolvedScenario probe,
                         ResolveText(ScenarioText(model, sys, 65536, saturated, "", authors)));
        const int64_t servesim_cap = CapacityBatch(probe, lin + lout);
        const int64_t authors_cap = AuthorsCapacityBatch(model, sys.name, lin, lout);
        int64_t cap = authors ? authors_cap : servesim_cap;
        for (int round = 0;
             round < 8 && !authors && std::string(sys.policy) == "hl_pipe_ff" && cap > 0;
             ++round) {
          ASSIGN_OR_RETURN(ResolvedScenario with_ff,
                           ResolveText(ScenarioText(model, sys, cap, saturated, "", authors, cap)));
          const int64_t next = CapacityBatch(with_ff, lin + lout);
          if (next == cap) break;
          cap = next;
        }
        if (cap < 1) {
          return absl::FailedPreconditionError(absl::StrCat(
              model, " on ", sys.name, ": no request of ", lin + lout, " tokens fits"));
        }
        ASSIGN_OR_RETURN(ResolvedScenario sc,
                         ResolveText(ScenarioText(model, sys, cap, saturated, "", authors,
                                                  std::string(sys.policy) == "hl_pipe_ff"
                                                      ? cap
                                                      : 0)));
        ASSIGN_OR_RETURN(std::unique_ptr<StudyPlanner> sp, StudyPlanner::Of(sc));
        const bool ff = std::string(sys.policy) == "hl_pipe_ff";
        // With co-processing a smaller batch places larger FF partitions
        // (f(b), §6.2), as the authors' simulator splits the FF for each
        // batch: the planner of batch b, or null where b requests no longer
        // fit beside its partitions.
        std::map<int64_t, std::unique_ptr<StudyPlanner>> ff_planners;
        const int64_t tokens = lin + lout;  // (a lambda may not capture a structured binding)
        auto planner_for = [&](int64_t b) -> absl::StatusOr<StudyPlanner*> {
          if (!ff || b == cap) return sp.get();
          auto it = ff_planners.find(b);
          if (it == ff_planners.end()) {
            ASSIGN_OR_RETURN(ResolvedScenario sb,
                             ResolveText(ScenarioText(model, sys, b, saturated, "", authors, b)));
            std::unique_ptr<StudyPlanner> pb;
            if (authors || CapacityBatch(sb, tokens) >= b) {
              ASSIGN_OR_RETURN(pb, StudyPlanner::Of(sb));
            }
            it = ff_planners.emplace(b, std::move(pb)).first;
          }
          return it->second.get();
        };
        // The authors count FF co-processing's energy as if the GPUs ran the
        // whole FF (their _ff_parallel shortens the FF layers' time after
        // their energy is taken): the same batch planned without it.
        std::unique_ptr<StudyPlanner> no_ff;
        if (ff) {
          ASSIGN_OR_RETURN(ResolvedScenario hl, ResolveText(ScenarioText(model, kSystems[3], cap,
                                                                         saturated, "", authors)));
          ASSIGN_OR_RETURN(no_ff, StudyPlanner::Of(hl));
        }
        const int64_t l_avg = lin + lout / 2;
        for (double slo_ms : options.slos_ms) {
          StudyPoint p;
          p.model = model;
          p.system = sys.name;
          p.policy = sys.policy;
          p.lin = lin;
          p.lout = lout;
          p.slo_ms = slo_ms;
          p.capacity_batch = authors ? servesim_cap : cap;
          p.capacity_batch_authors = authors_cap;
          p.max_batch = cap;
          p.batch_bound = "capacity";
          if (slo_ms > 0) {
            // The largest batch whose step meets the SLO, scanning down from
            // the capacity batch: SM occupancy makes the step time jump
            // up and down with the batch, so a bisection could stop short.
            int64_t b = cap;
            for (; b >= 1; --b) {
              ASSIGN_OR_RETURN(StudyPlanner * pb, planner_for(b));
              if (pb == nullptr) continue;
              ASSIGN_OR_RETURN(scheduler::IterationCost c,
                               pb->planner->Plan(scheduler::UniformBatch(b, 1, l_avg - 1)));
              if (c.time_s <= slo_ms * 1e-3) break;
            }
            if (b < cap) {
              p.max_batch = b;
              p.batch_bound = "slo";
            }
          }
          if (p.max_batch >= 1) {
            ASSIGN_OR_RETURN(StudyPlanner * pb, planner_for(p.max_batch));
            scheduler::IterationPlanner& planner = *pb->planner;
            ASSIGN_OR_RETURN(scheduler::IterationCost d,
                             planner.Plan(scheduler::UniformBatch(p.max_batch, 1, l_avg - 1)));
            p.tbt_ms = d.time_s * 1e3;
            p.throughput_tokens_per_s = static_cast<double>(p.max_batch) / d.time_s;
            p.energy_j_per_token_ff_rereads =
                d.total.energy_pj() * 1e-12 / static_cast<double>(p.max_batch);
            p.energy_j_per_token = p.energy_j_per_token_ff_rereads;
            if (ff) {
              ASSIGN_OR_RETURN(
                  scheduler::IterationCost gpu_ff,
                  no_ff->planner->Plan(scheduler::UniformBatch(p.max_batch, 1, l_avg - 1)));
              p.energy_j_per_token =
                  gpu_ff.total.energy_pj() * 1e-12 / static_cast<double>(p.max_batch);
            }
            ASSIGN_OR_RETURN(scheduler::IterationCost pre,
                             planner.Plan(scheduler::UniformBatch(p.max_batch, lin, 0)));
            p.prefill_s = pre.time_s;
            p.e2e_throughput_tokens_per_s =
                static_cast<double>(p.max_batch * lout) /
                (pre.time_s + static_cast<double>(lout) * d.time_s);
          } else {
            // Not even one request meets the SLO.
            p.batch_bound = "slo";
          }
          points.push_back(p);
        }
      }
    }
  }
  return points;
}

std::string StudyCsv(const std::vector<StudyPoint>& points) {
  std::string csv =
      "model,system,policy,lin,lout,slo_ms,max_batch,batch_bound,throughput_tokens_per_s,"
      "tbt_ms,energy_j_per_token,capacity_batch,prefill_s,e2e_throughput_tokens_per_s,"
      "capacity_batch_authors,energy_j_per_token_ff_rereads\n";
  for (const StudyPoint& p : points) {
    absl::StrAppendFormat(&csv, "%s,%s,%s,%d,%d,%s,%d,%s,%.6g,%.6g,%.6g,%d,%.6g,%.6g,%d,%.6g\n",
                          p.model, p.system, p.policy, p.lin, p.lout,
                          p.slo_ms > 0 ? absl::StrFormat("%g", p.slo_ms) : "", p.max_batch,
                          p.batch_bound, p.throughput_tokens_per_s, p.tbt_ms, p.energy_j_per_token,
                          p.capacity_batch, p.prefill_s, p.e2e_throughput_tokens_per_s,
                          p.capacity_batch_authors, p.energy_j_per_token_ff_rereads);
  }
  return csv;
}

std::string StudyTable(const std::vector<StudyPoint>& points) {
  // Baselines per (model, lengths, slo).
  using Key = std::tuple<std::string, int64_t, int64_t, double>;
  std::map<Key, const StudyPoint*> base, large;
  for (const StudyPoint& p : points) {
    const auto key = std::make_tuple(p.model, p.lin, p.lout, p.slo_ms);
    if (p.system == "dgx_base") base[key] = &p;
    if (p.system == "dgx_large") large[key] = &p;
  }
  std::string t = absl::StrFormat(
      "%-12s %-11s %-11s %5s %5s %4s %6s %-8s %10s %8s %8s %7s %7s %8s\n", "model", "system",
      "policy", "L_in", "L_out", "SLO", "batch", "bound", "tokens/s", "TBT ms", "J/token",
      "xBase", "xLarge", "e2e xB");
  for (const StudyPoint& p : points) {
    const Key key = std::make_tuple(p.model, p.lin, p.lout, p.slo_ms);
    auto ratio = [&](const std::map<Key, const StudyPoint*>& m,
                     double StudyPoint::*field) {
      auto it = m.find(key);
      return it == m.end() || it->second->*field <= 0
                 ? std::string("-")
                 : absl::StrFormat("%.2f", p.*field / (it->second->*field));
    };
    absl::StrAppendFormat(
        &t, "%-12s %-11s %-11s %5d %5d %4s %6d %-8s %10.1f %8.2f %8.3f %7s %7s %8s\n", p.model,
        p.system, p.policy, p.lin, p.lout, p.slo_ms > 0 ? absl::StrFormat("%g", p.slo_ms) : "-",
        p.max_batch, p.batch_bound, p.throughput_tokens_per_s, p.tbt_ms, p.energy_j_per_token,
        ratio(base, &StudyPoint::throughput_tokens_per_s),
        ratio(large, &StudyPoint::throughput_tokens_per_s),
        ratio(base, &StudyPoint::e2e_throughput_tokens_per_s));
  }
  return t;
}

absl::StatusOr<std::vector<StudyTraceRun>> RunAttAccTraceStudy(
    const StudyOptions& options, const std::string& servesim_binary,
    const std::string& trace_path, const std::string& work_dir) {
  std::vector<StudyTraceRun> rows;
  // The first `trace_window_s` seconds of the trace (default 10 minutes:
  // every system, 15 runs, in about a minute of wall time).
  const std::string workload =
      absl::StrCat("workload { trace { path: \"", trace_path, "\" } window_end_s: ",
                   options.trace_window_s, " }\n");
  const std::string slo = "slo { ttft_s: 2.0 tpot_s: 0.05 }\n";
  for (const std::string& model : options.models) {
    for (const System& sys : kSystems) {
      const std::string name = absl::StrCat(model, "_", sys.name, "_", sys.policy);
      const std::string scenario = absl::StrCat(work_dir, "/", name, ".pbtxt");
      const std::string out = absl::StrCat(work_dir, "/", name);
      {
        std::ofstream f(scenario);
        f << ScenarioText(model, sys, 256, workload, slo, options.authors_rules);
        if (!f) return absl::UnavailableError(absl::StrCat(scenario, ": cannot write"));
      }
      const std::string cmd = absl::StrCat("'", servesim_binary, "' run '", scenario,
                                           "' --quiet --out '", out,
                                           "' --set output.iterations_csv=false");
      const int status = std::system(cmd.c_str());
      if (status != 0) {
        return absl::InternalError(absl::StrCat("trace run failed (status ", status,
                                                "): ", cmd));
      }
      std::ifstream in(out + "/summary.json");
      std::stringstream ss;
      ss << in.rdbuf();
      rows.push_back({model, sys.name, sys.policy, ss.str()});
    }
  }
  return rows;
}

namespace {

// Reads a number from summary.json: "key": N, or "outer": {... "key": N ...}.
double JsonNumber(const std::string& json, const std::string& outer, const std::string& key) {
  size_t pos = 0;
  if (!outer.empty()) {
    pos = json.find("\"" + outer + "\": {");
    if (pos == std::string::npos) return 0;
  }
  pos = json.find("\"" + key + "\": ", pos);
  if (pos == std::string::npos) return 0;
  return std::strtod(json.c_str() + pos + key.size() + 4, nullptr);
}

struct TraceFigures {
  double done, throughput, tbt_p50, tbt_p99, ttft_p50, slo, energy, batch;
};

TraceFigures Figures(const StudyTraceRun& r) {
  const std::string& j = r.summary_json;
  return {JsonNumber(j, "", "requests_completed"), JsonNumber(j, "", "throughput_tokens_per_s"),
          JsonNumber(j, "tbt_s", "p50") * 1e3, JsonNumber(j, "tbt_s", "p99") * 1e3,
          JsonNumber(j, "ttft_s", "p50"), JsonNumber(j, "", "slo_attainment"),
          JsonNumber(j, "", "energy_per_token_j"), JsonNumber(j, "", "batch_size_mean")};
}

}  // namespace

std::string TraceStudyTable(const std::vector<StudyTraceRun>& rows) {
  std::string t = absl::StrFormat("%-12s %-11s %-11s %6s %10s %9s %9s %9s %7s %8s %7s\n",
                                  "model", "system", "policy", "done", "tokens/s", "TBT p50",
                                  "TBT p99", "TTFT p50", "SLO %", "J/token", "batch");
  for (const StudyTraceRun& r : rows) {
    const TraceFigures f = Figures(r);
    absl::StrAppendFormat(&t, "%-12s %-11s %-11s %6.0f %10.1f %9.2f %9.2f %9.3f %7.2f %8.3f %7.2f\n",
                          r.model, r.system, r.policy, f.done, f.throughput, f.tbt_p50,
                          f.tbt_p99, f.ttft_p50, 100 * f.slo, f.energy, f.batch);
  }
  return t;
}

std::string TraceStudyCsv(const std::vector<StudyTraceRun>& rows) {
  std::string csv =
      "model,system,policy,requests_completed,throughput_tokens_per_s,tbt_p50_ms,tbt_p99_ms,"
      "ttft_p50_s,slo_attainment,energy_j_per_token,batch_size_mean\n";
  for (const StudyTraceRun& r : rows) {
    const TraceFigures f = Figures(r);
    absl::StrAppendFormat(&csv, "%s,%s,%s,%.0f,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", r.model,
                          r.system, r.policy, f.done, f.throughput, f.tbt_p50, f.tbt_p99,
                          f.ttft_p50, f.slo, f.energy, f.batch);
  }
  return csv;
}

}  // namespace servesim::studies
