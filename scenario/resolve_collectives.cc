// cluster.collectives and cluster.internode_collectives: the measured
// nccl-tests tables the xPU device costs collectives with
// (docs/collectives.md), read here so that agents get them by value.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/read_text.h"
#include "common/status_macros.h"
#include "devices/collectives.h"
#include "scenario/resolve_internal.h"

namespace servesim::scenario::internal {
namespace {

namespace fs = std::filesystem;

// nccl-tests prints a few KB per table; anything near this is not one.
constexpr int64_t kMaxTableBytes = 4 << 20;

// The preset that measured the class of `link` (a LinkSpec preset), or
// "" where none ships.
std::string PresetFor(const std::string& link, bool p2p) {
  if (link == "nvlink3" || link == "nvlink4" || link == "nvlink5") {
    return absl::StrCat(link, "-nvswitch");
  }
  if (link == "pcie4" || link == "pcie5") return absl::StrCat(link, p2p ? "-p2p" : "-nop2p");
  if (link == "infiniband-hdr") return "ib-hdr";
  if (link == "infiniband-ndr") return "ib-ndr";
  return "";
}

bool Shipped(const std::string& preset) {
  for (const std::string& n : devices::CollectivePresetNames()) {
    if (n == preset) return true;
  }
  return false;
}

// The group sizes the scenario's collectives run among, within a node or
// across nodes.
std::vector<int> GroupSizes(const LoadedScenario& sc, const Layout& layout, bool across) {
  const int per_node = sc.proto.cluster().xpus_per_node();
  std::vector<int> out;
  for (int64_t g : {layout.tp, layout.moe ? layout.tp * layout.dp : int64_t{1}}) {
    if (g <= 1) continue;
    const bool crosses = per_node > 0 && g > per_node;
    if (crosses == across) out.push_back(static_cast<int>(g));
  }
  return out;
}

absl::Status ResolveOne(const LoadedScenario& sc, const Layout& layout, const std::string& field,
                        const servesim::v1::CollectivesSpec& in, const std::string& link,
                        bool default_p2p, bool across, servesim::v1::CollectivesSpec* out,
                        ResolvedScenario* resolved) {
  *out = in;
  const bool p2p = in.has_peer_to_peer() ? in.peer_to_peer() : default_p2p;
  out->set_peer_to_peer(p2p);
  if (!in.has_custom_all_reduce()) out->set_custom_all_reduce(true);
  const std::vector<int> groups = GroupSizes(sc, layout, across);
  std::string preset = in.preset();
  // Unset: the ring model, as before measured tables shipped (the default
  // moves every multi-GPU figure the docs publish; docs/collectives.md).
  if (preset.empty()) preset = "analytic";
  out->set_preset(preset);
  if (preset == "auto") {
    preset = PresetFor(link, p2p);
    if (preset.empty() || !Shipped(preset)) {
      if (!groups.empty() && in.files().empty()) {
        resolved->fallbacks.push_back(absl::StrCat(
            field, ": no measured collectives for the link ", link.empty() ? "given" : link,
            preset.empty() ? "" : absl::StrCat(" (no preset ", preset, ")"),
            "; the ring model on its bandwidth and latency"));
      }
      preset = "analytic";
    }
    out->set_preset(preset);
  }
  if (preset != "analytic") {
    auto curves = devices::CollectivePreset(preset);
    if (!curves.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(sc.Where(field + ".preset"), ": ", field,
                                                     ".preset: ", curves.status().message()));
    }
    for (auto& c : *curves) *out->add_curves() = std::move(c);
  }
  bool matched = false;
  std::string first_source;
  for (int i = 0; i < in.files_size(); ++i) {
    fs::path path(in.files(i));
    if (path.is_relative()) path = fs::path(sc.base_dir) / path;
    const std::string where =
        absl::StrCat(sc.Where(field + ".files"), ": ", field, ".files[", i, "]");
    auto text = ReadTextFile(path.string(), kMaxTableBytes, "an nccl-tests output");
    if (!text.ok())
      return absl::Status(text.status().code(), absl::StrCat(where, ": ", text.status().message()));
    auto curve = devices::ParseNcclTests(*text, path.string());
    if (!curve.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", curve.status().message()));
    if (first_source.empty()) first_source = curve->source();
    for (int g : groups) matched = matched || g == curve->gpus();
    *out->add_curves() = *std::move(curve);
  }
  if (in.files_size() > 0 && !groups.empty() && !matched) {
    std::vector<int> measured;
    for (const auto& curve : out->curves()) measured.push_back(curve.gpus());
    return absl::InvalidArgumentError(absl::StrCat(
        first_source, ": column nGpus: the files measure ", absl::StrJoin(measured, ", "),
        " GPUs, none of the scenario's groups of ", absl::StrJoin(groups, ", "), " (", field, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveCollectives(const LoadedScenario& sc, const Layout& layout,
                                servesim::v1::GpuDeviceSpec* gpu, ResolvedScenario* out) {
  const auto& c = sc.proto.cluster();
  const bool nvlink = absl::StartsWith(c.interconnect().preset(), "nvlink");
  const bool p2p = c.xpu().has_peer_to_peer() ? c.xpu().peer_to_peer() : nvlink;
  RETURN_IF_ERROR(ResolveOne(sc, layout, "cluster.collectives", c.collectives(),
                             c.interconnect().preset(), p2p, false, gpu->mutable_collectives(),
                             out));
  if (c.xpus_per_node() > 0) {
    RETURN_IF_ERROR(ResolveOne(sc, layout, "cluster.internode_collectives",
                               c.internode_collectives(), c.internode().preset(), true, true,
                               gpu->mutable_internode_collectives(), out));
  }
  return absl::OkStatus();
}

}  // namespace servesim::scenario::internal
