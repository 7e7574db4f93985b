// AttAcc: HBM3 processing-in-memory for decode attention (Park et al.,
// "AttAcc! Unleashing the Power of PIM for Batched Transformer-based
// Generative Model Inference", ASPLOS'24).
//
// WHAT IS MODELLED
// A pool of `stacks` 8-Hi HBM3 stacks. Each stack: `channels` legacy
// channels x `pseudo_channels` pCHs; each pCH: `ranks` x `bank_groups` x
// `banks_per_group` banks; rows of `row_bytes`, read `column_bytes` at a
// time. GEMV units sit per bank, per bank group or per pCH (placement, §4.1);
// one softmax unit per stack on the buffer die (§4.1, §5.1).
//
// Mapping (§4.2 and the authors' command generator): each KV head of each
// request lives on ONE stack (head-wise); within a stack a head is processed
// by one legacy channel at a time, so a stack runs `channels` heads in
// parallel and a channel runs its heads one after another (heads are given to
// channels greedily, longest first). Within a channel, K^T (d_head x L) is
// split (column, column, row) over (pCH, BG, bank): L over pCH x rank x BG,
// d_head over banks; V (L x d_head) is split (row, row, column), i.e. the same
// way. At the multiplier level K^T is row-wise and V column-wise.
//
// CYCLE MODEL (command stream of §5.1, per head on its channel)
//  - WR_GB: the query (d_head elements) is written to the GEMV buffers.
//  - score GEMV: PIM_MAC_AB commands, each reading one column in every bank of
//    the channel and doing multipliers_per_unit MACs per unit. Columns per
//    unit = ceil(L / (pch * ranks * bgs)) * ceil(d_head / (banks * elems per
//    column)) for bank placement (other placements: the same work over fewer
//    units, see the .cc). MAC_AB commands issue every t_ccdl per unit; with
//    the power constraint at most gemv_units_active_per_pch units of a pCH
//    stream at once (18 of 32 banks: internal bandwidth 9x the external;
//    6 of 8 for BG: 3x; 1 for buffer: 1x, §4.1).
//  - ACT_AB / PRE: a unit streaming its bank opens ceil(bytes per unit /
//    row_bytes) rows; the first ACT (t_rcd) is always exposed; later row
//    switches (t_rp + t_rcd) are exposed only when every unit of a pCH
//    streams at once (no spare banks to hide them in, §4.1).
//  - MV_SB: score outputs to the softmax buffer; SFM: softmax on the buffer
//    die, 3 passes over L with softmax_lanes lanes plus softmax_fill_cycles;
//    MV_GB: probabilities back to the GEMV buffers; context GEMV like score;
//    MV_SB of the outputs; RD_SB returns d_head outputs.
//  - Refresh: all-bank refresh steals t_rfc of every t_refi.
//  - Attention-level pipelining (§6.1): on a channel, the score GEMV of the
//    next head runs while the softmax of the current one runs; a two-
//    resource list schedule (GEMV units of the channel, the stack's softmax
//    unit shared by its channels), not a fudge factor.
// A stack's time is its slowest channel; the op's time is its slowest stack,
// so imbalance of the head mapping shows in the cost.
//
// Bytes per level: cells -> GEMV units (Cost::dram_bytes), bank-group bus,
// TSV and external (Cost::bg_bus_bytes, tsv_bytes, external_bytes): what
// crosses each level for this placement (bank placement: only partial sums
// and vectors leave the bank; buffer placement: every K/V byte crosses the
// BG bus and the TSVs). Energy per level from the per-bit figures of
// O'Connor et al., MICRO'17 (the source AttAcc uses): ACT/PRE per row
// opened, cell RD/WR, column decoder -> BG mux, BG mux -> GIO, TSV,
// interposer; plus MAC and softmax op energy.
//
// FEED-FORWARD GEMV (§6.2): kGemm ops (m input vectors times a [k x n]
// weight slice stored in the stacks, FF1 column-split / FF2 row-split) cost m
// passes over the slice at the pool's internal GEMV bandwidth.
//
// FUNCTIONAL KERNEL: Execute() computes decode attention the way the
// hardware maps it: per bank, fp16 products accumulated in fp16 partial sums
// per multiplier lane (K^T row-wise: an adder tree per column; V column-wise:
// an accumulator per lane), partial sums reduced in fp32 by the BG and pCH
// accumulators, softmax in fp32 on the buffer die. Its KernelStats report
// the MACs and bytes it touched, which equal what Estimate charges for the
// same op.
#ifndef SERVESIM_DEVICES_ATTACC_ATTACC_DEVICE_H_
#define SERVESIM_DEVICES_ATTACC_ATTACC_DEVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "devices/device.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// The cost of one head's attention on its channel, in command-clock cycles
// (exposed for tests and for the planner's head-group schedule).
struct AttAccHeadCycles {
  double wr_gb = 0;       // query into GEMV buffers
  double score = 0;       // MAC_AB stream incl. exposed ACT/PRE
  double mv_sb = 0;       // score outputs to the softmax buffer
  double softmax = 0;     // SFM, in command-clock cycles
  double mv_gb = 0;       // probabilities to the GEMV buffers
  double context = 0;     // MAC_AB stream incl. exposed ACT/PRE
  double out = 0;         // context MV_SB + RD_SB
  int64_t mac_ab_commands = 0;  // score + context
  int64_t rows_opened = 0;      // per unit, score + context
  double gemv() const { return wr_gb + score + mv_sb + mv_gb + context + out; }
};

class AttAccDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(
      const servesim::v1::DeviceSpec& spec);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops,
                        absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(
      const AttentionCall& call) const override;

  // Cycles of one decode-attention head with context length `l`.
  AttAccHeadCycles HeadCycles(int64_t l, int64_t d_head) const;
  // Internal GEMV bandwidth of the whole pool, bytes/s (power cap applied).
  double InternalBandwidth() const;
  // External bandwidth of the whole pool (every stack's PHY), bytes/s.
  double ExternalBandwidth() const;
  // Capacity of one stack, bytes.
  double StackBytes() const;
  int stacks() const { return spec_.attacc().stacks(); }
  const servesim::v1::AttAccSpec& spec() const { return spec_.attacc(); }

  // Multiply-accumulates the GEMV units execute for one query head of
  // context length `l` (score + context; padded lanes and padded position
  // slots included, as the all-unit MAC commands execute them).
  int64_t HeadMacs(int64_t l, int64_t d_head) const;
  // K and V bytes the GEMV units read from the cells for one query head
  // (what Estimate charges as dram_bytes; padding included).
  double HeadCellBytes(int64_t l, int64_t d_head) const;
  // Execute(), also reporting the MACs the kernel performed.
  absl::StatusOr<AttentionResult> ExecuteCounted(const AttentionCall& call,
                                                 int64_t* macs) const;

 private:
  explicit AttAccDevice(const servesim::v1::AttAccDeviceSpec& spec);
  // The device's own head placement for ops without kv_head_stack; one
  // Estimate call reuses it across ops over the same sequences (head
  // groups).
  struct OwnPlacement {
    const AttentionSeq* seqs = nullptr;
    size_t num_seqs = 0;
    int64_t kv_heads = 0;
    std::vector<int32_t> stack;  // [seq * kv_heads + kv_head]
    // Per-sequence figures, shared by the head-group ops of one Estimate
    // call (they list the same sequences): valid for (per_seq_of,
    // per_seq_n, per_seq_dh).
    const AttentionSeq* per_seq_of = nullptr;
    size_t per_seq_n = 0;
    int64_t per_seq_dh = 0;
    struct SeqCycles {
      double s, c, sfm, mv_gb;
    };
    std::vector<SeqCycles> per_seq;
    std::vector<int64_t> seq_len;
    std::vector<int32_t> order;  // longest first, stable
    // `order` stably sorted by score end (SeqCycles::s): the order in which
    // a stack's single-head items reach the softmax unit.
    std::vector<int32_t> by_arrival;
    // The stack-list and recent-list slots of (recent_of, recent_n,
    // recent_stacks), with the ids / generation they had when found (see
    // StackList and RecentList).
    const AttentionSeq* recent_of = nullptr;
    size_t recent_n = 0;
    const int32_t* recent_stacks = nullptr;
    int stack_slot = -1;
    uint64_t stack_list_id = 0;
    int recent_slot = -1;
    uint64_t recent_generation = 0;
    // What L enters the cycle figures through, per sequence: ceil(L / L
    // split), ceil(L / softmax lanes), ceil(L / (L split x lanes)). Equal
    // triples give equal cycles: the per-stack memo keys on them.
    std::vector<std::array<int32_t, 3>> l_key;
    double score_busy = 0, softmax_busy = 0, context_busy = 0;
    double cells = 0, rows = 0, bg = 0, tsv = 0, ext = 0, macs = 0, sfm_ops = 0;
    // Forgets the last call's lists (addresses may be reused with other
    // contents), keeping the vectors' storage.
    void ForCall() {
      seqs = nullptr;
      num_seqs = 0;
      kv_heads = 0;
      per_seq_of = nullptr;
      per_seq_n = 0;
      per_seq_dh = 0;
      recent_of = nullptr;
      recent_n = 0;
      recent_stacks = nullptr;
      stack_slot = recent_slot = -1;
      stack_list_id = recent_generation = 0;
    }
  };
  absl::Status AttentionCost(const Op& op, OwnPlacement* own, Cost* cost) const;
  // One query head's figures at context length L: its cycles, its L
  // ceilings, and its bytes, rows and MACs per level (all but the softmax's
  // operation count, 5 L, depend on L only through the ceilings).
  struct LenFigures {
    OwnPlacement::SeqCycles sc{};
    std::array<int32_t, 3> l_key{};
    double cell = 0, rows = 0, bg = 0, tsv = 0, macs = 0;
    bool valid = false;
  };
  LenFigures FiguresOf(int64_t l, int64_t d_head) const;
  // Time fields of an attention cost from its slowest stack (cycles) and
  // the stages' busy cycles.
  absl::Status FinishAttentionCost(double slowest, double score_busy, double softmax_busy,
                                   double context_busy, Cost* cost) const;
  Cost GemvCost(const Op& op) const;
  double SoftmaxCycles(int64_t l) const;

  servesim::v1::AttAccDeviceSpec spec_;
  // Memo of attention schedules, for every op: the schedules of the last
  // few sequence lists, in two levels (kRecentLists each, least recently
  // used replaced). Cycle figures change only when L crosses a multiple of
  // the L split (16), so a steady decode batch often asks the same schedule
  // iteration after iteration; a hit returns what computing would. Bytes
  // and energy depend on L itself and are always computed.
  //  - StackList: a list of KV-head stacks (all of every sequence's KV
  //    heads), compared in place once per Estimate call, unless the op's
  //    Op::kv_head_stack_id is the one the list last came with. A list is checked
  //    against the stack count when it is new, and keeps, per KV-head range,
  //    whether every stack's items fit the one-pass fast path; both depend
  //    on the stacks alone, which stay put while a batch's members do.
  //  - RecentList: a stack list (by its never-reused id) with the L
  //    ceilings of its sequences, and by geometry (pipelining, d_head, head
  //    range, heads) the slowest stack of each head group's op.
  // This answers without building, hashing or copying a long key, and
  // without growing. (A hashed memo of every schedule seen, keyed on the
  // whole op, was measured to hit never in overloaded and saturated runs:
  // lengths only grow, so a list of ceilings does not come back once left,
  // and it cost a third of a large batch's schedule in key building,
  // hashing and allocation. A per-stack memo was measured slower too.)
  struct StackList {
    std::vector<int32_t> stacks;  // [seq * kv_heads + kv_head]
    int64_t kv_heads = 0;
    uint64_t id = 0;  // unique over the device's life; 0: empty slot
    uint64_t op_id = 0;  // the Op::kv_head_stack_id it last came with; 0: none
    uint64_t last_used = 0;
    // By KV-head range [lo, hi): no stack gets more than the fast path's
    // item limit.
    std::vector<std::pair<std::array<int64_t, 2>, bool>> fast;
  };
  struct RecentList {
    uint64_t stack_list = 0;  // StackList::id; 0: empty slot
    std::vector<std::array<int32_t, 3>> l_key;
    uint64_t generation = 0;  // bumped when the slot is given to another list
    uint64_t last_used = 0;
    // By geometry: a handful (one per head group), searched linearly.
    std::vector<std::pair<std::array<int64_t, 6>, double>> slowest;
  };
  static constexpr int kRecentLists = 4;
  static constexpr size_t kRecentGeometries = 64;
  // With memo_mu_ held: the slot of the stack list (`stacks` of `kv_heads`
  // per sequence, Op::kv_head_stack_id `op_id`, 0: unknown) (*seen), or the
  // least recently used slot, taken over for it with a new id (!*seen).
  int FindStackList(absl::Span<const int32_t> stacks, int64_t kv_heads, uint64_t op_id,
                    bool* seen) const;
  // With memo_mu_ held: the slot of (stack list `id`, `l_key`), or the
  // least recently used slot, taken over for it.
  int FindRecentList(uint64_t id, absl::Span<const std::array<int32_t, 3>> l_key) const;
  void ForgetStackList(int slot) const;  // with memo_mu_ held
  mutable std::mutex memo_mu_;
  mutable std::array<StackList, kRecentLists> stack_lists_;  // guarded by memo_mu_
  mutable std::array<RecentList, kRecentLists> recent_;      // guarded by memo_mu_
  mutable uint64_t recent_clock_ = 0;                        // guarded by memo_mu_
  mutable uint64_t next_stack_list_id_ = 1;                  // guarded by memo_mu_
  // FiguresOf by L for one d_head (the last one asked), L < kLenTableMax.
  mutable std::mutex len_mu_;
  mutable int64_t len_dh_ = 0;                 // guarded by len_mu_
  mutable std::vector<LenFigures> len_table_;  // guarded by len_mu_
  static constexpr int64_t kLenTableMax = int64_t{1} << 16;
  // Derived from the spec once (see the .cc for each).
  int64_t elem_bytes_ = 2;       // KV element bytes (fp16 2, int8 1)
  int64_t lanes_ = 16;           // elements per column read
  int64_t units_per_pch_ = 32;   // GEMV units per pseudo channel
  int64_t active_units_ = 18;    // of them streaming at once
  int64_t d_split_ = 4;          // ways d_head is split among a pCH's units
  int64_t l_split_ = 16;         // ways L is split within a channel
  int64_t score_out_cmds_ = 8;   // MV_SB commands per score output group
  int64_t context_out_cmds_ = 8; // MV_SB commands per context output group
  bool hide_row_switch_ = true;  // spare banks hide later ACT/PRE
  double column_cycles_ = 4;     // per column read per unit
  double refresh_factor_ = 1;    // t_refi / (t_refi - t_rfc)
};

// Named presets: attacc_bank (default), attacc_bg, attacc_buffer.
absl::StatusOr<servesim::v1::AttAccSpec> AttAccPreset(absl::string_view name);
std::vector<std::string> AttAccPresetNames();

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_ATTACC_ATTACC_DEVICE_H_
