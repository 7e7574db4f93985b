// CTA hardware presets and ANALYTIC tables. Every CtaSpec field is set.
//
// Sources:
//  [CTA]    Wang et al., "CTA: Hardware-Software Co-design for Compressed
//           Token Attention Mechanism", HPCA'23 (slides). The slides give the algorithm, the
//           four modules (systolic array, CIM, CAG, PAG) and the reductions
//           RL/RA per accuracy setting, but NO hardware sizes, clock,
//           memory or power: every such figure below is an ASSUMPTION.
//  [FGDRAM] O'Connor et al., "Fine-Grained DRAM", MICRO'17: HBM2 access
//           energy 3.9 pJ/bit.
//
// Figure by figure:
//  sa_rows x sa_cols 64 x 64   ASSUMPTION: 4,096 16-bit MACs, the size of
//                              a mid-size attention accelerator (ELSA, the
//                              slides' baseline, and SpAtten use 512-4,096
//                              multipliers).
//  clock_hz 1e9                ASSUMPTION (SpAtten, ELSA: 1 GHz).
//  operand_bits 16             ASSUMPTION: 16-bit fixed point.
//  cim_tokens_per_cycle 1      ASSUMPTION: one hash-table lookup per cycle.
//  cag_lanes 64                ASSUMPTION: one adder per array row.
//  pag_lanes 16                ASSUMPTION: 16 exp-and-accumulate units.
//  hbm_channels 8, 32 GB/s     ASSUMPTION: one HBM2 stack (256 GB/s), as
//                              the Token-Picker preset.
//  dram_latency_s 60e-9        ASSUMPTION, as the other HBM2 presets.
//  hashes / widths             cta_0, cta_0.5, cta_1: the slides' accuracy
//                              settings. The slides do not give the hash
//                              parameters: 8 hashes per level (ASSUMPTION)
//                              and level-1 widths (queries and keys/values
//                              alike) 0.6, 1.0, 1.8 chosen so that the
//                              measured RL/RA on the token generator's
//                              GPT-2-medium-like tokens (d_model 1024,
//                              n = 1024, CALIBRATED) fall near the slides'
//                              averages; level 2 (residuals) 2.0: coarse,
//                              the residuals are the small per-token
//                              context parts (README, "CTA";
//                              tests/cta_test.cc asserts the measured
//                              values). dense: compress off (w -> 0).
//  mac_pj 0.5                  ASSUMPTION: 16-bit MAC plus operand
//                              registers, 28 nm class.
//  exp_pj 2.0                  ASSUMPTION: piecewise exp + accumulate.
//  aux_op_pj 0.1               ASSUMPTION: CIM/CAG add or lookup.
//  static_power_w 0.5          ASSUMPTION: leakage + SRAM buffers.
//  dram_pj_per_bit 3.9         [FGDRAM].
//
// ANALYTIC tables: the slides' averages (CTA-0: RL 58.3%, RA 35.2%;
// CTA-0.5: 52.2%, 27.5%; CTA-1: 44.4%, 18.4%) converted to a = k0 / n and
// b = (k1 + k2) / n by RL = (a + 2b) / 3 and RA = a b
// (CtaFractionsFromReductions, the root with the larger b); dense: 1, 1.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "devices/cta/cta_device.h"
#include "devices/presets.h"

namespace servesim::devices {
namespace {

constexpr absl::string_view kCommon = R"pb(
  sa_rows: 64
  sa_cols: 64
  clock_hz: 1e9
  operand_bits: 16
  cim_tokens_per_cycle: 1
  cag_lanes: 64
  pag_lanes: 16
  hbm_channels: 8
  channel_bandwidth_bytes_per_s: 32e9
  dram_latency_s: 60e-9
  query_hashes: 8
  kv1_hashes: 8
  kv2_hashes: 8
  mac_pj: 0.5
  exp_pj: 2.0
  aux_op_pj: 0.1
  static_power_w: 0.5
  dram_pj_per_bit: 3.9
)pb";

constexpr absl::string_view kPresets[][2] = {
    {"cta_0", R"pb(compress: true query_width: 0.6 kv1_width: 0.6 kv2_width: 2.0)pb"},
    {"cta_0.5", R"pb(compress: true query_width: 1.0 kv1_width: 1.0 kv2_width: 2.0)pb"},
    {"cta_1", R"pb(compress: true query_width: 1.8 kv1_width: 1.8 kv2_width: 2.0)pb"},
    {"dense", R"pb(compress: false query_width: 0.6 kv1_width: 0.6 kv2_width: 2.0)pb"},
};

const std::map<std::string, servesim::v1::CtaSpec>& Table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, servesim::v1::CtaSpec>();
    for (const auto& [name, text] : kPresets) {
      servesim::v1::CtaSpec spec;
      ParseBuiltInPreset("cta", name, absl::StrCat(text, " ", kCommon), &spec);
      t->emplace(std::string(name), std::move(spec));
    }
    return t;
  }();
  return *table;
}

}  // namespace

absl::StatusOr<servesim::v1::CtaSpec> CtaPreset(absl::string_view name) {
  auto it = Table().find(std::string(name));
  if (it == Table().end()) {
    return absl::NotFoundError(absl::StrCat("unknown cta preset \"", name,
                                            "\"; known: ", absl::StrJoin(CtaPresetNames(), ", ")));
  }
  return it->second;
}

std::vector<std::string> CtaPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Table()) names.push_back(name);
  return names;
}

std::array<double, 2> CtaFractionsFromReductions(double rl, double ra) {
  // 2 b^2 - 3 RL b + RA = 0.
  const double disc = std::max(0.0, 9 * rl * rl - 8 * ra);
  const double b = (3 * rl + std::sqrt(disc)) / 4;
  return {3 * rl - 2 * b, b};
}

absl::StatusOr<std::array<double, 2>> CtaAnalyticFractions(absl::string_view preset) {
  static const std::map<std::string, std::array<double, 2>> kTable = {
      {"cta_0", CtaFractionsFromReductions(0.583, 0.352)},
      {"cta_0.5", CtaFractionsFromReductions(0.522, 0.275)},
      {"cta_1", CtaFractionsFromReductions(0.444, 0.184)},
      {"dense", {1.0, 1.0}},
  };
  auto it = kTable.find(std::string(preset));
  if (it == kTable.end()) {
    return absl::NotFoundError(absl::StrCat(
        "cta: no ANALYTIC table for preset \"", preset,
        "\" (tables: cta_0, cta_0.5, cta_1, dense); use PRUNE_FIDELITY_CALIBRATED or FULL"));
  }
  return it->second;
}

}  // namespace servesim::devices
