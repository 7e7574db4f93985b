#include "devices/gpu/gpu_device.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "devices/gpu/on_die.h"
#include "devices/model.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"

namespace servesim::devices {
namespace {

// Finite as well: the agent's Describe path reaches here without the
// scenario's checks, and an infinite figure would make costs NaN.
absl::Status Positive(double v, absl::string_view field) {
  if (!(v > 0) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu device: ", field, " = ", v, "; expected > 0"));
  }
  return absl::OkStatus();
}

absl::Status Fraction(double v, absl::string_view field) {
  if (!(v > 0 && v <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu device: ", field, " = ", v, "; expected in (0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> GpuDevice::Create(
    const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_gpu()) {
    return absl::InvalidArgumentError("gpu device: DeviceSpec.gpu is not set");
  }
  const auto& x = spec.gpu().xpu();
  const auto& l = spec.gpu().interconnect();
  const bool int8 = spec.gpu().dtype() == servesim::v1::DTYPE_INT8;
  for (auto [v, name] : {std::pair{x.peak_flops_fp16(), "xpu.peak_flops_fp16"},
                         {x.memory_bytes(), "xpu.memory_bytes"},
                         {x.memory_bw_bytes_per_s(), "xpu.memory_bw_bytes_per_s"},
                         {l.bandwidth_bytes_per_s(), "interconnect.bandwidth_bytes_per_s"}}) {
    if (absl::Status s = Positive(v, name); !s.ok()) return s;
  }
  if (int8) {
    if (absl::Status s = Positive(x.peak_flops_int8(), "xpu.peak_flops_int8"); !s.ok()) return s;
  }
  if (spec.gpu().xpus_per_node() < 0 || spec.gpu().xpus_per_node() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu device: xpus_per_node = ", spec.gpu().xpus_per_node(), "; expected 0..1024"));
  }
  if (spec.gpu().xpus_per_node() > 0) {
    const auto& n = spec.gpu().internode();
    if (absl::Status s = Positive(n.bandwidth_bytes_per_s(), "internode.bandwidth_bytes_per_s");
        !s.ok()) {
      return s;
    }
    for (auto [v, name] : {std::pair{n.latency_s(), "internode.latency_s"},
                           {n.energy_pj_per_byte(), "internode.energy_pj_per_byte"}}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("gpu device: ", name, " = ", v, "; expected >= 0"));
      }
    }
  }
  for (auto [v, name] : {std::pair{x.compute_utilization(), "xpu.compute_utilization"},
                         {x.memory_utilization(), "xpu.memory_utilization"}}) {
    if (absl::Status s = Fraction(v, name); !s.ok()) return s;
  }
  for (auto [v, name] : {std::pair{x.kernel_overhead_s(), "xpu.kernel_overhead_s"},
                         {x.dram_energy_pj_per_byte(), "xpu.dram_energy_pj_per_byte"},
                         {x.flop_energy_pj(), "xpu.flop_energy_pj"},
                         {x.int8_op_energy_pj(), "xpu.int8_op_energy_pj"},
                         {l.latency_s(), "interconnect.latency_s"},
                         {l.energy_pj_per_byte(), "interconnect.energy_pj_per_byte"}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu device: ", name, " = ", v, "; expected >= 0"));
    }
  }
  if (x.has_on_die()) {
    const auto& e = x.on_die();
    for (auto [v, name] : {std::pair{e.l2_pj_per_byte(), "xpu.on_die.l2_pj_per_byte"},
                           {e.l1_pj_per_byte(), "xpu.on_die.l1_pj_per_byte"},
                           {e.register_pj_per_access(), "xpu.on_die.register_pj_per_access"}}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("gpu device: ", name, " = ", v, "; expected >= 0"));
      }
    }
    if (e.cores() < 1 || e.cores() > 100000) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu device: xpu.on_die.cores = ", e.cores(), "; expected 1..100000"));
    }
    if (!(e.l1_bytes_per_core() >= 1024 && e.l1_bytes_per_core() <= 1073741824.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu device: xpu.on_die.l1_bytes_per_core = ", e.l1_bytes_per_core(),
                       "; expected 1024..1073741824 (1 KiB..1 GiB)"));
    }
  }
  {
    std::vector<std::string> seen;
    for (const auto& r : x.roofline()) {
      static constexpr const char* kClasses[] = {"gemm", "attention", "norm", "activation",
                                                 "embedding"};
      if (std::find(std::begin(kClasses), std::end(kClasses), r.op_class()) ==
          std::end(kClasses)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gpu device: xpu.roofline.op_class = \"", r.op_class(),
            "\"; expected gemm, attention, norm, activation or embedding"));
      }
      if (std::find(seen.begin(), seen.end(), r.op_class()) != seen.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gpu device: xpu.roofline lists op_class \"", r.op_class(), "\" twice"));
      }
      seen.push_back(r.op_class());
      if (!(r.compute_utilization() > 0 && r.compute_utilization() <= 1) ||
          !(r.memory_utilization() > 0 && r.memory_utilization() <= 4) ||
          !(r.kernel_overhead_s() >= 0 && r.kernel_overhead_s() < 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gpu device: xpu.roofline \"", r.op_class(), "\": compute_utilization ",
            r.compute_utilization(), " (allowed (0, 1]), memory_utilization ",
            r.memory_utilization(), " (allowed (0, 4]), kernel_overhead_s ",
            r.kernel_overhead_s(), " (allowed [0, 1))"));
      }
    }
  }
  auto device = std::unique_ptr<GpuDevice>(new GpuDevice(spec.gpu()));
  if (absl::Status s = device->InitCollectives(); !s.ok()) return s;
  if (spec.gpu().has_profile() && !spec.gpu().profile().dir().empty()) {
    const auto& ref = spec.gpu().profile();
    auto profile = GpuProfile::Get(ref.dir());
    if (!profile.ok()) {
      return absl::Status(profile.status().code(),
                          absl::StrCat("gpu device: profile: ", profile.status().message()));
    }
    if (!ref.fingerprint().empty() && ref.fingerprint() != (*profile)->fingerprint()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gpu device: profile ", ref.dir(), " has fingerprint ", (*profile)->fingerprint(),
          " here but ", ref.fingerprint(), " where the run was set up: the bundle's files "
          "differ, so the costs would too; give this host the same files"));
    }
    device->profile_ = *std::move(profile);
  }
  return std::unique_ptr<Device>(std::move(device));
}

GpuDevice::GpuDevice(const servesim::v1::GpuDeviceSpec& spec) : spec_(spec) {
  const auto& x = spec_.xpu();
  const bool int8 = spec_.dtype() == servesim::v1::DTYPE_INT8;
  const bool fp8 = spec_.dtype() == servesim::v1::DTYPE_FP8;
  // INT8 (W8A8) runs every kernel at the 8-bit rate; FP8 its GEMMs (with
  // FP8 tensor cores; weight-only FP8 otherwise) and the rest at 16 bits.
  const bool fp8_cores = fp8 && x.peak_flops_fp8() > 0;
  const double peak = int8 ? x.peak_flops_int8() : x.peak_flops_fp16();
  const double gemm_peak = fp8_cores ? x.peak_flops_fp8() : peak;
  const double energy = int8 ? x.int8_op_energy_pj() : x.flop_energy_pj();
  const double gemm_energy = fp8_cores ? x.int8_op_energy_pj() : energy;
  for (int cls = 0; cls < kNumOpClasses; ++cls) {
    const bool gemm = cls == kGemmClass;
    caps_[cls] = {(gemm ? gemm_peak : peak) * x.compute_utilization(),
                  x.memory_bw_bytes_per_s() * x.memory_utilization(), x.kernel_overhead_s(),
                  gemm ? gemm_energy : energy};
  }
  for (const auto& r : x.roofline()) {
    const OpClass cls = r.op_class() == "gemm"         ? kGemmClass
                        : r.op_class() == "attention"  ? kAttentionClass
                        : r.op_class() == "norm"       ? kNormClass
                        : r.op_class() == "activation" ? kActivationClass
                                                       : kEmbeddingClass;
    caps_[cls] = {(cls == kGemmClass ? gemm_peak : peak) * r.compute_utilization(),
                  x.memory_bw_bytes_per_s() * r.memory_utilization(), r.kernel_overhead_s(),
                  caps_[cls].energy_pj};
  }
  w_bytes_ = static_cast<double>(DTypeBytes(spec_.dtype()));
  a_bytes_ = int8 ? 1 : 2;
  kv_bytes_ = static_cast<double>(DTypeBytes(ResolvedKvDType(spec_.dtype(), spec_.kv_dtype())));
  lm_head_bytes_ = fp8 ? 2 : w_bytes_;
  expert_w_bytes_ = DTypeWeightBytes(ResolvedExpertDType(spec_.dtype(), spec_.expert_dtype()));
}

DeviceDescription GpuDevice::Describe() const {
  const auto& x = spec_.xpu();
  DeviceDescription d;
  d.kind = "gpu";
  d.preset = x.preset();
  d.memory_bytes = x.memory_bytes();
  d.lookahead_ok = true;  // pure
  d.static_power_w = x.idle_power_w();  // one xPU; its ops' energy comes on top
  d.accepts = {OpKind::kGemm, OpKind::kAttention, OpKind::kElementwise, OpKind::kAllReduce,
               OpKind::kMoe};
  d.parameters = {
      {"peak_flops_fp16", x.peak_flops_fp16()},
      {"peak_flops_int8", x.peak_flops_int8()},
      {"memory_bytes", x.memory_bytes()},
      {"memory_bw_bytes_per_s", x.memory_bw_bytes_per_s()},
      {"compute_utilization", x.compute_utilization()},
      {"memory_utilization", x.memory_utilization()},
      {"kernel_overhead_s", x.kernel_overhead_s()},
      {"dram_energy_pj_per_byte", x.dram_energy_pj_per_byte()},
      {"flop_energy_pj", x.flop_energy_pj()},
      {"int8_op_energy_pj", x.int8_op_energy_pj()},
      {"interconnect_bandwidth_bytes_per_s", spec_.interconnect().bandwidth_bytes_per_s()},
      {"interconnect_latency_s", spec_.interconnect().latency_s()},
      {"element_bytes", w_bytes_},
      {"kv_element_bytes", kv_bytes_},
  };
  if (x.has_on_die()) {
    const auto& e = x.on_die();
    d.parameters.push_back({"on_die_l2_pj_per_byte", e.l2_pj_per_byte()});
    d.parameters.push_back({"on_die_l1_pj_per_byte", e.l1_pj_per_byte()});
    d.parameters.push_back({"on_die_register_pj_per_access", e.register_pj_per_access()});
    d.parameters.push_back({"on_die_cores", static_cast<double>(e.cores())});
    d.parameters.push_back({"on_die_l1_bytes_per_core", e.l1_bytes_per_core()});
    d.parameters.push_back({"on_die_occupancy_time", e.occupancy_time() ? 1.0 : 0.0});
  }
  for (const auto& r : x.roofline()) {
    d.parameters.push_back({absl::StrCat("roofline_", r.op_class(), "_compute_utilization"),
                            r.compute_utilization()});
    d.parameters.push_back({absl::StrCat("roofline_", r.op_class(), "_memory_utilization"),
                            r.memory_utilization()});
    d.parameters.push_back({absl::StrCat("roofline_", r.op_class(), "_kernel_overhead_s"),
                            r.kernel_overhead_s()});
  }
  return d;
}

GpuDevice::OpClass GpuDevice::ClassOf(const Op& op) {
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kMoe:
      return kGemmClass;
    case OpKind::kAttention: return kAttentionClass;
    case OpKind::kElementwise:
      switch (op.stage) {
        case Stage::kNorm:
        case Stage::kFinalNorm: return kNormClass;
        case Stage::kActivation: return kActivationClass;
        case Stage::kEmbedding: return kEmbeddingClass;
        default: return kOther;
      }
    case OpKind::kAllReduce: return kOther;
  }
  return kOther;
}

Cost GpuDevice::Roofline(double flops, double bytes, OpClass cls) const {
  const Caps& caps = caps_[cls];
  Cost c;
  c.flops = flops;
  c.dram_bytes = bytes;
  c.time_s = std::max(flops / caps.flops_per_s, bytes / caps.bytes_per_s) + caps.overhead_s;
  c.compute_energy_pj = flops * caps.energy_pj;
  c.dram_energy_pj = bytes * spec_.xpu().dram_energy_pj_per_byte();
  return c;
}

Cost GpuDevice::RooflineCost(const Op& op) const {
  switch (op.kind) {
    case OpKind::kGemm: {
      if (op.m <= 0 || op.n <= 0 || op.k <= 0) return Cost{};
      const double m = op.m, n = op.n, k = op.k;
      const double w = op.stage == Stage::kLmHead ? lm_head_bytes_ : w_bytes_;
      return Roofline(2 * m * n * k, (m * k + m * n) * a_bytes_ + k * n * w, kGemmClass);
    }
    case OpKind::kAttention: {
      if (op.kv_latent > 0) return MlaAttentionCost(op);
      double pairs = 0;  // attended (query, key) pairs, per head
      double kv_rows_read = 0;
      double new_rows = 0;
      for (const AttentionSeq& s : op.seqs) {
        const double past = s.past_tokens, n = s.new_tokens;
        new_rows += n;
        if (op.window > 0) {
          // Query i sees min(past + i + 1, W) positions: the first k of
          // them all they have, the rest W.
          const double w = static_cast<double>(op.window);
          const double k = std::clamp(w - past, 0.0, n);
          pairs += k * past + k * (k + 1) / 2 + (n - k) * w;
          for (int64_t start = 0; start < s.new_tokens; start += kQueryBlock) {
            const int64_t end = std::min(start + kQueryBlock, s.new_tokens);
            const int64_t first = std::max<int64_t>(0, s.past_tokens + start - op.window + 1);
            kv_rows_read += static_cast<double>(s.past_tokens + end - first);
          }
          continue;
        }
        pairs += n * past + n * (n + 1) / 2;
        // Query block j covers rows [j*B, min((j+1)*B, n)) and reads the
        // past plus rows up to its end.
        for (int64_t start = 0; start < s.new_tokens; start += kQueryBlock) {
          const int64_t end = std::min(start + kQueryBlock, s.new_tokens);
          kv_rows_read += past + static_cast<double>(end);
        }
      }
      if (new_rows == 0) return Cost{};
      const double dh = op.d_head;
      const double flops = pairs * op.heads * (4 * dh + 5);
      const double bytes = dh * (a_bytes_ * 2 * op.heads * new_rows +       // Q read, O written
                                 kv_bytes_ * (2 * op.kv_heads * new_rows +  // new K, V appended
                                              2 * op.kv_heads * kv_rows_read));  // cached K, V
      return Roofline(flops, bytes, kAttentionClass);
    }
    case OpKind::kElementwise: {
      if (op.elements <= 0) return Cost{};
      return Roofline(op.elements * op.flops_per_element, op.elements * op.bytes_per_element,
                      ClassOf(op));
    }
    case OpKind::kMoe:
      return MoeCost(op);
    case OpKind::kAllReduce:
      return CollectiveCost(op);
  }
  return Cost{};
}

Cost GpuDevice::MoeCost(const Op& op) const {
  if (op.m <= 0 || op.k <= 0) return Cost{};
  const double m = static_cast<double>(op.m), k = static_cast<double>(op.k);
  const double n = static_cast<double>(op.n), e = static_cast<double>(op.experts_total);
  const double a = op.routed, x = op.experts_touched, mats = op.expert_matrices;
  // Router: [m x k] x [k x E], then top-k (negligible).
  double flops = 2 * m * k * e;
  double bytes = (m * k + m * e) * a_bytes_ + k * e * w_bytes_;
  // Experts: each assignment runs its expert's matrices (gate+up and down
  // when gated: 2 k n FLOPs per matrix) and the activation (~6 FLOPs per
  // element); the touched experts' weights are read once; activations: the
  // m input rows, per assignment the intermediate (gate+up written, read by
  // the activation, its output written and read by down: 2 * mats * n) and
  // the k-wide output, and the m combined rows.
  const double expert_flops = 2 * k * n * mats;
  flops += a * (expert_flops + 6 * n);
  bytes +=
      x * mats * k * n * expert_w_bytes_ + (m * k + a * 2 * mats * n + a * k + m * k) * a_bytes_;
  Cost c = Roofline(flops, bytes, kGemmClass);
  if (x > 0 && a > 0 && n > 0) {
    // The grouped GEMM pads each expert's rows to its row tile (vLLM's
    // fused_moe: 16 rows for small batches), which costs time, not FLOPs.
    const double rows = a / x;
    const double padded = x * std::ceil(rows / kMoeRowTile) * kMoeRowTile;
    const Caps& caps = caps_[kGemmClass];
    const double padded_flops = flops + (padded - a) * expert_flops;
    c.time_s = std::max(padded_flops / caps.flops_per_s, bytes / caps.bytes_per_s);
    // Router GEMM, top-k and the token sort, two grouped GEMMs: four
    // kernels' launch overhead.
    c.time_s += kMoeKernels * caps.overhead_s;
  }
  return c;
}

Cost GpuDevice::MlaAttentionCost(const Op& op) const {
  const double h = op.heads, c = op.kv_latent, r = op.d_rope;
  const double dn = op.d_head, dv = op.d_value > 0 ? op.d_value : op.d_head;
  // Decode (one new token; FlashMLA's absorbed form): every head's query
  // is c + r wide and attends to the shared latent rows, which one kernel
  // reads once for all heads; its output is c wide (W_UV comes after).
  double d_pairs = 0, d_rows = 0, d_read = 0;
  // Prefill chunks: ordinary heads over the up-projected keys (dn + r) and
  // values (dv), read per 128-row query block as FlashAttention does.
  double p_pairs = 0, p_rows = 0, p_read = 0;
  for (const AttentionSeq& s : op.seqs) {
    const double past = s.past_tokens, n = s.new_tokens;
    if (s.new_tokens == 1) {
      d_pairs += past + 1;
      d_rows += 1;
      d_read += past + 1;
      continue;
    }
    p_pairs += n * past + n * (n + 1) / 2;
    p_rows += n;
    for (int64_t start = 0; start < s.new_tokens; start += kQueryBlock) {
      p_read += past + static_cast<double>(std::min(start + kQueryBlock, s.new_tokens));
    }
  }
  Cost total;
  if (d_rows > 0) {
    total +=
        Roofline(d_pairs * h * (2 * (c + r) + 2 * c + 5),
                 a_bytes_ * d_rows * h * ((c + r) + c) + kv_bytes_ * (d_rows + d_read) * (c + r),
                 kAttentionClass);
  }
  if (p_rows > 0) {
    total +=
        Roofline(p_pairs * h * (2 * (dn + r) + 2 * dv + 5),
                 a_bytes_ * (p_rows + p_read) * h * (dn + r + dv) + kv_bytes_ * p_rows * (c + r),
                 kAttentionClass);
  }
  return total;
}

double GpuDevice::GemmTime(double m, double n, double k) const {
  return Roofline(2 * m * n * k, (m * k + m * n) * a_bytes_ + k * n * w_bytes_, kGemmClass).time_s;
}

double GpuDevice::AttentionTime(const Op& op, const AttentionShapeQuery& q) const {
  // The batch as one prefill chunk and n_decode decodes at the mean history.
  const std::vector<AttentionSeq> seqs = [&] {
    std::vector<AttentionSeq> v;
    if (q.prefill_chunk > 0) {
      v.push_back({static_cast<int64_t>(q.prefill_chunk), static_cast<int64_t>(q.kv_prefill), -1});
    }
    for (int64_t i = 0; i < static_cast<int64_t>(q.n_decode); ++i) {
      v.push_back({1, static_cast<int64_t>(q.kv_decode_mean), -1});
    }
    return v;
  }();
  Op a = op;
  a.seqs = seqs;
  return RooflineCost(a).time_s;
}

double GpuDevice::ProfiledTime(const Op& op, const Cost& c) const {
  const GpuProfile& p = *profile_;
  const auto& ref = spec_.profile();
  // Sum of the named dense layers at `x` tokens, anchored past the grid by
  // `scale(x_grid) / scale(x)`-style roofline ratios: the caller passes the
  // roofline time as a function of the count.
  auto curves = [&](const std::vector<const char*>& names, bool per_sequence, double x,
                    const std::function<double(double)>& roofline) -> double {
    double t = 0;
    bool any = false;
    for (const char* name : names) {
      const ProfileCurve* curve = per_sequence ? p.PerSequence(name) : p.Dense(name);
      if (curve == nullptr) continue;
      any = true;
      bool beyond = false;
      double v = curve->Eval(x, &beyond);
      if (beyond) v *= roofline(x) / roofline(curve->max_x());
      p.Count(beyond);
      t += v;
    }
    if (!any) {
      p.CountMissing();
      return c.time_s;
    }
    return t;
  };
  const double tokens = static_cast<double>(op.tokens > 0 ? op.tokens : op.m);
  switch (op.kind) {
    case OpKind::kGemm: {
      if (op.m <= 0 || op.n <= 0 || op.k <= 0) return 0;
      int64_t n = 0, k = 0;
      std::vector<const char*> names;
      bool per_sequence = false;
      switch (op.stage) {
        case Stage::kQkv:
          names = {"qkv_proj", "rotary_emb", "qk_norm"};
          n = ref.qkv_n(), k = ref.d_model();
          break;
        case Stage::kProjection:
          names = {"o_proj"};
          n = ref.d_model(), k = ref.attn_out_k();
          break;
        case Stage::kFf1:
          names = {"gate_up_proj"};
          n = ref.ff1_n(), k = ref.d_model();
          break;
        case Stage::kFf2:
          names = {"down_proj"};
          n = ref.d_model(), k = ref.ff2_k();
          break;
        case Stage::kLmHead:
          names = {"lm_head", "sampler"};
          per_sequence = true;
          n = ref.lm_head_n(), k = ref.d_model();
          break;
        default:
          return c.time_s;
      }
      const double m = static_cast<double>(op.m);
      if (n <= 0 || k <= 0) return c.time_s;
      const double dn = static_cast<double>(n), dk = static_cast<double>(k);
      const double x = per_sequence && op.sequences > 0 ? static_cast<double>(op.sequences) : tokens;
      double t = curves(names, per_sequence, x, [&](double v) { return GemmTime(v, dn, dk); });
      // Another shape than the model's (a head-group tile, a co-processing
      // share): scaled by the roofline's ratio at the same rows.
      if (op.n != n || op.k != k) t *= c.time_s / GemmTime(m, dn, dk);
      return t;
    }
    case OpKind::kElementwise: {
      const char* name = nullptr;
      switch (op.stage) {
        case Stage::kNorm: name = "layernorm"; break;
        case Stage::kFinalNorm: name = "final_layernorm"; break;
        case Stage::kEmbedding: name = "embedding"; break;
        case Stage::kActivation: name = "act_fn"; break;
        case Stage::kResidual: return 0;  // fused into the next norm
        default: return c.time_s;
      }
      if (op.elements <= 0 || tokens <= 0) return 0;
      const double per_token = static_cast<double>(op.elements) / tokens;
      return curves({name}, false, tokens, [&](double v) {
        return Roofline(v * per_token * op.flops_per_element,
                        v * per_token * op.bytes_per_element, ClassOf(op)).time_s;
      });
    }
    case OpKind::kAttention: {
      if (op.kv_latent > 0 || op.window > 0) {  // bundles measure full attention only
        p.CountMissing();
        return c.time_s;
      }
      AttentionShapeQuery q;
      double kv_sum = 0;
      bool first_decode = true;
      for (const AttentionSeq& s : op.seqs) {
        if (s.new_tokens > 1) {
          q.prefill_chunk += static_cast<double>(s.new_tokens);
          q.kv_prefill += static_cast<double>(s.past_tokens);
        } else if (s.new_tokens == 1) {
          const double kv = static_cast<double>(s.past_tokens);
          q.n_decode += 1;
          kv_sum += kv;
          q.kv_decode_min = first_decode ? kv : std::min(q.kv_decode_min, kv);
          q.kv_decode_max = first_decode ? kv : std::max(q.kv_decode_max, kv);
          first_decode = false;
        }
      }
      if (q.prefill_chunk == 0 && q.n_decode == 0) return 0;
      if (q.n_decode > 0) q.kv_decode_mean = std::floor(kv_sum / q.n_decode);
      AttentionShapeQuery clamped;
      double t = p.Attention(q, &clamped);
      const bool beyond = clamped.prefill_chunk != q.prefill_chunk ||
                          clamped.kv_prefill != q.kv_prefill || clamped.n_decode != q.n_decode ||
                          clamped.kv_decode_mean != q.kv_decode_mean;
      if (beyond) t *= AttentionTime(op, q) / AttentionTime(op, clamped);
      p.Count(beyond);
      return t;
    }
    case OpKind::kMoe: {
      if (!p.has_moe() || op.top_k <= 0 || op.routed <= 0) {
        if (!p.has_moe()) p.CountMissing();
        return c.time_s;
      }
      // The bundle's tokens are the rows whose experts run here: the
      // assignments over top-k.
      const double tokens = op.routed / op.top_k;
      bool beyond = false;
      double ct = tokens, cx = op.experts_touched;
      double t = p.Moe(tokens, op.experts_touched, &beyond, &ct, &cx);
      p.Count(beyond);
      if (beyond) {
        Op g = op;
        g.routed = ct * op.top_k;
        g.m = std::max<int64_t>(
            1, static_cast<int64_t>(std::llround(static_cast<double>(op.m) * ct / tokens)));
        g.experts_touched = cx;
        t *= c.time_s / MoeCost(g).time_s;
      }
      // Experts narrower than measured (split by width over ranks).
      if (ref.expert_d_ff() > 0 && op.n != ref.expert_d_ff()) {
        Op w = op;
        w.n = ref.expert_d_ff();
        t *= c.time_s / MoeCost(w).time_s;
      }
      return t;
    }
    case OpKind::kAllReduce:
      return c.time_s;
  }
  return c.time_s;
}

absl::Status GpuDevice::Estimate(absl::Span<const Op> ops,
                                 absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu device: ", ops.size(), " ops but ", costs.size(), " cost slots"));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    costs[i] = RooflineCost(ops[i]);
    if (spec_.xpu().has_on_die()) AddOnDie(ops[i], &costs[i]);
    if (profile_ != nullptr) costs[i].time_s = ProfiledTime(ops[i], costs[i]);
  }
  return absl::OkStatus();
}

void GpuDevice::AddOnDie(const Op& op, Cost* c) const {
  const auto& e = spec_.xpu().on_die();
  OnDieTraffic t;
  double utilization = 1;  // of the SMs, by the op's thread blocks
  switch (op.kind) {
    case OpKind::kGemm: {
      const double w = op.stage == Stage::kLmHead ? lm_head_bytes_ : w_bytes_;
      const GemmShape g{.m = static_cast<double>(op.m),
                        .n = static_cast<double>(op.n),
                        .k = static_cast<double>(op.k),
                        .a_bytes = a_bytes_,
                        .b_bytes = w};
      t = GemmOnDie(g, e.cores(), e.l1_bytes_per_core());
      utilization = t.sm_utilization;
      break;
    }
    case OpKind::kAttention: {
      if (op.kv_latent > 0) return;  // MLA: not modelled (docs/energy.md)
      // Per sequence and head: scores [new x d] x [d x keys], context
      // [new x keys] x [keys x d]; a sliding window bounds the keys. Decode
      // batches repeat shapes, so the last one's traffic is reused.
      GemmShape last_score{.m = -1};
      OnDieTraffic last{};
      double blocks = 0;
      for (const AttentionSeq& s : op.seqs) {
        if (s.new_tokens <= 0) continue;
        double keys = static_cast<double>(s.past_tokens + s.new_tokens);
        if (op.window > 0) keys = std::min(keys, static_cast<double>(op.window + s.new_tokens - 1));
        const GemmShape score{.m = static_cast<double>(s.new_tokens),
                              .n = keys,
                              .k = static_cast<double>(op.d_head),
                              .count = static_cast<double>(op.heads),
                              .a_bytes = a_bytes_,
                              .b_bytes = kv_bytes_,
                              .block_per_tile = false};
        if (score.m != last_score.m || score.n != last_score.n) {
          GemmShape context = score;
          context.n = score.k;
          context.k = keys;
          const OnDieTraffic a = GemmOnDie(score, e.cores(), e.l1_bytes_per_core());
          const OnDieTraffic b = GemmOnDie(context, e.cores(), e.l1_bytes_per_core());
          last = {a.l2_bytes + b.l2_bytes, a.l1_bytes + b.l1_bytes,
                  a.register_accesses + b.register_accesses};
          last_score = score;
        }
        t.l2_bytes += last.l2_bytes;
        t.l1_bytes += last.l1_bytes;
        t.register_accesses += last.register_accesses;
        blocks += static_cast<double>(op.heads);
      }
      utilization = SmUtilization(blocks, e.cores());
      break;
    }
    case OpKind::kElementwise: {
      // Streamed through L2 and L1, one register access per element.
      const double bytes = op.elements * op.bytes_per_element;
      t.l2_bytes = t.l1_bytes = bytes;
      t.register_accesses = bytes / a_bytes_;
      break;
    }
    case OpKind::kMoe:        // not modelled (docs/energy.md)
    case OpKind::kAllReduce:  // links only
      return;
  }
  c->compute_energy_pj += t.l2_bytes * e.l2_pj_per_byte() + t.l1_bytes * e.l1_pj_per_byte() +
                          t.register_accesses * e.register_pj_per_access();
  if (e.occupancy_time() && utilization < 1 && c->time_s > 0) {
    const double overhead = caps_[ClassOf(op)].overhead_s;
    c->time_s = overhead + (c->time_s - overhead) / utilization;
  }
}

absl::StatusOr<AttentionResult> GpuDevice::Execute(
    const AttentionCall& call) const {
  return ExactAttention(call);
}

SERVESIM_REGISTER_DEVICE(kGpu, "gpu", &GpuDevice::Create);

}  // namespace servesim::devices
