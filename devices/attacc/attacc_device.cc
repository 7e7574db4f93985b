// AttAcc device: the cycle model, byte/energy accounting and functional
// kernel the header describes. Decisions the header leaves open, each
// marked DECISION below:
//
//  - Placement geometry (DECISION, from [SIM] gen_trace_attacc_{bank,bg,
//    buffer}.py): within a channel, L is split `l_split` ways and d_head
//    `d_split` ways among a pCH's units:
//        bank:   l_split = pCH x ranks x BGs, d_split = banks per BG,
//                one bank per unit, a column per unit every t_ccdl;
//        BG:     l_split = pCH x ranks x BGs, d_split = 1, four banks per
//                unit (row switches hidden across them), every t_ccdl;
//        buffer: l_split = pCH, d_split = 1, every bank of the pCH behind
//                the unit, a column every t_ccds (the pCH data path).
//    Columns per unit and GEMV = ceil(L / l_split) x ceil(d_head / (d_split
//    x lanes)) (lanes = column_bytes / element bytes): the MAC command count
//    of the authors' streams. Positions are interleaved over the l_split
//    slots (position j in slot j mod l_split), d_head columns of `lanes`
//    elements over the d_split banks (column group g in bank g mod d_split).
//  - Power cap (DECISION): a pCH's U units do their columns A at a time
//    (A = gemv_units_active_per_pch with the constraint, U without), a
//    fluid rotation: stream = columns x column_cycles x U / A. Internal
//    bandwidth is then pCHs x A x column_bytes / column time: 9x / 3x / 1x
//    the external (pCHs x column_bytes / t_ccds) with the cap, 16x / 4x /
//    1x without, as [P] §4.1 and [SIM] config.py BW_SCALE state.
//    A column also needs ceil(lanes / (multipliers x 2 / element bytes))
//    GEMV-clock cycles (int8: two products per fp16 multiplier, ASSUMPTION
//    following [SIM]'s n_mac = column bytes / element bytes); at 666 MHz
//    that never binds for the presets (1.50 ns < t_ccds = 1.54 ns).
//  - ACT/PRE: rows per unit and GEMV = ceil(bytes per unit / row_bytes).
//    The first ACT (t_rcd) is exposed per GEMV (score and context read
//    different rows); the later row switches (t_rp + t_rcd each) only when
//    every unit of the pCH streams at once AND a unit has one bank (bank
//    placement without the power cap): otherwise idle banks open rows while
//    others stream ([P] §4.1).
//  - Data movement (DECISION): WR_GB, MV_SB, MV_GB, RD_SB each occupy
//    t_pim_move cycles ([SIM] trace_gen header). The authors' stream
//    interleaves score MV_SB groups with later MAC groups, so only the last
//    group is exposed: score MV_SB = (BG accumulators per pCH for bank/BG,
//    1 for buffer) commands; context MV_SB = banks x ranks / ranks / 1
//    ([SIM] counts); RD_SB = ceil(d_head x 2 B / column_bytes). MV_GB =
//    (l_split / pCH) x ceil(L / (l_split x lanes)) commands ([SIM]); it runs
//    on the pCH data path, which the MAC stream does not use ([SIM]
//    HBM3-PIM.cpp: "data paths are different"), so it delays its own head's
//    context but does not occupy the GEMV units: the authors issue it
//    inside the next head's score window.
//  - Schedule (DECISION): with attention_level_pipelining (the default)
//    per channel the GEMV units run the list S0, S1,
//    C0, S2, C1, ..., S(n-1), C(n-2), C(n-1) (S = WR_GB + score MACs +
//    exposed MV_SB, C = context MACs + exposed MV_SB + RD_SB), each task at
//    max(units free, inputs ready): the score of head i+1 overlaps the
//    softmax of head i ([P] §6.1; the GEMV buffers are double-buffered,
//    §5.1). The authors' generator pairs heads (S0 S1 C0 C1), which exposes
//    one softmax per odd trailing head; the rolling list exposes it only
//    for a channel's last head when heads are short. Context i is ready
//    at (softmax end + MV_GB); the stack's softmax unit serves requests
//    FIFO in arrival order (arrival = end of S), one head at a time. This
//    is simulated exactly per stack: every channel runs its list until a
//    context waits for an uncommitted softmax; the smallest blocking
//    arrival is then committed (no later request can arrive earlier),
//    O(heads log channels). Without attention_level_pipelining the list
//    is S0, C0, S1, C1, ...: every softmax and MV_GB is exposed.
//  - Heads: KV head of query head h = h / (heads / kv_heads). A GEMV unit
//    holds one input vector, so every QUERY head runs its own score and
//    context GEMV over its KV head's K and V: cells are read per query head
//    (DECISION; GQA saves capacity, not PIM bandwidth). A KV head's K/V
//    live in one channel, so its query heads (those in [head_begin,
//    head_end)) run on that channel one after another; channels are
//    assigned per KV head, longest first (L, then sequence, then KV head),
//    to the least-loaded channel (GEMV cycles), ties to the lowest.
//  - Stack placement: kv_head_stack if given; else every KV head of every
//    sequence (not only those in the head range, so head groups of one
//    iteration agree), in sequence order, goes to the stack with the least
//    K/V tokens so far, ties to the lowest index ([P] §4.2).
//  - Refresh: the op's time is scaled by t_refi / (t_refi - t_rfc).
//  - Bytes per level (per query head; vb = 2-byte fp16 values for q,
//    partial sums, scores, probabilities and outputs; padded sizes):
//      cells (dram_bytes): 2 x columns x column_bytes x U x pCHs.
//      bank:  BG bus: q (broadcast, counted once per pCH) + score partial
//             per bank and position + probabilities per BG + context
//             partials per bank; TSV: q + scores after the BG accumulators
//             + probabilities + context partials (reduced on the buffer
//             die).
//      BG:    BG bus: the cells' bytes; TSV: as bank (the BG unit's I/O).
//      buffer: BG bus and TSV: the cells' bytes (vectors stay on the buffer
//             die).
//      external: q in and output out (d_head x 2 B each); plus, once per KV
//             head (in the op holding its first query head), the new token's
//             K and V written (2 x d_head x element bytes), which also cross
//             the TSV and BG bus and are written to cells.
//    Energy: ACT/PRE per row opened (0.11 pJ/bit x row_bytes x 8: opening a
//    row charges the whole row; equal to FGDRAM's per-bit charge for rows
//    read in full), cell RD/WR per cell byte, column decoder -> BG mux per
//    BG-bus byte, BG mux -> GIO + TSV per TSV byte, interposer per external
//    byte; MACs x mac_energy; 5 softmax element-ops per key (max, subtract,
//    exp, sum, normalise) x softmax_op_energy. FLOPs: 2 per MAC executed
//    (padded lanes included) + 5 per key.
//    Links are not charged here: external_bytes tells the planner what
//    crosses spec().link() to the xPUs.
//  [P] = the AttAcc paper, [SIM] = scale-snu/attacc_simulator (presets.cc).
#include "devices/attacc/attacc_device.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/same_key.h"
#include "common/status_macros.h"
#include "devices/interrupt.h"
#include "devices/model.h"
#include "devices/presets.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "google/protobuf/descriptor.h"

namespace servesim::devices {
namespace {

using servesim::v1::AttAccSpec;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// JEDEC convention for a duration in clock cycles (JESD79/JESD238;
// Ramulator's JEDEC_rounding): nCK = floor(t / tCK + 0.974).
double JedecCycles(double t_s, double tck_s) { return std::floor(t_s / tck_s + 0.974); }

const char* PlacementName(servesim::v1::AttAccPlacement p) {
  switch (p) {
    case servesim::v1::ATTACC_PLACEMENT_BANK:
      return "bank";
    case servesim::v1::ATTACC_PLACEMENT_BG:
      return "bank group";
    case servesim::v1::ATTACC_PLACEMENT_BUFFER:
      return "buffer";
    default:
      return "unspecified";
  }
}

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kAllReduce:
      return "all-reduce";
    case OpKind::kMoe:
      return "moe";
  }
  return "unknown";
}

constexpr double kMaxStackBytes = 1099511627776.0;  // 2^40

// A stack's capacity: the product of its geometry.
double StackBytesOf(const AttAccSpec& a) {
  return static_cast<double>(a.channels()) * a.pseudo_channels() * a.ranks() * a.bank_groups() *
         a.banks_per_group() * a.rows_per_bank() * a.row_bytes();
}
constexpr int64_t kMaxHeadItems = int64_t{1} << 28;

absl::Status Bad(absl::string_view field, double v, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("attacc device: ", field, " = ", v, "; expected ", expected));
}

// A winner tree over n keys it holds itself: Min() is the index of the
// smallest key, ties to the lowest index, MinKey() its key; Set(i, v)
// replays leaf i's log2(n) matches. Each node keeps its winner's key
// beside its index, so a replay reads only the siblings on its path, never
// a key through an index: a chain of branch-free selects (the loads and
// arrival times it ranks are full of ties, on which branches mispredict)
// without dependent loads.
class MinTree {
 public:
  // n >= 1 leaves, keys v[0..n).
  void Reset(const double* v, int32_t n) {
    leaves_ = 1;
    while (leaves_ < n) leaves_ *= 2;
    // Padding leaves hold +infinity (index n): they never beat a real leaf.
    node_.assign(2 * leaves_, Node{std::numeric_limits<double>::infinity(), n});
    for (int32_t i = 0; i < n; ++i) node_[leaves_ + i] = {v[i], i};
    for (int32_t j = leaves_ - 1; j >= 1; --j) Match(j);
  }
  int32_t Min() const { return node_[1].index; }
  double MinKey() const { return node_[1].key; }
  double Key(int32_t i) const { return node_[leaves_ + i].key; }
  void Set(int32_t i, double v) {
    int32_t j = leaves_ + i;
    Node w{v, i};
    node_[j] = w;
    for (; j > 1; j /= 2) {
      const Node& sib = node_[j ^ 1];
      // The left child wins ties; j odd is a right child. Bitwise, not
      // logical, operators and a masked select: no branch to mispredict.
      const int32_t take = static_cast<int32_t>(sib.key < w.key) |
                           (static_cast<int32_t>(sib.key == w.key) & (j & 1));
      w.index ^= (w.index ^ sib.index) & -take;
      w.key = std::min(w.key, sib.key);
      node_[j / 2] = w;
    }
  }

 private:
  struct Node {
    double key;
    int32_t index;
  };
  void Match(int32_t j) {
    const Node& a = node_[2 * j];  // a's leaves < b's
    const Node& b = node_[2 * j + 1];
    node_[j] = b.key < a.key ? b : a;
  }
  int32_t leaves_ = 1;
  std::vector<Node> node_;
};

// Stacks with at most this many items (and no more than one per channel)
// take the schedule's closed-form fast path.
constexpr int32_t kMaxFastItems = 64;
constexpr int32_t kMaxFastStacks = 1024;  // stack arrays of the one-pass fast path

// std::stable_sort, with insertion sort for the short lists of a decode
// batch (no temporary buffer, a few comparisons).
template <typename Less>
void StableSortSmall(std::vector<int32_t>* v, Less less) {
  if (v->size() > 32) {
    std::stable_sort(v->begin(), v->end(), less);
    return;
  }
  for (size_t i = 1; i < v->size(); ++i) {
    const int32_t x = (*v)[i];
    size_t j = i;
    for (; j > 0 && less(x, (*v)[j - 1]); --j) (*v)[j] = (*v)[j - 1];
    (*v)[j] = x;
  }
}

float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

// Pairwise (adder-tree) sum of a[0..n), each add rounded by `round`.
template <typename Round>
float TreeSum(float* a, int64_t n, Round round) {
  while (n > 1) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) a[i] = round(a[2 * i] + a[2 * i + 1]);
    if (n % 2 == 1) a[half] = a[n - 1];
    n = half + n % 2;
  }
  return n == 1 ? a[0] : 0.0f;
}

}  // namespace

// -------------------------------------------------------------- Create ----

absl::StatusOr<std::unique_ptr<Device>> AttAccDevice::Create(const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_attacc()) {
    return absl::InvalidArgumentError("attacc device: DeviceSpec.attacc is not set");
  }
  const AttAccSpec& a = spec.attacc().attacc();
  // Every optional field must be set (a resolved spec, e.g. AttAccPreset's).
  RETURN_IF_ERROR(RequireResolved(a, "attacc", "AttAccPreset"));
  const auto& link = a.link();
  if (!link.has_bandwidth_bytes_per_s() || !link.has_latency_s() ||
      !link.has_energy_pj_per_byte()) {
    return absl::InvalidArgumentError(
        "attacc device: link is not resolved; expected bandwidth_bytes_per_s, "
        "latency_s and energy_pj_per_byte set (e.g. the nvlink3 preset)");
  }
  if (a.placement() == servesim::v1::ATTACC_PLACEMENT_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "attacc device: placement = ATTACC_PLACEMENT_UNSPECIFIED; expected "
        "ATTACC_PLACEMENT_BANK, _BG or _BUFFER");
  }
  const auto dtype = spec.attacc().dtype();
  // BF16 has FP16's width: its KV takes the same bytes and a bf16 MAC unit
  // is no larger than the paper's fp16 one (an assumption; AttAcc §5 gives
  // fp16 lanes). An FP8 KV cache takes INT8's byte per element and its
  // lanes (likewise an assumption: the paper has no 8-bit float unit).
  if (dtype != servesim::v1::DTYPE_UNSPECIFIED && dtype != servesim::v1::DTYPE_FP16 &&
      dtype != servesim::v1::DTYPE_BF16 && dtype != servesim::v1::DTYPE_INT8 &&
      dtype != servesim::v1::DTYPE_FP8) {
    return Bad("dtype", dtype, "DTYPE_FP16, DTYPE_BF16, DTYPE_INT8 or DTYPE_FP8");
  }
  const int64_t elem = DTypeBytes(dtype);
  // The geometry: each field within 4-8x of HBM3's (16 channels, 2 pseudo
  // channels, 2 ranks, 4 x 4 banks, 16,384 rows of 1 KiB, 32-byte columns)
  // and of AttAcc's 40 stacks, so that the per-channel and per-stack arrays
  // of Estimate and the buffers of Execute stay small and every count fits
  // an integer; on an agent these come from the client.
  for (auto [v, name, hi] :
       {std::tuple<int64_t, const char*, int64_t>{a.stacks(), "stacks", 4096},
        {a.channels(), "channels", 64},
        {a.pseudo_channels(), "pseudo_channels", 8},
        {a.ranks(), "ranks", 16},
        {a.bank_groups(), "bank_groups", 16},
        {a.banks_per_group(), "banks_per_group", 16},
        {a.rows_per_bank(), "rows_per_bank", 1 << 20},
        {a.row_bytes(), "row_bytes", 1 << 16},
        {a.column_bytes(), "column_bytes", 1 << 12}}) {
    if (v < 1 || v > hi) return Bad(name, static_cast<double>(v), absl::StrCat("in [1, ", hi, "]"));
  }
  for (auto [v, name] : {std::pair<int64_t, const char*>{a.t_ccds(), "t_ccds"},
                         {a.t_ccdl(), "t_ccdl"},
                         {a.t_refi(), "t_refi"},
                         {a.t_pim_move(), "t_pim_move"},
                         {a.multipliers_per_unit(), "multipliers_per_unit"},
                         {a.softmax_lanes(), "softmax_lanes"},
                         {a.softmax_buffer_bytes(), "softmax_buffer_bytes"}}) {
    if (v < 1) return Bad(name, static_cast<double>(v), ">= 1");
  }
  // A stack's capacity, the product of the geometry: at most 1 TiB (64
  // times HBM3's 16 GiB), which keeps block and row counts far inside an
  // integer.
  const double stack_bytes = StackBytesOf(a);
  if (stack_bytes > kMaxStackBytes) {
    return Bad("stack capacity", stack_bytes,
               "at most 2^40 bytes (1 TiB): channels x pseudo_channels x ranks x bank_groups x "
               "banks_per_group x rows_per_bank x row_bytes");
  }
  for (auto [v, name] : {std::pair<int64_t, const char*>{a.t_rcd(), "t_rcd"},
                         {a.t_rp(), "t_rp"},
                         {a.t_rfc(), "t_rfc"},
                         {a.softmax_fill_cycles(), "softmax_fill_cycles"}}) {
    if (v < 0) return Bad(name, static_cast<double>(v), ">= 0");
  }
  if (a.t_rfc() >= a.t_refi()) {
    return Bad("t_rfc", a.t_rfc(), absl::StrCat("< t_refi (", a.t_refi(), ")"));
  }
  if (a.column_bytes() % elem != 0) {
    return Bad("column_bytes", a.column_bytes(),
               absl::StrCat("a multiple of the KV element size (", elem, " B)"));
  }
  if (a.row_bytes() % a.column_bytes() != 0) {
    return Bad("row_bytes", a.row_bytes(),
               absl::StrCat("a multiple of column_bytes (", a.column_bytes(), ")"));
  }
  // Finite, with upper limits: an infinite clock or bandwidth turned the
  // FF co-processing split into inf / inf = NaN.
  for (auto [v, name, hi] :
       {std::tuple<double, const char*, double>{a.tck_s(), "tck_s", 1e-6},
        {a.gemv_clock_hz(), "gemv_clock_hz", 1e12},
        {a.softmax_clock_hz(), "softmax_clock_hz", 1e12},
        {link.bandwidth_bytes_per_s(), "link.bandwidth_bytes_per_s", 1e15}}) {
    if (!(v > 0 && v <= hi)) return Bad(name, v, absl::StrCat("in (0, ", hi, "]"));
  }
  for (auto [v, name] :
       {std::pair<double, const char*>{a.act_pre_pj_per_bit(), "act_pre_pj_per_bit"},
        {a.cell_rdwr_pj_per_bit(), "cell_rdwr_pj_per_bit"},
        {a.coldec_to_bgmux_pj_per_bit(), "coldec_to_bgmux_pj_per_bit"},
        {a.bgmux_to_gio_pj_per_bit(), "bgmux_to_gio_pj_per_bit"},
        {a.tsv_pj_per_bit(), "tsv_pj_per_bit"},
        {a.interposer_pj_per_bit(), "interposer_pj_per_bit"},
        {a.mac_energy_pj(), "mac_energy_pj"},
        {a.softmax_op_energy_pj(), "softmax_op_energy_pj"},
        {a.background_power_w_per_stack(), "background_power_w_per_stack"},
        {link.latency_s(), "link.latency_s"},
        {link.energy_pj_per_byte(), "link.energy_pj_per_byte"}}) {
    if (!(v >= 0) || !std::isfinite(v)) return Bad(name, v, ">= 0 and finite");
  }
  int64_t units = 1;
  switch (a.placement()) {
    case servesim::v1::ATTACC_PLACEMENT_BANK:
      units = int64_t{a.ranks()} * a.bank_groups() * a.banks_per_group();
      break;
    case servesim::v1::ATTACC_PLACEMENT_BG:
      units = int64_t{a.ranks()} * a.bank_groups();
      break;
    default:
      units = 1;
  }
  if (a.gemv_units_active_per_pch() < 1 || a.gemv_units_active_per_pch() > units) {
    return Bad("gemv_units_active_per_pch", a.gemv_units_active_per_pch(),
               absl::StrCat("in [1, ", units, "] (GEMV units per pseudo channel for ",
                            PlacementName(a.placement()), " placement)"));
  }
  return std::unique_ptr<Device>(new AttAccDevice(spec.attacc()));
}

AttAccDevice::AttAccDevice(const servesim::v1::AttAccDeviceSpec& spec) : spec_(spec) {
  const AttAccSpec& a = spec_.attacc();
  elem_bytes_ = DTypeBytes(spec_.dtype());
  lanes_ = a.column_bytes() / elem_bytes_;
  const int64_t p = a.pseudo_channels(), r = a.ranks(), b = a.bank_groups(),
                k = a.banks_per_group();
  int64_t column_interval = a.t_ccdl();
  int64_t banks_per_unit = 1;
  switch (a.placement()) {
    case servesim::v1::ATTACC_PLACEMENT_BANK:
      units_per_pch_ = r * b * k;
      d_split_ = k;
      l_split_ = p * r * b;
      score_out_cmds_ = r * b;
      context_out_cmds_ = k * r;
      banks_per_unit = 1;
      break;
    case servesim::v1::ATTACC_PLACEMENT_BG:
      units_per_pch_ = r * b;
      d_split_ = 1;
      l_split_ = p * r * b;
      score_out_cmds_ = r * b;
      context_out_cmds_ = r;
      banks_per_unit = k;
      break;
    default:  // buffer
      units_per_pch_ = 1;
      d_split_ = 1;
      l_split_ = p;
      score_out_cmds_ = 1;
      context_out_cmds_ = 1;
      banks_per_unit = r * b * k;
      column_interval = a.t_ccds();
      break;
  }
  active_units_ = a.power_constraint()
                      ? std::min<int64_t>(a.gemv_units_active_per_pch(), units_per_pch_)
                      : units_per_pch_;
  hide_row_switch_ = !(active_units_ == units_per_pch_ && banks_per_unit == 1);
  // A column's MACs: ceil(lanes / products per GEMV cycle) GEMV cycles.
  const int64_t per_cycle =
      std::max<int64_t>(1, int64_t{a.multipliers_per_unit()} * 2 / elem_bytes_);
  const double mac_s = static_cast<double>(CeilDiv(lanes_, per_cycle)) / a.gemv_clock_hz();
  column_cycles_ = mac_s <= column_interval * a.tck_s() ? static_cast<double>(column_interval)
                                                        : mac_s / a.tck_s();
  refresh_factor_ = static_cast<double>(a.t_refi()) / (a.t_refi() - a.t_rfc());
}

// ------------------------------------------------------------ geometry ----

double AttAccDevice::StackBytes() const { return StackBytesOf(spec_.attacc()); }

double AttAccDevice::InternalBandwidth() const {
  const AttAccSpec& a = spec_.attacc();
  const double pchs = static_cast<double>(a.stacks()) * a.channels() * a.pseudo_channels();
  return pchs * active_units_ * a.column_bytes() / (column_cycles_ * a.tck_s());
}

double AttAccDevice::ExternalBandwidth() const {
  const AttAccSpec& a = spec_.attacc();
  const double pchs = static_cast<double>(a.stacks()) * a.channels() * a.pseudo_channels();
  return pchs * a.column_bytes() / (a.t_ccds() * a.tck_s());
}

double AttAccDevice::SoftmaxCycles(int64_t l) const {
  const AttAccSpec& a = spec_.attacc();
  const double beats = 3.0 * CeilDiv(l, a.softmax_lanes()) + a.softmax_fill_cycles();
  return JedecCycles(beats / a.softmax_clock_hz(), a.tck_s());
}

AttAccHeadCycles AttAccDevice::HeadCycles(int64_t l, int64_t d_head) const {
  AttAccHeadCycles h;
  if (l < 1 || d_head < 1) return h;
  const AttAccSpec& a = spec_.attacc();
  const int64_t n_pos = CeilDiv(l, l_split_);
  const int64_t n_dcol = CeilDiv(d_head, d_split_ * lanes_);
  const int64_t columns = n_pos * n_dcol;  // MAC commands per GEMV
  const double stream = static_cast<double>(columns) * column_cycles_ *
                        static_cast<double>(units_per_pch_) / active_units_;
  const int64_t rows = CeilDiv(columns * a.column_bytes(), a.row_bytes());
  const double act =
      a.t_rcd() + (hide_row_switch_ ? 0.0 : static_cast<double>(rows - 1) * (a.t_rp() + a.t_rcd()));
  const double move = a.t_pim_move();
  h.wr_gb = static_cast<double>(d_split_ * n_dcol) * move;
  h.score = stream + act;
  h.mv_sb = static_cast<double>(score_out_cmds_) * move;
  h.softmax = SoftmaxCycles(l);
  h.mv_gb =
      static_cast<double>((l_split_ / a.pseudo_channels()) * CeilDiv(l, l_split_ * lanes_)) * move;
  h.context = stream + act;
  h.out = static_cast<double>(context_out_cmds_ + CeilDiv(d_head * 2, a.column_bytes())) * move;
  h.mac_ab_commands = 2 * columns;
  h.rows_opened = 2 * rows;
  return h;
}

int64_t AttAccDevice::HeadMacs(int64_t l, int64_t d_head) const {
  if (l < 1 || d_head < 1) return 0;
  const int64_t columns = CeilDiv(l, l_split_) * CeilDiv(d_head, d_split_ * lanes_);
  return 2 * columns * lanes_ * units_per_pch_ * spec_.attacc().pseudo_channels();
}

double AttAccDevice::HeadCellBytes(int64_t l, int64_t d_head) const {
  if (l < 1 || d_head < 1) return 0;
  const int64_t columns = CeilDiv(l, l_split_) * CeilDiv(d_head, d_split_ * lanes_);
  return 2.0 * static_cast<double>(columns) * spec_.attacc().column_bytes() *
         static_cast<double>(units_per_pch_ * spec_.attacc().pseudo_channels());
}

DeviceDescription AttAccDevice::Describe() const {
  const AttAccSpec& a = spec_.attacc();
  DeviceDescription d;
  d.kind = "attacc";
  d.preset = a.preset();
  d.memory_bytes = a.stacks() * StackBytes();
  d.accepts = {OpKind::kAttention, OpKind::kGemm};
  d.lookahead_ok = true;  // pure; the memo only caches
  d.static_power_w = a.stacks() * a.background_power_w_per_stack();
  d.parameters = {
      {"placement", static_cast<double>(a.placement())},
      {"stacks", static_cast<double>(a.stacks())},
      {"stack_bytes", StackBytes()},
      {"internal_bandwidth_bytes_per_s", InternalBandwidth()},
      {"external_bandwidth_bytes_per_s", ExternalBandwidth()},
      {"power_constraint", a.power_constraint() ? 1.0 : 0.0},
      {"attention_level_pipelining", a.attention_level_pipelining() ? 1.0 : 0.0},
      {"gemv_units_per_pch", static_cast<double>(units_per_pch_)},
      {"gemv_units_active_per_pch", static_cast<double>(active_units_)},
      {"channels", static_cast<double>(a.channels())},
      {"pseudo_channels", static_cast<double>(a.pseudo_channels())},
      {"ranks", static_cast<double>(a.ranks())},
      {"bank_groups", static_cast<double>(a.bank_groups())},
      {"banks_per_group", static_cast<double>(a.banks_per_group())},
      {"row_bytes", static_cast<double>(a.row_bytes())},
      {"column_bytes", static_cast<double>(a.column_bytes())},
      {"tck_s", a.tck_s()},
      {"column_cycles", column_cycles_},
      {"refresh_factor", refresh_factor_},
      {"multipliers_per_unit", static_cast<double>(a.multipliers_per_unit())},
      {"gemv_clock_hz", a.gemv_clock_hz()},
      {"softmax_clock_hz", a.softmax_clock_hz()},
      {"softmax_lanes", static_cast<double>(a.softmax_lanes())},
      {"softmax_buffer_bytes", static_cast<double>(a.softmax_buffer_bytes())},
      {"mac_energy_pj", a.mac_energy_pj()},
      {"link_bandwidth_bytes_per_s", a.link().bandwidth_bytes_per_s()},
      {"link_latency_s", a.link().latency_s()},
      {"link_energy_pj_per_byte", a.link().energy_pj_per_byte()},
      {"element_bytes", static_cast<double>(elem_bytes_)},
  };
  return d;
}

// ------------------------------------------------------------ Estimate ----

absl::Status AttAccDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attacc device: ", ops.size(), " ops but ", costs.size(), " cost slots"));
  }
  // Per thread, so its vectors keep their storage from call to call; what
  // it remembers of the ops holds for one call only (ForCall).
  thread_local OwnPlacement own;
  own.ForCall();
  for (size_t i = 0; i < ops.size(); ++i) {
    switch (ops[i].kind) {
      case OpKind::kAttention:
        RETURN_IF_ERROR(AttentionCost(ops[i], &own, &costs[i]));
        break;
      case OpKind::kGemm:
        costs[i] = GemvCost(ops[i]);
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("attacc device: op ", i, " is ", OpKindName(ops[i].kind),
                         "; attacc accepts decode attention and feed-forward GEMV (gemm) ops"));
    }
  }
  return absl::OkStatus();
}

Cost AttAccDevice::GemvCost(const Op& op) const {
  Cost c;
  if (op.m <= 0 || op.n <= 0 || op.k <= 0) return c;
  const AttAccSpec& a = spec_.attacc();
  const double m = op.m, n = op.n, k = op.k;
  // m passes over the [k x n] weight slice at the pool's GEMV bandwidth.
  const double cells = m * k * n * elem_bytes_;
  const double vectors = (m * k + m * n) * 2;  // fp16 inputs in, outputs out
  c.time_s = cells / InternalBandwidth();
  c.cycles = c.time_s / a.tck_s();
  c.flops = 2 * m * n * k;
  c.dram_bytes = cells;
  switch (a.placement()) {
    case servesim::v1::ATTACC_PLACEMENT_BANK:
      c.bg_bus_bytes = vectors;
      c.tsv_bytes = vectors;
      break;
    case servesim::v1::ATTACC_PLACEMENT_BG:
      c.bg_bus_bytes = cells;
      c.tsv_bytes = vectors;
      break;
    default:
      c.bg_bus_bytes = cells;
      c.tsv_bytes = cells;
  }
  c.external_bytes = vectors;
  c.dram_energy_pj = 8 * (cells * (a.act_pre_pj_per_bit() + a.cell_rdwr_pj_per_bit()) +
                          c.bg_bus_bytes * a.coldec_to_bgmux_pj_per_bit() +
                          c.tsv_bytes * (a.bgmux_to_gio_pj_per_bit() + a.tsv_pj_per_bit()) +
                          c.external_bytes * a.interposer_pj_per_bit());
  c.compute_energy_pj = m * n * k * a.mac_energy_pj();
  return c;
}

AttAccDevice::LenFigures AttAccDevice::FiguresOf(int64_t l, int64_t dh) const {
  const AttAccSpec& a = spec_.attacc();
  const int64_t pch = a.pseudo_channels();
  const int64_t srcs = l_split_ / pch;  // L slots (BG accumulators) per pCH
  const double vb = 2;                  // bytes of an fp16 vector element
  const double padded_d = static_cast<double>(d_split_ * CeilDiv(dh, d_split_ * lanes_) * lanes_);
  LenFigures f;
  f.valid = true;
  f.l_key = {static_cast<int32_t>(CeilDiv(l, l_split_)),
             static_cast<int32_t>(CeilDiv(l, a.softmax_lanes())),
             static_cast<int32_t>(CeilDiv(l, l_split_ * lanes_))};
  const AttAccHeadCycles h = HeadCycles(l, dh);
  f.sc = {h.wr_gb + h.score + h.mv_sb, h.context + h.out, h.softmax, h.mv_gb};
  // Bytes per query head at each level (see the top of this file).
  const double n_pos = static_cast<double>(CeilDiv(l, l_split_));
  f.cell = HeadCellBytes(l, dh);
  const double scores = vb * pch * srcs * n_pos;  // after BG accumulators
  const double probs = vb * pch * srcs * n_pos;   // to each BG's units
  const double ctx_part = vb * pch * srcs * padded_d;
  const double q_in = vb * pch * padded_d;  // broadcast once per pCH
  switch (a.placement()) {
    case servesim::v1::ATTACC_PLACEMENT_BANK:
      f.bg = q_in + vb * pch * units_per_pch_ * n_pos + probs + ctx_part;
      f.tsv = q_in + scores + probs + ctx_part;
      break;
    case servesim::v1::ATTACC_PLACEMENT_BG:
      f.bg = f.cell;
      f.tsv = q_in + scores + probs + ctx_part;
      break;
    default:
      f.bg = f.cell;
      f.tsv = f.cell;
  }
  f.rows = static_cast<double>(h.rows_opened) * units_per_pch_ * pch;
  f.macs = static_cast<double>(HeadMacs(l, dh));
  return f;
}

absl::Status AttAccDevice::AttentionCost(const Op& op, OwnPlacement* own, Cost* cost) const {
  *cost = Cost{};
  const AttAccSpec& a = spec_.attacc();
  if (op.heads < 1 || op.kv_heads < 1 || op.d_head < 1 || op.heads % op.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attacc device: attention op has heads = ", op.heads, ", kv_heads = ", op.kv_heads,
        ", d_head = ", op.d_head, "; expected positive values with heads a multiple of kv_heads"));
  }
  const int64_t hb = op.head_begin;
  const int64_t he = op.head_end < 0 ? op.heads : op.head_end;
  if (hb < 0 || hb > he || he > op.heads) {
    return absl::InvalidArgumentError(absl::StrCat("attacc device: head range [", op.head_begin,
                                                   ", ", op.head_end, ") is not within [0, ",
                                                   op.heads, "]"));
  }
  const int64_t nseq = static_cast<int64_t>(op.seqs.size());
  // The general schedule counts query heads per stack and per channel in
  // int32: 2^28 items (sequences x query heads), a batch of 65,536 with
  // 4,096 heads, is the most a scenario can make and the most taken.
  if (nseq * (he - hb) > kMaxHeadItems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attacc device: attention op of ", nseq, " sequences x ", he - hb,
        " query heads = ", nseq * (he - hb), " head items; expected at most ", kMaxHeadItems));
  }
  for (int64_t s = 0; s < nseq; ++s) {
    const AttentionSeq& q = op.seqs[s];
    if (q.new_tokens != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("attacc runs decode attention only; prefill runs on the xPUs (seq ", s,
                       " has new_tokens = ", q.new_tokens, ")"));
    }
    if (q.past_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attacc device: seq ", s, " has past_tokens = ", q.past_tokens, "; expected >= 0"));
    }
  }
  const int64_t kvh_n = op.kv_heads;
  const bool placed = !op.kv_head_stack.empty();
  if (placed) {
    if (static_cast<int64_t>(op.kv_head_stack.size()) != nseq * kvh_n) {
      return absl::InvalidArgumentError(
          absl::StrCat("attacc device: kv_head_stack has ", op.kv_head_stack.size(),
                       " entries; expected seqs x kv_heads = ", nseq * kvh_n));
    }
  }
  // kv_head_stack's bounds: checked once per stack list (below, when the
  // memo meets the list for the first time), since a placed batch's stacks
  // repeat iteration after iteration and their check would cost more than
  // the rest of a memo hit.
  auto check_stacks = [&]() -> absl::Status {
    // Branch-free bounds first; the index only on failure.
    int32_t lo = 0, hi = 0;
    for (int32_t st : op.kv_head_stack) {
      lo = std::min(lo, st);
      hi = std::max(hi, st);
    }
    if (lo >= 0 && hi < a.stacks()) return absl::OkStatus();
    size_t i = 0;
    while (op.kv_head_stack[i] >= 0 && op.kv_head_stack[i] < a.stacks()) ++i;
    return absl::InvalidArgumentError(
        absl::StrCat("attacc device: kv_head_stack[", i, "] = ", op.kv_head_stack[i],
                     "; expected a stack index in [0, ", a.stacks(), ")"));
  };
  if (nseq == 0 || hb == he) return placed ? check_stacks() : absl::OkStatus();

  const int64_t group = op.heads / kvh_n;
  const int64_t dh = op.d_head;
  const int64_t kv_lo = hb / group, kv_hi = CeilDiv(he, group);
  const int64_t q_heads = he - hb;                         // per sequence
  const int64_t appended_kv = kv_hi - CeilDiv(hb, group);  // KV heads whose
                                                           // first query head is here
  const double vb = 2;  // bytes of an fp16 vector element

  // Per sequence: one query head's cycles (all its heads share L) and its
  // bytes per level; computed once per Estimate call for the head-group ops
  // that share the sequences.
  using SeqCycles = OwnPlacement::SeqCycles;
  if (own->per_seq_of != op.seqs.data() || own->per_seq_n != op.seqs.size() ||
      own->per_seq_dh != dh) {
    own->per_seq_of = op.seqs.data();
    own->per_seq_n = op.seqs.size();
    own->per_seq_dh = dh;
    own->per_seq.resize(nseq);
    own->seq_len.resize(nseq);
    own->l_key.resize(nseq);
    own->score_busy = own->softmax_busy = own->context_busy = 0;
    own->cells = own->rows = own->bg = own->tsv = own->ext = own->macs = own->sfm_ops = 0;
    // A sequence's figures depend on L only (and d_head): looked up in the
    // device's table by L, computed once per L.
    std::unique_lock<std::mutex> len_lock(len_mu_);
    if (len_dh_ != dh) {
      len_dh_ = dh;
      len_table_.clear();
    }
    // Each sequence's L moves on by one per step, so its slot is a new
    // cache line every call: ask for all of them before the first is read,
    // and the misses overlap instead of following one another.
    for (int64_t s = 0; s < nseq; ++s) {
      const size_t l = static_cast<size_t>(op.seqs[s].past_tokens + 1);
      if (l < len_table_.size()) __builtin_prefetch(&len_table_[l]);
    }
    LenFigures computed;  // for an L past the table (built once, not per sequence)
    for (int64_t s = 0; s < nseq; ++s) {
      const int64_t l = op.seqs[s].past_tokens + 1;
      own->seq_len[s] = l;
      const LenFigures* f = &computed;
      if (l < kLenTableMax) {
        if (l >= static_cast<int64_t>(len_table_.size())) {
          len_table_.resize(std::max<size_t>(l + 1, 2 * len_table_.size()));
        }
        LenFigures& slot = len_table_[l];
        if (!slot.valid) slot = FiguresOf(l, dh);
        f = &slot;
      } else {
        computed = FiguresOf(l, dh);
      }
      own->l_key[s] = f->l_key;
      own->per_seq[s] = f->sc;
      own->score_busy += f->sc.s;
      own->softmax_busy += f->sc.sfm;
      own->context_busy += f->sc.mv_gb + f->sc.c;
      own->cells += f->cell;
      own->rows += f->rows;
      own->bg += f->bg;
      own->tsv += f->tsv;
      own->ext += 2 * vb * dh;  // q in, output out
      own->macs += f->macs;
      own->sfm_ops += 5.0 * l;
    }
    len_lock.unlock();
    own->order.resize(nseq);
    std::iota(own->order.begin(), own->order.end(), 0);
    StableSortSmall(&own->order, [&](int32_t x, int32_t y) {
      return own->seq_len[x] > own->seq_len[y];
    });
    own->by_arrival = own->order;
    StableSortSmall(&own->by_arrival, [&](int32_t x, int32_t y) {
      return own->per_seq[x].s < own->per_seq[y].s;
    });
  }
  const std::vector<SeqCycles>& per_seq = own->per_seq;
  const std::vector<int64_t>& seq_len = own->seq_len;
  double score_busy = own->score_busy, softmax_busy = own->softmax_busy,
         context_busy = own->context_busy;
  const double cells = own->cells, rows = own->rows, bg = own->bg, tsv = own->tsv,
               ext = own->ext, macs = own->macs, sfm_ops = own->sfm_ops;
  const double qh = static_cast<double>(q_heads);
  score_busy *= qh;
  softmax_busy *= qh;
  context_busy *= qh;
  const double append = static_cast<double>(nseq) * appended_kv * 2.0 * dh * elem_bytes_;
  cost->dram_bytes = cells * qh;
  cost->bg_bus_bytes = bg * qh + append;
  cost->tsv_bytes = tsv * qh + append;
  cost->external_bytes = ext * qh + append;
  cost->flops = (2 * macs + sfm_ops) * qh;
  cost->compute_energy_pj = (macs * a.mac_energy_pj() + sfm_ops * a.softmax_op_energy_pj()) * qh;
  cost->dram_energy_pj = 8 * (rows * qh * a.row_bytes() * a.act_pre_pj_per_bit() +
                              (cost->dram_bytes + append) * a.cell_rdwr_pj_per_bit() +
                              cost->bg_bus_bytes * a.coldec_to_bgmux_pj_per_bit() +
                              cost->tsv_bytes * (a.bgmux_to_gio_pj_per_bit() + a.tsv_pj_per_bit()) +
                              cost->external_bytes * a.interposer_pj_per_bit());

  // ---- stack of every (sequence, KV head).
  const int32_t nstacks = a.stacks();
  const int32_t* stack_of = op.kv_head_stack.data();
  if (!placed) {
    if (own->seqs != op.seqs.data() || own->num_seqs != op.seqs.size() || own->kv_heads != kvh_n) {
      own->seqs = op.seqs.data();
      own->num_seqs = op.seqs.size();
      own->kv_heads = kvh_n;
      own->stack.resize(nseq * kvh_n);
      // key = tokens << bits | stack: the smallest key is the least-loaded
      // stack, ties to the lowest index (stacks <= 2^bits).
      int bits = 0;
      while ((int64_t{1} << bits) < nstacks) ++bits;
      std::vector<int64_t> key(nstacks);
      for (int32_t i = 0; i < nstacks; ++i) key[i] = i;
      for (int64_t s = 0; s < nseq; ++s) {
        const int64_t add = seq_len[s] << bits;
        for (int64_t kv = 0; kv < kvh_n; ++kv) {
          int64_t m[4] = {key[0], key[0], key[0], key[0]};
          int32_t i = 0;
          for (; i + 4 <= nstacks; i += 4) {
            for (int k = 0; k < 4; ++k) m[k] = std::min(m[k], key[i + k]);
          }
          for (; i < nstacks; ++i) m[0] = std::min(m[0], key[i]);
          const int64_t best = std::min(std::min(m[0], m[1]), std::min(m[2], m[3]));
          const int32_t st = static_cast<int32_t>(best & ((int64_t{1} << bits) - 1));
          own->stack[s * kvh_n + kv] = st;
          key[st] += add;
        }
      }
    }
    stack_of = own->stack.data();
  }

  // ---- the memos (see the header).
  const int32_t in_flight = a.attention_level_pipelining() ? 2 : 1;
  const std::array<int64_t, 6> geometry = {in_flight, dh, hb, he, op.heads, kvh_n};
  const int32_t nch = a.channels();
  const int32_t item_limit = std::min<int32_t>(nch, kMaxFastItems);
  std::unique_lock<std::mutex> memo_lock(memo_mu_);
  if (own->recent_of != op.seqs.data() || own->recent_n != op.seqs.size() ||
      own->recent_stacks != stack_of) {
    bool seen = false;
    const absl::Span<const int32_t> stacks(stack_of, static_cast<size_t>(nseq * kvh_n));
    own->stack_slot = FindStackList(stacks, kvh_n, placed ? op.kv_head_stack_id : 0, &seen);
    if (!seen && placed) {
      if (absl::Status st = check_stacks(); !st.ok()) {
        ForgetStackList(own->stack_slot);
        own->recent_of = nullptr;
        return st;
      }
    }
    own->stack_list_id = stack_lists_[own->stack_slot].id;
    own->recent_slot = FindRecentList(own->stack_list_id, own->l_key);
    own->recent_generation = recent_[own->recent_slot].generation;
    own->recent_of = op.seqs.data();
    own->recent_n = op.seqs.size();
    own->recent_stacks = stack_of;
  }
  RecentList* recent = &recent_[own->recent_slot];
  if (recent->generation == own->recent_generation) {
    for (const auto& [g, slowest] : recent->slowest) {
      if (SameKey(g, geometry)) {
        return FinishAttentionCost(slowest, score_busy, softmax_busy, context_busy, cost);
      }
    }
  }
  // Whether this op's head range fits the one-pass fast path below: known
  // per stack list (the stacks alone decide it), found out once. -1: the
  // list's slot went to another list meanwhile; ask the stacks again.
  int fast_items = -1;
  if (group == 1 && nstacks <= kMaxFastStacks) {
    StackList& sl = stack_lists_[own->stack_slot];
    if (sl.id == own->stack_list_id) {
      for (const auto& [range, ok] : sl.fast) {
        if (range[0] == kv_lo && range[1] == kv_hi) fast_items = ok ? 1 : 0;
      }
    }
    if (fast_items < 0) {
      int32_t items[kMaxFastStacks];
      std::fill_n(items, nstacks, 0);
      int32_t most = 0;
      for (int64_t s = 0; s < nseq; ++s) {
        for (int64_t kv = kv_lo; kv < kv_hi; ++kv) {
          most = std::max(most, ++items[stack_of[s * kvh_n + kv]]);
        }
      }
      fast_items = most <= item_limit ? 1 : 0;
      if (sl.id == own->stack_list_id && sl.fast.size() < kRecentGeometries) {
        sl.fast.push_back({{kv_lo, kv_hi}, fast_items == 1});
      }
    }
  }
  memo_lock.unlock();
  // With memo_mu_ held: keeps `slowest` for this op's list and geometry.
  auto remember = [&](double slowest) {
    RecentList& r = recent_[own->recent_slot];
    if (r.generation == own->recent_generation && r.slowest.size() < kRecentGeometries) {
      r.slowest.emplace_back(geometry, slowest);
    }
  };

  // ---- KV-head work items per stack, longest first (CSR).
  const std::vector<int32_t>& order = own->order;
  auto heads_of = [&](int64_t kv) {
    return std::min(he, (kv + 1) * group) - std::max(hb, kv * group);
  };
  // The fast path of the schedule below for every stack in one pass, when
  // every item is a single query head (one per KV head) and no stack gets
  // more than min(channels, kMaxFastItems) of them. A stack's items reach
  // its softmax unit in (score end, list position) order, and its list is
  // `order` by sequence, so walking the sequences in `by_arrival` order
  // visits each stack's items in the order the per-stack insertion sort
  // gives, with the same arithmetic: the same result, without the sort or
  // the per-stack lists. The slowest stack is the largest context end of
  // any item (a stack's ends only grow along its list, and the maximum of
  // maxima is the maximum).
  if (fast_items == 1) {
    double softmax_free[kMaxFastStacks];
    std::fill_n(softmax_free, nstacks, 0.0);
    // Four running maxima (max is exact in any order): one chain would
    // serialise every item on the max's latency. Named, not an array, so
    // they stay in registers.
    double m0 = 0, m1 = 0, m2 = 0, m3 = 0;
    for (int32_t s : own->by_arrival) {
      const SeqCycles& sc = per_seq[s];
      const int32_t* st_of = stack_of + s * kvh_n;
      auto item = [&](int64_t kv) {
        double& free = softmax_free[st_of[kv]];
        free = std::max(sc.s, free) + sc.sfm;
        return free + sc.mv_gb + sc.c;  // this order: the general path's sums
      };
      int64_t kv = kv_lo;
      for (; kv + 4 <= kv_hi; kv += 4) {
        m0 = std::max(m0, item(kv));
        m1 = std::max(m1, item(kv + 1));
        m2 = std::max(m2, item(kv + 2));
        m3 = std::max(m3, item(kv + 3));
      }
      for (; kv < kv_hi; ++kv) m0 = std::max(m0, item(kv));
    }
    const double slowest = std::max(std::max(m0, m1), std::max(m2, m3));
    memo_lock.lock();
    remember(slowest);
    return FinishAttentionCost(slowest, score_busy, softmax_busy, context_busy, cost);
  }
  // Scratch buffers are per thread and fully rewritten below: Estimate
  // stays pure and thread-safe without allocating on every call.
  thread_local std::vector<int32_t> stack_begin, stack_heads, item_seq, item_heads, cursor,
      item_ch, head_seq, ch_begin, ch_cursor;
  thread_local std::vector<double> blocked, load;
  stack_begin.assign(nstacks + 1, 0);
  stack_heads.assign(nstacks, 0);
  for (int64_t s = 0; s < nseq; ++s) {
    for (int64_t kv = kv_lo; kv < kv_hi; ++kv) {
      const int32_t st = stack_of[s * kvh_n + kv];
      ++stack_begin[st + 1];
      stack_heads[st] += static_cast<int32_t>(heads_of(kv));
    }
  }
  for (int32_t i = 0; i < nstacks; ++i) stack_begin[i + 1] += stack_begin[i];
  const int64_t nitems = stack_begin[nstacks];
  item_seq.resize(nitems);
  item_heads.resize(nitems);
  {
    cursor.assign(stack_begin.begin(), stack_begin.end() - 1);
    for (int32_t s : order) {
      for (int64_t kv = kv_lo; kv < kv_hi; ++kv) {
        const int32_t at = cursor[stack_of[s * kvh_n + kv]]++;
        item_seq[at] = s;
        item_heads[at] = static_cast<int32_t>(heads_of(kv));
      }
    }
  }

  // ---- per stack: channels, then the two-resource schedule.
  int32_t max_items = 0, max_heads = 0;
  for (int32_t st = 0; st < nstacks; ++st) {
    max_items = std::max(max_items, stack_begin[st + 1] - stack_begin[st]);
    max_heads = std::max(max_heads, stack_heads[st]);
  }
  head_seq.resize(max_heads);
  constexpr double kNotBlocked = std::numeric_limits<double>::infinity();
  blocked.assign(nch + 1, kNotBlocked);
  load.resize(nch);
  thread_local MinTree tree;
  ch_begin.assign(nch + 1, 0);
  ch_cursor.assign(nch, 0);
  // A channel's heads are head_seq[base, base + n); at most two are in
  // flight (between their score and their context), kept in a 2-slot ring.
  struct Chan {
    double g;           // GEMV units free
    double arrival[2];  // softmax request of head k in slot k & 1
    int32_t base, n, next_c;
  };
  thread_local std::vector<Chan> chans;
  chans.resize(nch);
  // Heads whose score may run before the oldest context: 2 with attention-
  // level pipelining (S0 S1 C0 S2 C1 ...), 1 without (S0 C0 S1 C1 ...):
  // `in_flight`, above.
  item_ch.resize(nitems);
  // The op's result is its slowest stack, so a stack that cannot be the
  // slowest needs no schedule: a branch and bound. The first pass assigns
  // every stack's items to channels (what bounds it), schedules the stacks
  // of the single-item path (cheap) and bounds the others from above; the
  // second schedules those in order of their bound, most first, until the
  // next bound lies below the slowest stack found. A stack's time is at
  // most its bound (see StackBound below), so the result is the one that
  // scheduling every stack gives, bit for bit: the bound carries a margin
  // of 1e-9 of itself, far above the rounding of either sum.
  struct Bounded {
    double bound;
    int32_t stack;
  };
  thread_local std::vector<Bounded> pending;
  thread_local std::vector<double> chan_tail;
  pending.clear();
  chan_tail.resize(nch);
  double slowest = 0;
  for (int32_t st = 0; st < nstacks; ++st) {
    const int32_t ib = stack_begin[st], ie = stack_begin[st + 1];
    if (ib == ie) continue;
    double stack_slowest = 0;
    bool single = ie - ib <= std::min<int32_t>(nch, kMaxFastItems);
    for (int32_t i = ib; i < ie && single; ++i) single = item_heads[i] == 1;
    if (single) {
      // At most one item per channel (item i on channel i), every item a
      // single query head: the list schedule reduces to: each channel's
      // score ends at s_i; the shared softmax unit serves them in order of
      // arrival (ties to the lower channel); the context follows. This is
      // the general schedule's result exactly, without its queues.
      const int32_t n = ie - ib;
      int32_t by_arrival[kMaxFastItems];
      for (int32_t i = 0; i < n; ++i) {
        // Insertion by (arrival, channel): stable for equal arrivals.
        const double a_i = per_seq[item_seq[ib + i]].s;
        int32_t j = i;
        while (j > 0 && per_seq[item_seq[ib + by_arrival[j - 1]]].s > a_i) {
          by_arrival[j] = by_arrival[j - 1];
          --j;
        }
        by_arrival[j] = i;
      }
      double softmax_free = 0;
      for (int32_t j = 0; j < n; ++j) {
        const SeqCycles& sc = per_seq[item_seq[ib + by_arrival[j]]];
        softmax_free = std::max(sc.s, softmax_free) + sc.sfm;
        stack_slowest = std::max(stack_slowest, softmax_free + sc.mv_gb + sc.c);
      }
      slowest = std::max(slowest, stack_slowest);
      continue;
    }
    // Longest first to the least-loaded channel (GEMV cycles), ties
    // lowest. Every load is positive (Create requires t_ccdl, t_pim_move >=
    // 1: a column and WR_GB take time), so item i < `used` lands on channel
    // i: only the first `used` channels ever get work, and the first `used`
    // picks need no search. Each channel's MV_GB total and the softmax
    // unit's whole work, for the bound below, are summed as the items are
    // assigned.
    const int32_t used = std::min<int32_t>(nch, ie - ib);
    double unit_work = 0;
    for (int32_t i = 0; i < used; ++i) {
      const SeqCycles& sc = per_seq[item_seq[ib + i]];
      item_ch[ib + i] = i;
      load[i] = 0.0 + item_heads[ib + i] * (sc.s + sc.c);
      chan_tail[i] = item_heads[ib + i] * sc.mv_gb;
      unit_work += item_heads[ib + i] * sc.sfm;
    }
    if (ib + used < ie) {
      tree.Reset(load.data(), used);
      for (int32_t i = ib + used; i < ie; ++i) {
        const int32_t c = tree.Min();
        item_ch[i] = c;
        const SeqCycles& sc = per_seq[item_seq[i]];
        tree.Set(c, tree.MinKey() + item_heads[i] * (sc.s + sc.c));
        chan_tail[c] += item_heads[i] * sc.mv_gb;
        unit_work += item_heads[i] * sc.sfm;
      }
      for (int32_t c = 0; c < used; ++c) load[c] = tree.Key(c);
    }
    // StackBound: a channel is idle only before a context whose softmax
    // has not ended, or whose result is still moving (MV_GB). From its
    // request's arrival (its score's end) until its softmax ends, the
    // stack's one softmax unit is busy without a break (it serves requests
    // in order of arrival, and every request before this one has arrived);
    // a channel's idle spells are disjoint, so together they hold at most
    // the unit's whole work B, plus the MV_GB of the channel's own heads.
    // A channel thus ends by its GEMV load + B + its heads' MV_GB.
    double bound = 0;
    for (int32_t c = 0; c < used; ++c) bound = std::max(bound, load[c] + chan_tail[c]);
    pending.push_back({(bound + unit_work) * (1 + 1e-9), st});
  }
  // Most first; among equal bounds the lower stack (any order gives the
  // same result; this one is the same on every run).
  std::sort(pending.begin(), pending.end(), [](const Bounded& x, const Bounded& y) {
    return x.bound > y.bound || (x.bound == y.bound && x.stack < y.stack);
  });
  for (const Bounded& b : pending) {
    if (b.bound < slowest) break;  // and so is every later bound
    const int32_t st = b.stack;
    const int32_t ib = stack_begin[st], ie = stack_begin[st + 1];
    const int32_t used = std::min<int32_t>(nch, ie - ib);
    double stack_slowest = 0;
    // The channels' head lists.
    std::fill(ch_begin.begin(), ch_begin.begin() + used + 1, 0);
    for (int32_t i = ib; i < ie; ++i) ch_begin[item_ch[i] + 1] += item_heads[i];
    for (int32_t c = 0; c < used; ++c) ch_begin[c + 1] += ch_begin[c];
    std::copy(ch_begin.begin(), ch_begin.begin() + used, ch_cursor.begin());
    for (int32_t i = ib; i < ie; ++i) {
      int32_t& at = ch_cursor[item_ch[i]];
      for (int32_t k = 0; k < item_heads[i]; ++k) head_seq[at++] = item_seq[i];
    }
    // A channel's list is S0 .. S(f-1), then C0 S(f) C1 S(f+1) ... C(n-1),
    // f = in_flight (a score runs while fewer than f heads wait for their
    // context). Every context waits for its softmax to be committed, so a
    // channel stops at each one: first at C0, after its first f scores;
    // committing head k runs C(k) and S(k + f), and the channel stops at
    // C(k + 1), whose softmax request (the end of S(k + 1)) is its key in
    // the tree. Each task starts at max(units free, inputs ready).
    int32_t most_heads = 0;
    for (int32_t c = 0; c < used; ++c) {
      Chan& ch = chans[c];
      ch = {0.0, {0, 0}, ch_begin[c], ch_begin[c + 1] - ch_begin[c], 0};
      most_heads = std::max(most_heads, ch.n);
      for (int32_t k = 0; k < std::min(in_flight, ch.n); ++k) {
        ch.g += per_seq[head_seq[ch.base + k]].s;
        ch.arrival[k & 1] = ch.g;
      }
      blocked[c] = ch.arrival[0];  // n >= 1: item c is on channel c
    }
    if (most_heads <= in_flight) {
      // No channel has more heads than may be in flight, so every softmax
      // request (the end of a score) is known before any is served: the
      // unit serves them in (arrival, channel) order, the order in which
      // the tree below would commit them, and each channel's contexts then
      // follow its scores. Same arithmetic, without the tree: sorted by
      // insertion, first requests before second ones, last channel first
      // (a channel's first item is longer than a later channel's, so that
      // order is nearly sorted).
      struct Request {
        double arrival;
        int32_t ch, k;
      };
      thread_local std::vector<Request> requests;
      requests.clear();
      for (int32_t k = 0; k < most_heads; ++k) {
        for (int32_t c = used - 1; c >= 0; --c) {
          if (k >= chans[c].n) continue;
          const Request r{chans[c].arrival[k], c, k};
          requests.push_back(r);
          size_t j = requests.size() - 1;
          for (; j > 0; --j) {
            const Request& q = requests[j - 1];
            if (q.arrival < r.arrival || (q.arrival == r.arrival && q.ch < r.ch)) break;
            requests[j] = q;
          }
          requests[j] = r;
        }
      }
      double softmax_free = 0;
      for (const Request& r : requests) {
        const SeqCycles& sc = per_seq[head_seq[chans[r.ch].base + r.k]];
        softmax_free = std::max(r.arrival, softmax_free) + sc.sfm;
        chans[r.ch].arrival[r.k] = softmax_free + sc.mv_gb;  // now: ready
      }
      for (int32_t c = 0; c < used; ++c) {
        Chan& ch = chans[c];
        for (int32_t k = 0; k < ch.n; ++k) {
          ch.g = std::max(ch.g, ch.arrival[k]) + per_seq[head_seq[ch.base + k]].c;
        }
        stack_slowest = std::max(stack_slowest, ch.g);
      }
      slowest = std::max(slowest, stack_slowest);
      continue;
    }
    tree.Reset(blocked.data(), used);
    double softmax_free = 0;
    while (true) {
      const int32_t c = tree.Min();
      const double arrival = tree.MinKey();
      if (arrival == kNotBlocked) break;
      Chan& ch = chans[c];
      const int32_t k = ch.next_c++;
      const SeqCycles& sc = per_seq[head_seq[ch.base + k]];
      softmax_free = std::max(arrival, softmax_free) + sc.sfm;
      ch.g = std::max(ch.g, softmax_free + sc.mv_gb) + sc.c;
      if (k + in_flight < ch.n) {
        ch.g += per_seq[head_seq[ch.base + k + in_flight]].s;
        ch.arrival[(k + in_flight) & 1] = ch.g;
      }
      tree.Set(c, k + 1 < ch.n ? ch.arrival[(k + 1) & 1] : kNotBlocked);
    }
    for (int32_t c = 0; c < used; ++c) stack_slowest = std::max(stack_slowest, chans[c].g);
    slowest = std::max(slowest, stack_slowest);
  }

  memo_lock.lock();
  remember(slowest);
  return FinishAttentionCost(slowest, score_busy, softmax_busy, context_busy, cost);
}

void AttAccDevice::ForgetStackList(int slot) const {
  StackList& l = stack_lists_[slot];
  l.stacks.clear();
  l.id = 0;
  l.op_id = 0;
  l.last_used = 0;
  l.fast.clear();
}

int AttAccDevice::FindStackList(absl::Span<const int32_t> stacks, int64_t kv_heads, uint64_t op_id,
                                bool* seen) const {
  int slot = 0;
  for (int i = 0; i < kRecentLists; ++i) {
    StackList& l = stack_lists_[i];
    // Equal nonzero ids promise equal contents (Op::kv_head_stack_id).
    if (l.id != 0 && l.kv_heads == kv_heads && l.stacks.size() == stacks.size() &&
        ((op_id != 0 && l.op_id == op_id) ||
         std::equal(stacks.begin(), stacks.end(), l.stacks.begin()))) {
      l.last_used = ++recent_clock_;
      if (op_id != 0) l.op_id = op_id;
      *seen = true;
      return i;
    }
    if (l.last_used < stack_lists_[slot].last_used) slot = i;
  }
  StackList& l = stack_lists_[slot];
  l.stacks.assign(stacks.begin(), stacks.end());  // reuses the capacity
  l.kv_heads = kv_heads;
  l.op_id = op_id;
  l.id = next_stack_list_id_++;
  l.last_used = ++recent_clock_;
  l.fast.clear();
  *seen = false;
  return slot;
}

int AttAccDevice::FindRecentList(uint64_t id,
                                 absl::Span<const std::array<int32_t, 3>> l_key) const {
  int slot = 0;
  for (int i = 0; i < kRecentLists; ++i) {
    const RecentList& r = recent_[i];
    if (r.stack_list == id && r.l_key.size() == l_key.size() &&
        std::equal(l_key.begin(), l_key.end(), r.l_key.begin(),
                   [](const auto& x, const auto& y) { return SameKey(x, y); })) {
      recent_[i].last_used = ++recent_clock_;
      return i;
    }
    if (r.last_used < recent_[slot].last_used) slot = i;
  }
  RecentList& r = recent_[slot];
  r.stack_list = id;
  r.l_key.assign(l_key.begin(), l_key.end());
  ++r.generation;
  r.last_used = ++recent_clock_;
  r.slowest.clear();
  return slot;
}

absl::Status AttAccDevice::FinishAttentionCost(double slowest, double score_busy,
                                               double softmax_busy, double context_busy,
                                               Cost* cost) const {
  const double tck = spec_.attacc().tck_s();
  cost->cycles = slowest * refresh_factor_;
  cost->time_s = cost->cycles * tck;
  cost->score_s = score_busy * refresh_factor_ * tck;
  cost->softmax_s = softmax_busy * refresh_factor_ * tck;
  cost->context_s = context_busy * refresh_factor_ * tck;
  return absl::OkStatus();
}

// ------------------------------------------------------------- Execute ----

absl::StatusOr<AttentionResult> AttAccDevice::Execute(const AttentionCall& call) const {
  return ExecuteCounted(call, nullptr);
}

// The mapping of the cycle model, executed: the same unit geometry, column
// counts and padding (so bytes and MACs match Estimate's), fp16 where the
// GEMV units work, fp32 in the accumulators and the softmax unit. With int8
// KV the geometry follows the 1-byte elements but the arithmetic stays fp16
// (quantisation is not emulated).
absl::StatusOr<AttentionResult> AttAccDevice::ExecuteCounted(const AttentionCall& call,
                                                             int64_t* macs_out) const {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  if (call.q.shape[1] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("attacc runs decode attention only; prefill runs on the xPUs (q has ",
                     call.q.shape[1], " tokens; expected 1)"));
  }
  const AttAccSpec& a = spec_.attacc();
  const int64_t heads = call.q.shape[0], d = call.q.shape[2];
  const int64_t kv_heads = call.k.shape[0], l = call.k.shape[1];
  const int64_t group = heads / kv_heads;
  const float scale = call.scale != 0 ? call.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t pch = a.pseudo_channels();
  const int64_t srcs = l_split_ / pch;
  const int64_t n_pos = CeilDiv(l, l_split_);
  const int64_t n_dcol = CeilDiv(d, d_split_ * lanes_);
  const int64_t lanes = lanes_;
  const int64_t sm_lanes = a.softmax_lanes();

  // K and V as the cells hold them: fp16.
  std::vector<float> kf(kv_heads * l * d), vf(kv_heads * l * d);
  for (int64_t i = 0; i < kv_heads * l * d; ++i) {
    kf[i] = RoundHalf(call.k.At(i));
    vf[i] = RoundHalf(call.v.At(i));
  }
  auto round32 = [](float x) { return x; };

  AttentionResult result;
  result.out = Tensor::Zeros(ElementType::kFp32, {heads, 1, d});
  std::vector<float> q(d), scores(l), e(l), p16(l), lanes_buf(lanes), sm_buf(sm_lanes),
      bank_partial(d_split_), partial(l_split_ * d);
  int64_t reads = 0, macs = 0;
  for (int64_t h = 0; h < heads; ++h) {
    RETURN_IF_ERROR(PollInterrupt());
    const int64_t kvh = h / group;
    const float* kh = kf.data() + kvh * l * d;
    const float* vh = vf.data() + kvh * l * d;
    for (int64_t c = 0; c < d; ++c) q[c] = RoundHalf(call.q.At(h * d + c));  // WR_GB

    // Score GEMV: slot s (pCH, rank, BG) holds positions s, s + l_split, ...;
    // unit k of the slot holds column groups k, k + d_split, ... (K^T row-
    // wise at the multipliers: an fp16 adder tree per column, accumulated
    // in fp16 over the unit's columns; BG accumulator: fp32 over units).
    for (int64_t s = 0; s < l_split_; ++s) {
      for (int64_t i = 0; i < n_pos; ++i) {
        const int64_t j = i * l_split_ + s;
        for (int64_t k = 0; k < d_split_; ++k) {
          float acc = 0;
          for (int64_t cl = 0; cl < n_dcol; ++cl) {
            ++reads;  // one column read by this unit's MAC command
            macs += lanes;
            if (j >= l) continue;  // padded slot: the command reads padding
            const int64_t c0 = (cl * d_split_ + k) * lanes;
            for (int64_t x = 0; x < lanes; ++x) {
              const int64_t c = c0 + x;
              lanes_buf[x] = c < d ? RoundHalf(q[c] * kh[j * d + c]) : 0.0f;
            }
            acc = RoundHalf(acc + TreeSum(lanes_buf.data(), lanes, RoundHalf));
          }
          bank_partial[k] = acc;
        }
        if (j < l) {
          float sum = 0;
          for (int64_t k = 0; k < d_split_; ++k) sum += bank_partial[k];
          scores[j] = sum;
        }
      }
    }

    // Softmax on the buffer die, fp32: max, exp and lane sums (lane
    // j mod softmax_lanes, then an adder tree), normalise; probabilities go
    // to the GEMV buffers in fp16 (MV_GB).
    float mx = -INFINITY;
    for (int64_t j = 0; j < l; ++j) mx = std::max(mx, scores[j] * scale);
    std::fill(sm_buf.begin(), sm_buf.end(), 0.0f);
    for (int64_t j = 0; j < l; ++j) {
      e[j] = std::exp(scores[j] * scale - mx);
      sm_buf[j % sm_lanes] += e[j];
    }
    const float inv = 1.0f / TreeSum(sm_buf.data(), sm_lanes, round32);
    for (int64_t j = 0; j < l; ++j) p16[j] = RoundHalf(e[j] * inv);

    // Context GEMV: V column-wise at the multipliers, one fp16 accumulator
    // per lane over the unit's positions; partials reduced in fp32 per pCH
    // over its (rank, BG) slots, then over pCHs.
    for (int64_t s = 0; s < l_split_; ++s) {
      float* part = partial.data() + s * d;
      for (int64_t k = 0; k < d_split_; ++k) {
        for (int64_t cl = 0; cl < n_dcol; ++cl) {
          const int64_t c0 = (cl * d_split_ + k) * lanes;
          std::fill(lanes_buf.begin(), lanes_buf.end(), 0.0f);
          for (int64_t i = 0; i < n_pos; ++i) {
            ++reads;
            macs += lanes;
            const int64_t j = i * l_split_ + s;
            if (j >= l) continue;
            for (int64_t x = 0; x < lanes && c0 + x < d; ++x) {
              lanes_buf[x] = RoundHalf(lanes_buf[x] + RoundHalf(p16[j] * vh[j * d + c0 + x]));
            }
          }
          for (int64_t x = 0; x < lanes && c0 + x < d; ++x) part[c0 + x] = lanes_buf[x];
        }
      }
    }
    for (int64_t c = 0; c < d; ++c) {
      float out = 0;
      for (int64_t pc = 0; pc < pch; ++pc) {
        float acc = 0;
        for (int64_t r = 0; r < srcs; ++r) acc += partial[(pc * srcs + r) * d + c];
        out += acc;
      }
      result.out.Set(h * d + c, out);
    }
    result.stats.kv_positions += l;
    result.stats.kv_positions_read += l;
    result.stats.v_rows_read += l;
  }
  result.stats.bytes_read = static_cast<double>(reads) * a.column_bytes();
  if (macs_out != nullptr) *macs_out = macs;
  return result;
}

SERVESIM_REGISTER_DEVICE(kAttacc, "attacc", &AttAccDevice::Create);

}  // namespace servesim::devices
