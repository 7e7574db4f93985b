// AttAcc hardware presets: one table per GEMV-unit placement of AttAcc §4.1,
// sharing one HBM3 description. Every AttAccSpec field is set.
//
// Sources:
//  [P]     Park et al., "AttAcc! Unleashing the Power of PIM for Batched
//          Transformer-based Generative Model Inference", ASPLOS'24.
//  [SIM]   The authors' simulator, github.com/scale-snu/attacc_simulator:
//          pim_ramulator_src/HBM3-PIM.cpp (organisation and timing presets),
//          pim_ramulator_src/trace_gen/gen_trace_attacc_{bank,bg,buffer}.py
//          (command streams), src/config.py (ENERGY_TABLE, BW_SCALE).
//  [FGDRAM] O'Connor et al., "Fine-Grained DRAM", MICRO'17: the per-bit
//          energies [P] §7.1 and [SIM] config.py use.
//
// Figure by figure:
//  stacks 40                  [P] §7.1: DGX+AttAccs uses 40 HBM3 stacks for
//                             AttAcc; 40 x 16 GiB = 640 GiB.
//  power_constraint true      [P] §4.1 (IDD7 budget); §7.1's 242 TB/s = 9x.
//  attention_level_pipelining true  [P] §6.1.
//  organisation               [SIM] HBM3-PIM.cpp org preset HBM3_8Gb_2R: per
//                             channel 2 pCH x 2 ranks x 4 BGs x 4 banks x
//                             16384 rows x 32 columns; 32 B access
//                             granularity ([SIM] trace_gen prefetch_size),
//                             so a row is 1024 B. 16 legacy channels per
//                             8-Hi stack ([SIM] trace_gen n_channel; JESD238).
//  tck_s 769e-12              [SIM] HBM3_5.2Gbps: tCK = 1e6 / (5200 / 4) ps
//                             (QDR DQ) = 769 ps. [P] §7.1: 5.2 Gb/s pins.
//  t_rcd 19, t_rp 19          [SIM] HBM3_5.2Gbps nRCDRD, nRP.
//  t_ccds 2, t_ccdl 4         [SIM] HBM3_5.2Gbps nCCDS, nCCDL.
//  t_refi 5070                [SIM] HBM3_5.2Gbps nREFI.
//  t_rfc 455                  tRFC = 350 ns for 8 Gb dies ([SIM] tRFC_TABLE);
//                             350 / 0.769 = 455.1 cycles. (Ramulator's JEDEC
//                             rounding would give 456; the 0.2% difference
//                             is below anything this model resolves.)
//  t_pim_move 4               [SIM] trace_gen header: "WRGB: 4tCK, MVSB:
//                             4tCK, MVGB: 4tCK".
//  gemv_units_active_per_pch  [P] §4.1: 18 bank units per pCH (internal
//                             bandwidth 9x external) and 6 BG units (3x)
//                             under the power budget; the buffer placement
//                             has one unit per pCH. [SIM] config.py BW_SCALE
//                             {BA 9, BG 3, BUFFER 1} with the constraint.
//  multipliers_per_unit 16    [P] §5.1: 16 FP16 multipliers per GEMV unit.
//  gemv_clock_hz 666e6        [P] §7.1: GEMV units at 666 MHz (tCCDS 1.5 ns).
//  softmax_clock_hz 1.3e9     [P] §7.1: softmax units at 1.3 GHz.
//  softmax_lanes 256          [P] §5.1: 256 FP32 exp / add / mul units.
//  softmax_fill_cycles 13     ASSUMPTION fitted to [SIM] trace_gen's "SFM:
//                             16tCK (for L = 256)": the unit makes 3 passes
//                             (max, exp + sum, normalise) of ceil(L / 256)
//                             beats, so L = 256 is 3 beats and the remaining
//                             16 - 3 = 13 softmax cycles are pipeline fill
//                             (comparator/adder trees, the divider). 16
//                             softmax cycles at 1.3 GHz are 12.31 ns = 16.005
//                             tCK, which JEDEC rounding (nCK = floor(t/tCK +
//                             0.974), JESD and Ramulator) makes 16 command
//                             cycles. L = 2048: 3 x 8 + 13 = 37 cycles.
//  softmax_buffer_bytes 512 KiB  [P] §5.1: a 512KB buffer.
//  energies (pJ/bit)          [FGDRAM] via [P] §7.1 and [SIM] config.py:
//                             ACT/PRE 0.11, cell RD/WR 0.44, column decoder
//                             to BG mux 1.01, BG mux to GIO 1.23, TSV 0.5,
//                             silicon interposer 0.3.
//  mac_energy_pj 0.32         [SIM] config.py ENERGY_TABLE PIM 'alu' (fp16
//                             MAC, 7 nm ASAP7 synthesis, [P] §7.1).
//  softmax_op_energy_pj 0.16  ASSUMPTION: [SIM] devices.py charges softmax
//                             FLOPs at 'alu' / 2 = 0.16 pJ each; we charge
//                             each fp32 softmax element-op (compare, subtract,
//                             exp, add, multiply) the same. An fp32 op likely
//                             costs more than half an fp16 MAC; at 5 ops per
//                             key it stays < 0.1% of the op's DRAM energy.
//  background_power_w_per_stack 0.653  ASSUMPTION: no HBM3 currents are
//                             public (JESD238 is not); DRAMsim3's HBM2 8Gb
//                             x128 config gives, per 128-bit channel at VDD
//                             1.2 V, IDD3N 55 mA (active standby: 66 mW) and
//                             IDD5AB 250 mA over tRFC 260 of tREFI 3,900 ns
//                             (refresh: (250 - 55) mA x 1.2 V x 260 / 3,900 =
//                             15.6 mW). An HBM3 stack's 1,024-bit interface
//                             is eight such channels: 8 x 81.6 mW. The
//                             authors' simulator counts no background power.
//  link nvlink3               [P] §4 (xPUs and AttAccs joined by NVLink-class
//                             links); [SIM] make_pim_config's default
//                             interface NVLINK3. Figures from LinkPreset
//                             ("nvlink3") in devices/presets.cc.
#include "devices/presets.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "devices/attacc/attacc_device.h"

namespace servesim::devices {
namespace {

constexpr absl::string_view kHbm3Common = R"pb(
  stacks: 40
  power_constraint: true
  attention_level_pipelining: true
  channels: 16
  pseudo_channels: 2
  ranks: 2
  bank_groups: 4
  banks_per_group: 4
  rows_per_bank: 16384
  row_bytes: 1024
  column_bytes: 32
  tck_s: 769e-12
  t_rcd: 19
  t_rp: 19
  t_ccds: 2
  t_ccdl: 4
  t_refi: 5070
  t_rfc: 455
  t_pim_move: 4
  multipliers_per_unit: 16
  gemv_clock_hz: 666e6
  softmax_clock_hz: 1.3e9
  softmax_lanes: 256
  softmax_fill_cycles: 13
  softmax_buffer_bytes: 524288
  act_pre_pj_per_bit: 0.11
  cell_rdwr_pj_per_bit: 0.44
  coldec_to_bgmux_pj_per_bit: 1.01
  bgmux_to_gio_pj_per_bit: 1.23
  tsv_pj_per_bit: 0.5
  interposer_pj_per_bit: 0.3
  mac_energy_pj: 0.32
  softmax_op_energy_pj: 0.16
  background_power_w_per_stack: 0.653
)pb";

constexpr absl::string_view kAttAccPresets[][2] = {
    // [P] §4.1: the chosen design; 18 of 32 bank units per pCH stream.
    {"attacc_bank", R"pb(placement: ATTACC_PLACEMENT_BANK gemv_units_active_per_pch: 18)pb"},
    // [P] §4.1: 6 of 8 BG units per pCH under the power budget.
    {"attacc_bg", R"pb(placement: ATTACC_PLACEMENT_BG gemv_units_active_per_pch: 6)pb"},
    // [P] §4.1: one unit per pCH on the buffer die.
    {"attacc_buffer", R"pb(placement: ATTACC_PLACEMENT_BUFFER gemv_units_active_per_pch: 1)pb"},
};

const std::map<std::string, servesim::v1::AttAccSpec>& Table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, servesim::v1::AttAccSpec>();
    const auto link = LinkPreset("nvlink3");
    for (const auto& [name, text] : kAttAccPresets) {
      servesim::v1::AttAccSpec spec;
      ParseBuiltInPreset("attacc", name, absl::StrCat(text, " ", kHbm3Common), &spec);
      if (!link.ok()) {  // compiled in: a programming error every test run catches
        std::fprintf(stderr, "servesim: attacc preset '%s': no built-in nvlink3 link\n",
                     std::string(name).c_str());
        std::abort();
      }
      *spec.mutable_link() = *link;
      t->emplace(std::string(name), std::move(spec));
    }
    return t;
  }();
  return *table;
}

}  // namespace

absl::StatusOr<servesim::v1::AttAccSpec> AttAccPreset(absl::string_view name) {
  const auto& table = Table();
  auto it = table.find(std::string(name));
  if (it == table.end()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown attacc preset \"", name, "\"; known: ", absl::StrJoin(AttAccPresetNames(), ", ")));
  }
  return it->second;
}

std::vector<std::string> AttAccPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Table()) names.push_back(name);
  return names;
}

}  // namespace servesim::devices
