// Token-Picker hardware presets and ANALYTIC keep/prune tables. Every
// TopickSpec field is set.
//
// Sources:
//  [TP]     Park et al., "Token-Picker: Accelerating Attention in Text
//           Generation with Minimized Memory Transfer via Probability
//           Estimation", DAC'24.
//  [FGDRAM] O'Connor et al., "Fine-Grained DRAM", MICRO'17: HBM2 access
//           energy 3.9 pJ/bit (the figure the LAD paper, §V, uses for
//           HBM2).
//
// Figure by figure:
//  pe_lanes 16                 [TP] §5.1.2: 16 PE lanes to use the HBM2
//                              bandwidth, one 4-bit chunk of a K row per lane
//                              and cycle.
//  multipliers_per_lane 64     [TP] Table 1: 64-dim x 12-12 bit multipliers.
//  clock_hz 500e6              [TP] §5.1.2.
//  hbm_channels 8, 32 GB/s     [TP] Table 1 (8 x 128 bit at 2 GHz).
//                              256 GB/s / 500 MHz = 512 B per cycle = 16
//                              chunks of 64 x 4 bit: one per lane.
//  scoreboard_entries 32       [TP] Table 1: 32 entry x 67 bit.
//  dram_latency_s 60e-9        ASSUMPTION: HBM2 read latency (tRCD + tCL
//                              14 + 14 ns, burst, controller and PHY) of
//                              about 60 ns = 30 cycles at 500 MHz, below the
//                              scoreboard depth as §4.1 needs.
//  operand_bits 12, chunk 4    [TP] §4: 12-bit operands in three 4-bit chunks.
//  threshold                   ASSUMPTION (the paper gives only the
//                              perplexity budget): topick (<= +0.05 PPL)
//                              1e-3, the probability [TP] Fig. 3 calls
//                              dominant; topick_0.3 (+0.3 PPL) 4e-3.
//  powers (mW)                 [TP] Table 2 at 500 MHz: per lane multipliers
//                              & adder tree 17.94 + prob gen 2.22 + the rest
//                              of the lane 0.9225 (PE Lane x 16 = 426.76 mW
//                              minus the listed modules) = 21.0825; PEC 0.73;
//                              scoreboard 4.69; RPDU 0.17; mux network 3.13;
//                              margin generator 3.78; DAG 2.49; on-chip
//                              buffer 1053.32; other 3.30 (total 1492.78
//                              minus the listed rows).
//  dram_pj_per_bit 3.9         [FGDRAM].
//  baseline                    [TP] §5.1.3: without margin generator, DAG,
//                              PEC, scoreboard and RPDU: all 12 bits of K
//                              and every V row.
//
// ANALYTIC tables (fractions of the context per head: fetched chunk 2,
// fetched chunk 3, kept = V rows fetched), from [TP] §5.2.1 averages at
// L = 1024 (GPT-2) / 2048 (OPT, LLaMA-2):
//  topick:     V 12.1x -> kept 1/12.1 = 0.0826; K 1.45x -> chunks per token
//              3 / 1.45 = 2.069 -> chunk2 + chunk3 = 1.069. The split is an
//              ASSUMPTION (the paper gives only the sum; bytes depend only
//              on the sum): chunk2 0.600, chunk3 0.469.
//  topick_0.3: V 22.2x -> 0.0450; K 1.51x -> 3 / 1.51 - 1 = 0.987: 0.560,
//              0.427.
//  baseline:   1, 1, 1.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "devices/presets.h"
#include "devices/topick/topick_device.h"

namespace servesim::devices {
namespace {

constexpr absl::string_view kCommon = R"pb(
  pe_lanes: 16
  multipliers_per_lane: 64
  clock_hz: 500e6
  hbm_channels: 8
  channel_bandwidth_bytes_per_s: 32e9
  scoreboard_entries: 32
  dram_latency_s: 60e-9
  operand_bits: 12
  chunk_bits: 4
  lane_datapath_mw: 21.0825
  lane_pec_mw: 0.73
  lane_scoreboard_mw: 4.69
  lane_rpdu_mw: 0.17
  mux_network_mw: 3.13
  margin_generator_mw: 3.78
  dag_mw: 2.49
  onchip_buffer_mw: 1053.32
  other_mw: 3.30
  dram_pj_per_bit: 3.9
)pb";

constexpr absl::string_view kPresets[][2] = {
    {"topick", R"pb(estimation: true on_demand_k: true threshold: 1e-3)pb"},
    {"topick_0.3", R"pb(estimation: true on_demand_k: true threshold: 4e-3)pb"},
    {"baseline", R"pb(estimation: false on_demand_k: false threshold: 0)pb"},
};

const std::map<std::string, servesim::v1::TopickSpec>& Table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, servesim::v1::TopickSpec>();
    for (const auto& [name, text] : kPresets) {
      servesim::v1::TopickSpec spec;
      ParseBuiltInPreset("topick", name, absl::StrCat(text, " ", kCommon), &spec);
      t->emplace(std::string(name), std::move(spec));
    }
    return t;
  }();
  return *table;
}

}  // namespace

absl::StatusOr<servesim::v1::TopickSpec> TopickPreset(absl::string_view name) {
  auto it = Table().find(std::string(name));
  if (it == Table().end()) {
    return absl::NotFoundError(absl::StrCat("unknown topick preset \"", name,
                                            "\"; known: ", absl::StrJoin(TopickPresetNames(), ", ")));
  }
  return it->second;
}

std::vector<std::string> TopickPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Table()) names.push_back(name);
  return names;
}

// {chunk2, chunk3, kept} per preset (see the header comment); NOT_FOUND for
// presets without a table.
absl::StatusOr<std::array<double, 3>> TopickAnalyticFractions(absl::string_view preset) {
  static const std::map<std::string, std::array<double, 3>> kTable = {
      {"topick", {0.600, 0.469, 1.0 / 12.1}},
      {"topick_0.3", {0.560, 0.427, 1.0 / 22.2}},
      {"baseline", {1.0, 1.0, 1.0}},
  };
  auto it = kTable.find(std::string(preset));
  if (it == kTable.end()) {
    return absl::NotFoundError(absl::StrCat(
        "topick: no ANALYTIC table for preset \"", preset,
        "\" (tables: topick, topick_0.3, baseline); use PRUNE_FIDELITY_CALIBRATED or FULL"));
  }
  return it->second;
}

}  // namespace servesim::devices
