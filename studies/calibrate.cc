#include "studies/calibrate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "scheduler/planner.h"

namespace servesim::studies {
namespace {

using devices::Cost;
using devices::Op;
using devices::Stage;

// The GPU device at unit efficiency and no overhead, remembering what the
// planner asked of it: an op's cost is then its pure FLOPs and bytes.
class RecordingDevice : public devices::Device {
 public:
  explicit RecordingDevice(std::unique_ptr<devices::Device> inner) : inner_(std::move(inner)) {}
  devices::DeviceDescription Describe() const override { return inner_->Describe(); }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    RETURN_IF_ERROR(inner_->Estimate(ops, costs));
    for (size_t i = 0; i < ops.size(); ++i) seen_.push_back({ops[i].stage, costs[i]});
    return absl::OkStatus();
  }
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override {
    return inner_->Execute(call);
  }
  struct Seen {
    Stage stage;
    Cost cost;
  };
  // The first op of `stage` since Clear(); null if none.
  const Cost* First(Stage stage) const {
    for (const Seen& s : seen_) {
      if (s.stage == stage) return &s.cost;
    }
    return nullptr;
  }
  void Clear() { seen_.clear(); }

 private:
  std::unique_ptr<devices::Device> inner_;
  mutable std::vector<Seen> seen_;
};

struct Point {
  double flops, bytes, time_s;
};

struct Fit {
  double eta_c = 1, eta_m = 1, overhead = 0, sse = INFINITY;
};

// The overhead >= 0 minimising sum ((r_i + o) / t_i - 1)^2, and that sum.
Fit FitOverhead(const std::vector<Point>& pts, double peak, double bw, double eta_c,
                double eta_m) {
  double num = 0, den = 0;
  for (const Point& p : pts) {
    const double r = std::max(p.flops / (peak * eta_c), p.bytes / (bw * eta_m));
    num += (p.time_s - r) / (p.time_s * p.time_s);
    den += 1 / (p.time_s * p.time_s);
  }
  Fit f{eta_c, eta_m, std::max(0.0, num / den), 0};
  for (const Point& p : pts) {
    const double r = std::max(p.flops / (peak * eta_c), p.bytes / (bw * eta_m));
    const double e = (r + f.overhead) / p.time_s - 1;
    f.sse += e * e;
  }
  return f;
}

// Efficiencies on a grid 0.02 apart (memory up to max_m), then 0.002
// apart around the best. `memory_only`: compute held at 1 (elementwise
// ops, which are bandwidth-bound: their FLOPs never limit them).
Fit FitClass(const std::vector<Point>& pts, double peak, double bw, double max_m,
             bool memory_only) {
  Fit best;
  const int steps_m = static_cast<int>(std::lround(max_m / 0.02));
  for (int i = memory_only ? 50 : 1; i <= 50; ++i) {
    for (int j = 1; j <= steps_m; ++j) {
      const Fit f = FitOverhead(pts, peak, bw, 0.02 * i, 0.02 * j);
      if (f.sse < best.sse) best = f;
    }
  }
  const Fit coarse = best;
  for (int i = memory_only ? 0 : -10; i <= (memory_only ? 0 : 10); ++i) {
    for (int j = -10; j <= 10; ++j) {
      const double c = coarse.eta_c + 0.002 * i, m = coarse.eta_m + 0.002 * j;
      if (c <= 0 || c > 1 + 1e-12 || m <= 0 || m > max_m + 1e-12) continue;
      const Fit f = FitOverhead(pts, peak, bw, std::min(c, 1.0), m);
      if (f.sse < best.sse) best = f;
    }
  }
  return best;
}

// |t_fit / t - 1| statistics under (eta_c, eta_m, overhead).
void Errors(const std::vector<Point>& pts, double peak, double bw, double eta_c, double eta_m,
            double overhead, double* mean, double* p90, double* max) {
  std::vector<double> e;
  e.reserve(pts.size());
  for (const Point& p : pts) {
    const double r = std::max(p.flops / (peak * eta_c), p.bytes / (bw * eta_m)) + overhead;
    e.push_back(std::fabs(r / p.time_s - 1));
  }
  std::sort(e.begin(), e.end());
  double sum = 0;
  for (double v : e) sum += v;
  *mean = e.empty() ? 0 : sum / static_cast<double>(e.size());
  if (p90 != nullptr) {
    const double k = 0.9 * static_cast<double>(e.size() - 1);
    const size_t lo = static_cast<size_t>(k);
    const size_t hi = std::min(lo + 1, e.size() - 1);
    *p90 = e.empty() ? 0 : e[lo] + (k - static_cast<double>(lo)) * (e[hi] - e[lo]);
  }
  if (max != nullptr) *max = e.empty() ? 0 : e.back();
}

}  // namespace

absl::StatusOr<std::vector<RooflineFit>> CalibrateRoofline(const devices::GpuProfile& profile,
                                                           const devices::ModelDims& model,
                                                           int64_t tp,
                                                           const servesim::v1::XpuSpec& xpu) {
  const bool int8 = model.dtype == servesim::v1::DTYPE_INT8;
  const double peak = int8 ? xpu.peak_flops_int8() : xpu.peak_flops_fp16();
  const double bw = xpu.memory_bw_bytes_per_s();
  if (!(peak > 0) || !(bw > 0)) {
    return absl::InvalidArgumentError("calibrate: the xPU needs its peak FLOP/s and bandwidth");
  }
  servesim::v1::DeviceSpec spec;
  auto* gpu = spec.mutable_gpu();
  *gpu->mutable_xpu() = xpu;
  gpu->mutable_xpu()->set_compute_utilization(1);
  gpu->mutable_xpu()->set_memory_utilization(1);
  gpu->mutable_xpu()->set_kernel_overhead_s(0);
  ASSIGN_OR_RETURN(*gpu->mutable_interconnect(), devices::LinkPreset("nvlink4"));
  gpu->set_dtype(model.dtype);
  ASSIGN_OR_RETURN(std::unique_ptr<devices::Device> inner, devices::CreateDevice(spec));
  RecordingDevice device(std::move(inner));
  scheduler::IterationPlanner planner(model, tp, &device);

  std::map<std::string, std::vector<Point>> classes;
  // Dense layers and the LM head: the planner's op of the matching stage.
  struct Layer {
    const char* name;
    Stage stage;
    const char* op_class;
  };
  const Layer dense[] = {
      {"qkv_proj", Stage::kQkv, "gemm"},         {"o_proj", Stage::kProjection, "gemm"},
      {"gate_up_proj", Stage::kFf1, "gemm"},     {"down_proj", Stage::kFf2, "gemm"},
      {"layernorm", Stage::kNorm, "norm"},       {"final_layernorm", Stage::kFinalNorm, "norm"},
      {"act_fn", Stage::kActivation, "activation"}, {"embedding", Stage::kEmbedding, "embedding"},
  };
  for (const Layer& l : dense) {
    const devices::ProfileCurve* c = profile.Dense(l.name);
    if (c == nullptr) continue;
    for (size_t i = 0; i < c->x.size(); ++i) {
      if (!(c->t[i] > 0)) continue;
      device.Clear();
      ASSIGN_OR_RETURN(auto cost, planner.Plan(scheduler::UniformBatch(
                                      1, static_cast<int64_t>(c->x[i]), 0)));
      (void)cost;
      const Cost* op = device.First(l.stage);
      if (op == nullptr) continue;
      classes[l.op_class].push_back({op->flops, op->dram_bytes, c->t[i]});
    }
  }
  if (const devices::ProfileCurve* c = profile.PerSequence("lm_head"); c != nullptr) {
    for (size_t i = 0; i < c->x.size(); ++i) {
      if (!(c->t[i] > 0)) continue;
      device.Clear();
      ASSIGN_OR_RETURN(auto cost, planner.Plan(scheduler::UniformBatch(
                                      static_cast<int64_t>(c->x[i]), 1, 16)));
      (void)cost;
      if (const Cost* op = device.First(Stage::kLmHead); op != nullptr) {
        classes["gemm"].push_back({op->flops, op->dram_bytes, c->t[i]});
      }
    }
  }
  // Attention: one op per measured row, shaped as the planner shapes it.
  {
    std::vector<devices::AttentionSeq> seqs;
    for (const auto& a : profile.attention_points()) {
      if (!(a.time_s > 0)) continue;
      seqs.clear();
      if (a.prefill_chunk > 0) {
        seqs.push_back({static_cast<int64_t>(a.prefill_chunk), static_cast<int64_t>(a.kv_prefill),
                        -1});
      }
      for (int64_t i = 0; i < static_cast<int64_t>(a.n_decode); ++i) {
        seqs.push_back({1, static_cast<int64_t>(a.kv_decode), -1});
      }
      if (seqs.empty()) continue;
      Op op;
      op.kind = devices::OpKind::kAttention;
      op.stage = Stage::kAttention;
      op.heads = planner.heads_per_xpu();
      op.kv_heads = planner.kv_heads_per_xpu();
      op.d_head = model.d_head;
      op.seqs = seqs;
      Cost cost;
      RETURN_IF_ERROR(device.Estimate(absl::MakeConstSpan(&op, 1), absl::MakeSpan(&cost, 1)));
      classes["attention"].push_back({cost.flops, cost.dram_bytes, a.time_s});
    }
    device.Clear();
  }

  std::vector<RooflineFit> out;
  for (const char* name : {"gemm", "attention", "norm", "activation", "embedding"}) {
    auto it = classes.find(name);
    if (it == classes.end() || it->second.empty()) continue;
    const std::vector<Point>& pts = it->second;
    // GEMMs within (0, 1]; the rest may beat device memory
    // (their operands stay in the on-chip cache).
    const bool elementwise = std::string(name) != "gemm" && std::string(name) != "attention";
    const Fit f = FitClass(pts, peak, bw, elementwise ? 4.0 : 1.0, elementwise);
    RooflineFit r;
    r.op_class = name;
    r.points = static_cast<int64_t>(pts.size());
    r.compute_utilization = f.eta_c;
    r.memory_utilization = f.eta_m;
    r.kernel_overhead_s = f.overhead;
    Errors(pts, peak, bw, f.eta_c, f.eta_m, f.overhead, &r.mean_error, &r.p90_error,
           &r.max_error);
    Errors(pts, peak, bw, xpu.compute_utilization(), xpu.memory_utilization(),
           xpu.kernel_overhead_s(), &r.uncalibrated_mean_error, nullptr, nullptr);
    out.push_back(r);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        profile.dir(), ": no layer the roofline models (qkv_proj, o_proj, gate_up_proj, "
                       "down_proj, lm_head, attention, layernorm, act_fn, embedding)"));
  }
  return out;
}

std::string CalibrationTable(const std::vector<RooflineFit>& fits) {
  std::string out = absl::StrFormat("  %-12s %7s %8s %8s %10s %9s %9s %9s %13s\n", "class",
                                    "points", "compute", "memory", "overhead", "mean err",
                                    "p90 err", "max err", "uncalibrated");
  for (const RooflineFit& f : fits) {
    absl::StrAppendFormat(&out, "  %-12s %7d %8.3f %8.3f %8.2fus %8.1f%% %8.1f%% %8.1f%% %12.1f%%\n",
                          f.op_class, f.points, f.compute_utilization, f.memory_utilization,
                          f.kernel_overhead_s * 1e6, 100 * f.mean_error, 100 * f.p90_error,
                          100 * f.max_error, 100 * f.uncalibrated_mean_error);
  }
  return out;
}

std::string CalibrationPbtxt(const std::string& source, const servesim::v1::XpuSpec& xpu,
                             const std::vector<RooflineFit>& fits) {
  std::string out = absl::StrFormat(
      "# servesim calibrate %s: the roofline's caps per op class, fitted to the\n"
      "# bundle's kernels. Paste into a scenario's cluster { } for models this GPU\n"
      "# has no profile of (docs/profiles.md).\n"
      "xpu {\n  preset: \"%s\"\n",
      source, xpu.preset());
  for (const RooflineFit& f : fits) {
    absl::StrAppendFormat(&out,
                          "  roofline {  # mean |error| %.1f%%, p90 %.1f%% over %d kernels\n"
                          "    op_class: \"%s\"\n    compute_utilization: %.3f\n"
                          "    memory_utilization: %.3f\n    kernel_overhead_s: %.3g\n  }\n",
                          100 * f.mean_error, 100 * f.p90_error, f.points, f.op_class,
                          f.compute_utilization, f.memory_utilization, f.kernel_overhead_s);
  }
  return out + "}\n";
}

}  // namespace servesim::studies
