// `servesim presets [KIND]`: the built-in presets and their parameters.
#include "devices/presets.h"

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "devices/attacc/attacc_device.h"
#include "devices/collectives.h"
#include "devices/cta/cta_device.h"
#include "devices/lad/lad_device.h"
#include "devices/model.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "google/protobuf/text_format.h"
#include "services/commands/commands.h"
#include "services/commands/scenario_args.h"

namespace servesim::services {
namespace {

void PrintMessage(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(m, &text);
  std::cout << "    " << text << "\n";
}

}  // namespace

int PresetsCommand(const Args& args) {
  std::string kind;
  FlagParser flags;
  flags.Positional([&kind](const std::string& a) -> std::string {
    if (!kind.empty()) return "unexpected argument " + a;
    kind = a;
    return "";
  });
  if (auto exit = ParseFlags(flags, args)) return *exit;
  const std::string& k = kind;
  if (!k.empty() && k != "models" && k != "xpus" && k != "links" && k != "nodes" &&
      k != "collectives" && k != "attacc" && k != "topick" && k != "spatten" && k != "cta" &&
      k != "lad") {
    return UsageError(
        "presets takes models, xpus, links, nodes, collectives, attacc, topick, spatten, cta or "
        "lad");
  }
  if (k.empty() || k == "models") {
    std::cout << "models (model.preset):\n";
    for (const auto& name : devices::ModelPresetNames()) {
      auto m = devices::ModelPreset(name);
      std::cout << "  " << name << "\n";
      PrintMessage(*m);
      const auto dims = devices::ModelDimsFromSpec(*m);
      std::cout << absl::StrFormat(
          "    = %.2fB parameters%s, %s %s%s weights, %d KB %s KV per token\n",
          dims.TotalParams() / 1e9,
          dims.moe() ? absl::StrFormat(" (%.2fB active)", dims.ActiveParams() / 1e9)
                     : std::string(),
          FormatGb(dims.WeightBytes()), devices::DTypeName(dims.dtype),
          dims.expert_dtype != dims.dtype
              ? absl::StrCat(" (experts ", devices::DTypeName(dims.expert_dtype), ")")
              : std::string(),
          dims.KvBytesPerToken() / 1024, devices::DTypeName(dims.kv_dtype));
    }
  }
  if (k.empty() || k == "xpus") {
    std::cout << "xpus (cluster.xpu.preset):\n";
    for (const auto& name : devices::XpuPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::XpuPreset(name));
    }
  }
  if (k.empty() || k == "links") {
    std::cout << "links (cluster.interconnect.preset, cluster.frontend.preset, "
                 "cluster.internode.preset):\n";
    for (const auto& name : devices::LinkPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::LinkPreset(name));
    }
  }
  if (k.empty() || k == "nodes") {
    std::cout << "nodes (cluster.node.preset):\n";
    for (const auto& name : devices::NodePresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::NodePreset(name));
    }
  }
  if (k.empty() || k == "collectives") {
    std::cout << "collectives (cluster.collectives.preset, cluster.internode_collectives.preset; "
                 "also auto, analytic):\n";
    for (const auto& name : devices::CollectivePresetNames()) {
      std::cout << "  " << name << "\n";
      const auto curves = devices::CollectivePreset(name);
      if (!curves.ok()) continue;
      for (const auto& c : *curves) {
        const int n = c.bytes_size();
        std::cout << absl::StrFormat(
            "    %s among %d GPUs: %d sizes, %.0f B (%.1f us) to %.0f B "
            "(%.1f us); %s\n",
            c.op(), c.gpus(), n, c.bytes(0), c.time_s(0) * 1e6, c.bytes(n - 1),
            c.time_s(n - 1) * 1e6, c.source());
      }
    }
  }
  if (k.empty() || k == "attacc") {
    std::cout << "attacc (cluster.attacc.preset):\n";
    for (const auto& name : devices::AttAccPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::AttAccPreset(name));
    }
  }
  if (k.empty() || k == "topick") {
    std::cout << "topick (cluster.attention_pool.topick.topick.preset):\n";
    for (const auto& name : devices::TopickPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::TopickPreset(name));
    }
  }
  if (k.empty() || k == "spatten") {
    std::cout << "spatten (cluster.attention_pool.spatten.spatten.preset):\n";
    for (const auto& name : devices::SpattenPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::SpattenPreset(name));
    }
  }
  if (k.empty() || k == "cta") {
    std::cout << "cta (cluster.attention_pool.cta.cta.preset):\n";
    for (const auto& name : devices::CtaPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::CtaPreset(name));
    }
  }
  if (k.empty() || k == "lad") {
    std::cout << "lad (cluster.attention_pool.lad.lad.preset):\n";
    for (const auto& name : devices::LadPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*devices::LadPreset(name));
    }
  }
  if (k.empty()) {
    std::cout << "device kinds: " << absl::StrJoin(devices::RegisteredDeviceKinds(), ", ") << "\n";
  }
  return 0;
}

}  // namespace servesim::services
