#include "devices/gpu/gpu_device.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
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
  return std::unique_ptr<Device>(new GpuDevice(spec.gpu()));
}

GpuDevice::GpuDevice(const servesim::v1::GpuDeviceSpec& spec) : spec_(spec) {
  const auto& x = spec_.xpu();
  const bool int8 = spec_.dtype() == servesim::v1::DTYPE_INT8;
  flops_per_s_ = (int8 ? x.peak_flops_int8() : x.peak_flops_fp16()) *
                 x.compute_utilization();
  bytes_per_s_ = x.memory_bw_bytes_per_s() * x.memory_utilization();
  op_energy_pj_ = int8 ? x.int8_op_energy_pj() : x.flop_energy_pj();
  elem_bytes_ = int8 ? 1 : 2;
}

DeviceDescription GpuDevice::Describe() const {
  const auto& x = spec_.xpu();
  DeviceDescription d;
  d.kind = "gpu";
  d.preset = x.preset();
  d.memory_bytes = x.memory_bytes();
  d.lookahead_ok = true;  // pure
  d.accepts = {OpKind::kGemm, OpKind::kAttention, OpKind::kElementwise,
               OpKind::kAllReduce};
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
      {"interconnect_bandwidth_bytes_per_s",
       spec_.interconnect().bandwidth_bytes_per_s()},
      {"interconnect_latency_s", spec_.interconnect().latency_s()},
      {"element_bytes", elem_bytes_},
  };
  return d;
}

Cost GpuDevice::Roofline(double flops, double bytes) const {
  Cost c;
  c.flops = flops;
  c.dram_bytes = bytes;
  c.time_s = std::max(flops / flops_per_s_, bytes / bytes_per_s_) +
             spec_.xpu().kernel_overhead_s();
  c.compute_energy_pj = flops * op_energy_pj_;
  c.dram_energy_pj = bytes * spec_.xpu().dram_energy_pj_per_byte();
  return c;
}

absl::Status GpuDevice::Estimate(absl::Span<const Op> ops,
                                 absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu device: ", ops.size(), " ops but ", costs.size(), " cost slots"));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    switch (op.kind) {
      case OpKind::kGemm: {
        if (op.m <= 0 || op.n <= 0 || op.k <= 0) {
          costs[i] = Cost{};
          break;
        }
        const double m = op.m, n = op.n, k = op.k;
        costs[i] = Roofline(2 * m * n * k, (m * k + k * n + m * n) * elem_bytes_);
        break;
      }
      case OpKind::kAttention: {
        double pairs = 0;  // attended (query, key) pairs, per head
        double kv_rows_read = 0;
        double new_rows = 0;
        for (const AttentionSeq& s : op.seqs) {
          const double past = s.past_tokens, n = s.new_tokens;
          pairs += n * past + n * (n + 1) / 2;
          new_rows += n;
          // Query block j covers rows [j*B, min((j+1)*B, n)) and reads the
          // past plus rows up to its end.
          for (int64_t start = 0; start < s.new_tokens; start += kQueryBlock) {
            const int64_t end = std::min(start + kQueryBlock, s.new_tokens);
            kv_rows_read += past + static_cast<double>(end);
          }
        }
        if (new_rows == 0) {
          costs[i] = Cost{};
          break;
        }
        const double dh = op.d_head;
        const double flops = pairs * op.heads * (4 * dh + 5);
        const double bytes =
            elem_bytes_ * dh *
            (2 * op.heads * new_rows +          // Q read, O written
             2 * op.kv_heads * new_rows +       // new K, V appended
             2 * op.kv_heads * kv_rows_read);   // cached K, V read
        costs[i] = Roofline(flops, bytes);
        break;
      }
      case OpKind::kElementwise: {
        if (op.elements <= 0) {
          costs[i] = Cost{};
          break;
        }
        costs[i] = Roofline(op.elements * op.flops_per_element,
                            op.elements * op.bytes_per_element);
        break;
      }
      case OpKind::kAllReduce: {
        Cost c;
        if (op.participants > 1 && op.bytes > 0) {
          const double p = op.participants;
          const auto& link = spec_.interconnect();
          c.time_s = 2 * (p - 1) *
                     (link.latency_s() + op.bytes / p / link.bandwidth_bytes_per_s());
          c.link_bytes = 2 * (p - 1) / p * op.bytes;
          c.link_energy_pj = c.link_bytes * link.energy_pj_per_byte();
          // Each step also reads and writes its slice in device memory and
          // adds it (the reduction), which the roofline above ignores: it is
          // a few MB against the link time.
        }
        costs[i] = c;
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionResult> GpuDevice::Execute(
    const AttentionCall& call) const {
  return ExactAttention(call);
}

SERVESIM_REGISTER_DEVICE(kGpu, "gpu", &GpuDevice::Create);

}  // namespace servesim::devices
