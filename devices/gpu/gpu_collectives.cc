// GpuDevice's collectives (gpu_device.h): measured nccl-tests tables where
// the spec carries them, vLLM's custom all-reduce where vLLM takes it, and
// the ring model on the link's figures otherwise (docs/collectives.md).
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "devices/gpu/gpu_device.h"

namespace servesim::devices {
namespace {

// vLLM's custom all-reduce (vllm/distributed/device_communicators/
// custom_all_reduce.py, csrc/custom_all_reduce.cuh; docs/collectives.md
// cites the lines): group sizes 2, 4, 6, 8; messages under max_size (8 MiB
// by default) and a multiple of 16 bytes; more than two GPUs only when
// every pair is joined by NVLink.
constexpr double kCustomMaxBytes = 8.0 * 1024 * 1024;
// One-shot below these sizes (each rank reads every peer's whole buffer),
// two-shot above (reduce-scatter then all-gather through the peers'
// buffers): two GPUs always one-shot; up to 4 under 512 KiB, up to 8 under
// 256 KiB.
constexpr double kOneShot4 = 512.0 * 1024, kOneShot8 = 256.0 * 1024;

}  // namespace

absl::Status GpuDevice::InitCollectives() {
  const auto& g = spec_;
  auto intra = CollectiveTable::Create(g.collectives().curves());
  if (!intra.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu device: collectives: ", intra.status().message()));
  }
  auto inter = CollectiveTable::Create(g.internode_collectives().curves());
  if (!inter.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu device: internode_collectives: ", inter.status().message()));
  }
  intra_ = *std::move(intra);
  inter_ = *std::move(inter);
  const bool p2p =
      g.collectives().has_peer_to_peer() ? g.collectives().peer_to_peer() : g.xpu().peer_to_peer();
  // "analytic" (or a spec that names no preset: not resolved from a
  // scenario) keeps the ring model for every collective.
  const std::string& preset = g.collectives().preset();
  custom_all_reduce_ =
      p2p && !preset.empty() && preset != "analytic" &&
      (!g.collectives().has_custom_all_reduce() || g.collectives().custom_all_reduce());
  full_nvlink_ = absl::StartsWith(g.interconnect().preset(), "nvlink");
  // The bus bandwidth the custom all-reduce's copies reach: what NCCL's
  // all-reduce reached at the largest measured size among as many GPUs
  // (nccl-tests' busbw), else the link's line rate.
  for (int p = 2; p <= 8; p += 2) {
    double bw = g.interconnect().bandwidth_bytes_per_s();
    if (intra_.Has(CollectiveOp::kAllReduce)) {
      const double big = 1024.0 * 1024 * 1024;
      const double t = intra_.Time(CollectiveOp::kAllReduce, p, big);
      if (t > 0) bw = big * RingTrafficFactor(CollectiveOp::kAllReduce, p) / t;
    }
    custom_bw_[p / 2 - 1] = bw;
  }
  return absl::OkStatus();
}

bool GpuDevice::TakesCustomAllReduce(double bytes, int p) const {
  if (!custom_all_reduce_) return false;
  if (p != 2 && p != 4 && p != 6 && p != 8) return false;
  if (p > 2 && !full_nvlink_) return false;
  return bytes < kCustomMaxBytes && std::fmod(bytes, 16.0) == 0;
}

double GpuDevice::CustomAllReduceTime(double bytes, int p) const {
  const double bw = custom_bw_[p / 2 - 1];
  const double barrier = spec_.interconnect().latency_s();
  const bool one_shot = p == 2 || (p <= 4 && bytes < kOneShot4) || bytes < kOneShot8;
  if (one_shot) {
    // A barrier, every peer's buffer read and reduced, a barrier.
    return 2 * barrier + (p - 1) * bytes / bw;
  }
  // Reduce-scatter of 1/p each, a barrier, all-gather of the rest: each
  // rank reads (p-1)/p of the message twice; three barriers.
  return 3 * barrier + 2 * (p - 1) / static_cast<double>(p) * bytes / bw;
}

Cost GpuDevice::CollectiveCost(const Op& op) const {
  Cost c = RingCost(op);
  if (op.participants <= 1 || op.bytes <= 0) return c;
  const int p = op.participants;
  const int per_node = spec_.xpus_per_node();
  const bool across = per_node > 0 && p > per_node;
  if (!across && op.collective == CollectiveOp::kAllReduce && TakesCustomAllReduce(op.bytes, p)) {
    c.time_s = CustomAllReduceTime(op.bytes, p);
    return c;
  }
  const double t = (across ? inter_ : intra_).Time(op.collective, p, op.bytes);
  if (t >= 0) c.time_s = t;
  return c;
}

// The ring model on the link's figures: an all-reduce is 2(p-1) steps, an
// all-gather, reduce-scatter or all-to-all p-1, each moving 1/p of the
// message; a send/recv one step of all of it.
Cost GpuDevice::RingCost(const Op& op) const {
  Cost c;
  if (op.participants <= 1 || op.bytes <= 0) return c;
  const double p = op.participants;
  const auto& link = spec_.interconnect();
  const double share = op.collective == CollectiveOp::kAllReduce ? 1.0 : 0.5;
  c.link_bytes = RingTrafficFactor(op.collective, op.participants) * op.bytes;
  if (op.collective == CollectiveOp::kSendRecv) {
    c.time_s = link.latency_s() + op.bytes / link.bandwidth_bytes_per_s();
    c.link_energy_pj = c.link_bytes * link.energy_pj_per_byte();
    return c;
  }
  const int per_node = spec_.xpus_per_node();
  if (per_node > 0 && op.participants > per_node) {
    // Across nodes: NCCL runs one ring channel per NIC, each slicing the
    // data; every xPU is its channel's node boundary once, so a step moves
    // 1/C of its slice over its NIC and the rest over the node's links, at
    // the pace of the slower of the two. The latency is NCCL's own ring
    // model's (src/graph/tuning.cc: the pipelined data pays each hop's
    // latency once along its way): of the steps, those that cross a node
    // boundary take the NIC's latency, the others the node's link's.
    const auto& net = spec_.internode();
    const double slice = op.bytes / p, channels = per_node;
    const double steps = 2 * (p - 1) * share;
    const double inter = 2 * (std::ceil(p / channels) - 1) * share;
    const double pace = std::max(slice / channels / net.bandwidth_bytes_per_s(),
                                 slice * (channels - 1) / channels / link.bandwidth_bytes_per_s());
    c.time_s = steps * pace + (steps - inter) * link.latency_s() + inter * net.latency_s();
    c.internode_bytes = c.link_bytes / channels;
    c.link_energy_pj = c.link_bytes / channels * net.energy_pj_per_byte() +
                       c.link_bytes * (channels - 1) / channels * link.energy_pj_per_byte();
    return c;
  }
  c.time_s = 2 * (p - 1) * share * (link.latency_s() + op.bytes / p / link.bandwidth_bytes_per_s());
  c.link_energy_pj = c.link_bytes * link.energy_pj_per_byte();
  // Each step also reads and writes its slice in device memory and adds it
  // (the reduction), which the ring ignores: a few MB against the link time.
  return c;
}

}  // namespace servesim::devices
