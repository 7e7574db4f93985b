// Token-Picker device: the functional kernel (with its cycle-stepped
// simulation of the lanes and the memory), the closed-form cycle model and
// the fidelity modes the header describes.
#include "devices/topick/topick_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "devices/interrupt.h"
#include "devices/presets.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "google/protobuf/descriptor.h"

namespace servesim::devices {
namespace {

using servesim::v1::TopickSpec;

absl::Status Bad(absl::string_view field, double v, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("topick device: ", field, " = ", v, "; expected ", expected));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What the DRAM delivers per PE clock cycle, all channels together.
double BytesPerCycleOf(const TopickSpec& t) {
  return t.hbm_channels() * t.channel_bandwidth_bytes_per_s() / t.clock_hz();
}

struct Request {
  int32_t token;  // position
  int8_t chunk;
  int16_t lane;   // the PE lane of the token: its visit-order index mod lanes
};

}  // namespace

namespace {

// The kernel's fixed configuration for one d_head (from the spec).
struct KernelConfig {
  int bits = 12, cbits = 4;
  bool on_demand = true, estimation = true;
  int64_t lanes = 16, cpc = 1, lat = 0, scoreboard = 32;
  double bpc = 0, chunk_bytes = 0, row_bytes = 0, req_bytes = 0, log_thr = 0;
  // Dot products of d terms fit int32: d x qmax x 2^(bits-1) < 2^31 (a K
  // chunk prefix is at most 2^(bits-1) in magnitude).
  bool narrow = false;
};

KernelConfig MakeConfig(const TopickDevice& dev, int64_t d) {
  const TopickSpec& t = dev.spec();
  KernelConfig k;
  k.bits = t.operand_bits();
  k.cbits = t.chunk_bits();
  k.on_demand = t.on_demand_k();
  k.estimation = t.estimation();
  k.lanes = t.pe_lanes();
  k.cpc = CeilDiv(d, t.multipliers_per_lane());
  k.lat = static_cast<int64_t>(std::ceil(t.dram_latency_s() * t.clock_hz() - 1e-9));
  k.scoreboard = t.scoreboard_entries();
  k.bpc = dev.BytesPerCycle();
  k.chunk_bytes = static_cast<double>(d) * k.cbits / 8.0;
  k.row_bytes = static_cast<double>(d) * k.bits / 8.0;
  k.req_bytes = k.on_demand ? k.chunk_bytes : k.row_bytes;
  k.log_thr = k.estimation && t.threshold() > 0 ? std::log(t.threshold())
                                                : -std::numeric_limits<double>::infinity();
  const int64_t qmax = (int64_t{1} << (k.bits - 1)) - 1;
  k.narrow = d * qmax * (int64_t{1} << (k.bits - 1)) < (int64_t{1} << 31);
  return k;
}

struct Arrival {
  int64_t cycle;
  Request r;
};

// Buffers of one head's run, reused across heads. The FIFOs are vectors
// read from a head index (every entry is pushed once per head).
template <typename T>
struct TopickWorkspace {
  std::vector<T> q;
  std::vector<int64_t> ps, ps0;
  std::vector<double> e_old, acc;
  std::vector<int32_t> lane_next, lane_inflight;
  std::vector<int64_t> lane_busy;
  // Per lane: the first cycle it can take its next arrival, max(busy until,
  // the FIFO front's arrival), or never (empty FIFO).
  std::vector<int64_t> ready;
  std::vector<std::vector<Arrival>> arrivals;
  std::vector<size_t> arrival_head;
  std::vector<Request> memq;
};

// q . (k with its low bits cleared by `mask`): the partial score of a K
// chunk prefix. In two's complement (k >> s) * 2^s == k & ~(2^s - 1).
template <typename T>
inline int64_t MaskedDot(const T* q, const T* k, int64_t d, T mask, bool narrow) {
  if (narrow) {
    int32_t s = 0;
    for (int64_t c = 0; c < d; ++c) {
      s += static_cast<int32_t>(q[c]) * static_cast<int32_t>(static_cast<T>(k[c] & mask));
    }
    return s;
  }
  int64_t s = 0;
  for (int64_t c = 0; c < d; ++c) s += int64_t{q[c]} * static_cast<T>(k[c] & mask);
  return s;
}

// The first-chunk partial scores of rows 0..l-1 (int16 rows, int32 sums):
// every row, every head, so it is the kernel's widest loop. Built twice,
// for baseline x86-64 and for AVX2 (chosen at run time), from the same
// source; integer sums, so both give the same bits.
#define SERVESIM_TOPICK_CHUNK_DOTS(NAME, ATTR)                                              \
  ATTR void NAME(const int16_t* q, const int16_t* k, int64_t l, int64_t d, int16_t mask,   \
                 int64_t* out) {                                                          \
    for (int64_t j = 0; j < l; ++j) {                                                     \
      const int16_t* row = k + j * d;                                                     \
      int32_t s = 0;                                                                      \
      for (int64_t c = 0; c < d; ++c) {                                                   \
        s += static_cast<int32_t>(q[c]) * static_cast<int32_t>(static_cast<int16_t>(row[c] & mask)); \
      }                                                                                   \
      out[j] = s;                                                                         \
    }                                                                                     \
  }
SERVESIM_TOPICK_CHUNK_DOTS(ChunkDotsBase, )
#if defined(__x86_64__) && defined(__GNUC__)
SERVESIM_TOPICK_CHUNK_DOTS(ChunkDotsAvx2, __attribute__((target("avx2"))))
#endif
#undef SERVESIM_TOPICK_CHUNK_DOTS

template <typename T>
void ChunkDots(const T* q, const T* k, int64_t l, int64_t d, T mask, bool narrow, int64_t* out) {
  if constexpr (std::is_same_v<T, int16_t>) {
    if (narrow) {
#if defined(__x86_64__) && defined(__GNUC__)
      static const bool avx2 = __builtin_cpu_supports("avx2");
      if (avx2) return ChunkDotsAvx2(q, k, l, d, mask, out);
#endif
      return ChunkDotsBase(q, k, l, d, mask, out);
    }
  }
  for (int64_t j = 0; j < l; ++j) out[j] = MaskedDot(q, k + j * d, d, mask, narrow);
}

// One query head on one KV head's fixed-point rows (k, and v unless only
// the counts are wanted: v null, out not written). pruned[0..l) receives
// the chunk after which each token was pruned, or -1.
template <typename T>
TopickCounts RunHead(const KernelConfig& cfg, const float* q_in, const T* kh, const T* vh,
                     double k_scale, double v_scale, int64_t l, int64_t d, double scale,
                     TopickWorkspace<T>& w, float* out, int8_t* pruned) {
  constexpr int kChunks = 3;
  const int bits = cfg.bits, cbits = cfg.cbits;
  const bool on_demand = cfg.on_demand;
  const int64_t lanes = cfg.lanes, cpc = cfg.cpc, lat = cfg.lat;
  const int64_t entries = on_demand ? cfg.scoreboard : l;
  w.q.resize(d);
  const double sq = QuantiseFixed(q_in, d, bits, w.q.data());
  const T* q = w.q.data();
  const double f = sq * k_scale * scale;
  // Margins per chunk from Q alone (Eq. 4).
  int64_t pos_sum = 0, neg_sum = 0;
  for (int64_t c = 0; c < d; ++c) {
    (q[c] > 0 ? pos_sum : neg_sum) += q[c];
  }
  std::array<int64_t, kChunks> mmax{}, mmin{};
  std::array<T, kChunks> mask{};
  for (int b = 0; b < kChunks; ++b) {
    const int shift = bits - (b + 1) * cbits;
    const int64_t unknown = (int64_t{1} << shift) - 1;
    mmax[b] = unknown * pos_sum;
    mmin[b] = unknown * neg_sum;
    mask[b] = static_cast<T>(~unknown);
  }
  // Scores are shifted by the largest first-chunk upper bound, so every
  // exp is <= 1 and the largest true score is within one margin width of
  // 0 (no underflow); decisions are shift-invariant. The hardware keeps
  // ln D in fixed point instead.
  w.ps0.resize(l);
  w.ps.resize(l);
  int64_t top = std::numeric_limits<int64_t>::min();
  ChunkDots(q, kh, l, d, mask[0], cfg.narrow, w.ps0.data());
  for (int64_t j = 0; j < l; ++j) top = std::max(top, w.ps0[j] + mmax[0]);
  const double offset = static_cast<double>(top) * f;
  auto token_of = [&](int64_t n) { return n == 0 ? int64_t{0} : l - n; };  // visit order

  std::fill(pruned, pruned + l, -1);
  w.e_old.assign(l, 0.0);
  w.lane_next.assign(lanes, 0);
  w.lane_inflight.assign(lanes, 0);
  w.lane_busy.assign(lanes, 0);
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  w.ready.assign(lanes, kNever);
  w.arrivals.resize(lanes);
  for (auto& a : w.arrivals) a.clear();
  w.arrival_head.assign(lanes, 0);
  // Every token enters the memory queue at most once per chunk; one slot
  // more for the unconditional write below.
  w.memq.resize(static_cast<size_t>(kChunks * l + 1));
  size_t mem_head = 0, mem_tail = 0;
  TopickCounts counts;
  counts.heads = 1;
  counts.tokens = l;
  double denom = 0, credit = 0;
  double log_of = -1, log_d = 0;  // ln D, recomputed when D changes
  int64_t done = 0, cycle = 0, issued = 0;
  for (;; ++cycle) {
    // New first-chunk requests, in visit order per lane.
    for (int64_t ln = 0; issued < l && ln < lanes; ++ln) {
      const int64_t n = ln + int64_t{w.lane_next[ln]} * lanes;
      if (n < l && w.lane_inflight[ln] < entries) {
        w.memq[mem_tail++] = {static_cast<int32_t>(token_of(n)), 0, static_cast<int16_t>(ln)};
        ++w.lane_next[ln];
        ++w.lane_inflight[ln];
        ++issued;
      }
    }
    // The memory serves requests FIFO at its bandwidth.
    credit += cfg.bpc;
    while (mem_head < mem_tail && credit >= cfg.req_bytes) {
      const Request r = w.memq[mem_head++];
      credit -= cfg.req_bytes;
      auto& a = w.arrivals[r.lane];
      a.push_back({cycle + lat, r});
      if (w.arrival_head[r.lane] + 1 == a.size()) {
        w.ready[r.lane] = std::max(w.lane_busy[r.lane], cycle + lat);
      }
      if (on_demand) {
        ++counts.chunk_fetched[r.chunk];
      } else {
        for (int b = 0; b < kChunks; ++b) ++counts.chunk_fetched[b];
      }
    }
    if (mem_head == mem_tail) credit = std::min(credit, cfg.bpc);
    // Each lane processes one arrived chunk (out of order across tokens).
    double delta = 0;
    // No estimate before the first partial exp reaches the DAG (D = 0).
    const bool have_d = denom > 0;
    if (have_d && denom != log_of) log_of = denom, log_d = std::log(denom);
    for (int64_t ln = 0; ln < lanes; ++ln) {
      if (w.ready[ln] > cycle) continue;
      auto& a = w.arrivals[ln];
      size_t& ah = w.arrival_head[ln];
      const Request r = a[ah++].r;
      w.lane_busy[ln] = cycle + cpc;
      w.ready[ln] = ah < a.size() ? std::max(cycle + cpc, a[ah].cycle) : kNever;
      const int64_t j = r.token;
      const int b = on_demand ? r.chunk : kChunks - 1;
      w.ps[j] = b == 0 ? w.ps0[j] : MaskedDot(q, kh + j * d, d, mask[b], cfg.narrow);
      const double s_max = static_cast<double>(w.ps[j] + mmax[b]) * f - offset;
      const double s_min = static_cast<double>(w.ps[j] + mmin[b]) * f - offset;
      const double e_new = std::exp(s_min);
      delta += e_new - w.e_old[j];
      // Eq. 5: prune when p'' < thr; else request the next chunk, or the
      // token is done after the last. Written without branches (the
      // decision is data-dependent, so a branch mispredicts often); the
      // arithmetic is the same.
      const bool prune = have_d & (s_max - log_d < cfg.log_thr);
      const bool more = !prune & (b + 1 < kChunks);
      const double delta_pruned = delta - e_new;
      delta = prune ? delta_pruned : delta;
      w.e_old[j] = prune ? 0.0 : e_new;
      pruned[j] = prune ? static_cast<int8_t>(b) : pruned[j];
      counts.pruned_after[b] += prune;
      w.memq[mem_tail] = {static_cast<int32_t>(j), static_cast<int8_t>(b + 1), r.lane};
      mem_tail += more;
      w.lane_inflight[ln] -= !more;
      done += !more;
    }
    denom = std::max(0.0, denom + delta);
    if (done == l) break;
    // Idle cycles (every token issued, the memory queue empty, no lane able
    // to take an arrival) change nothing but the memory credit, which ends
    // each of them at one cycle's worth: skip to the next arrival a lane
    // can take, with that credit. The cycles counted are the same.
    if (issued == l && mem_head == mem_tail) {
      const int64_t next = *std::min_element(w.ready.begin(), w.ready.end());
      if (next != kNever && next > cycle + 1) {
        cycle = next - 1;
        credit = cfg.bpc;
      }
    }
  }
  // Step 1: softmax over the kept tokens and the weighted sum of their V
  // (skipped when only the counts are wanted: they do not depend on V).
  int64_t kept = 0;
  if (vh == nullptr) {
    for (int64_t j = 0; j < l; ++j) kept += pruned[j] < 0;
  } else {
    w.acc.assign(d, 0.0);
    double sum = 0;
    for (int64_t j = 0; j < l; ++j) {
      if (pruned[j] >= 0) continue;
      ++kept;
      const double p = std::exp(static_cast<double>(w.ps[j]) * f - offset);
      sum += p;
      for (int64_t c = 0; c < d; ++c) w.acc[c] += p * vh[j * d + c];
    }
    for (int64_t c = 0; c < d; ++c) {
      // Only a threshold near 1 / (tokens decided in one cycle) can prune
      // every token; the output is then zero.
      out[c] = sum > 0 ? static_cast<float>(w.acc[c] * v_scale / sum) : 0.0f;
    }
  }
  counts.v_fetched = kept;
  counts.k_bytes = on_demand ? (counts.chunk_fetched[0] + counts.chunk_fetched[1] +
                                counts.chunk_fetched[2]) * cfg.chunk_bytes
                             : static_cast<double>(l) * cfg.row_bytes;
  counts.v_bytes = static_cast<double>(kept) * cfg.row_bytes;
  const double v_cycles =
      kept > 0 ? std::max(std::ceil(counts.v_bytes / cfg.bpc - 1e-9),
                          static_cast<double>(CeilDiv(kept, lanes) * cpc)) + lat
               : 0.0;
  counts.sim_cycles = static_cast<double>(cycle + 1) + v_cycles;
  return counts;
}

template <typename T>
absl::StatusOr<TopickKernelResult> RunKernelAs(const TopickDevice& dev, const AttentionCall& call) {
  const int64_t heads = call.q.shape[0], d = call.q.shape[2];
  const int64_t kv_heads = call.k.shape[0], l = call.k.shape[1];
  const int64_t group = heads / kv_heads;
  const double scale = call.scale != 0 ? call.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const KernelConfig cfg = MakeConfig(dev, d);
  std::vector<float> qs, ks, vs;
  const float* qf = AsFloats(call.q, &qs);
  const float* kf = AsFloats(call.k, &ks);
  const float* vf = AsFloats(call.v, &vs);
  // K and V in fixed point, one scale per KV head.
  std::vector<T> kq(kv_heads * l * d), vq(kv_heads * l * d);
  std::vector<double> sk(kv_heads), sv(kv_heads);
  for (int64_t g = 0; g < kv_heads; ++g) {
    sk[g] = QuantiseFixed(kf + g * l * d, l * d, cfg.bits, kq.data() + g * l * d);
    sv[g] = QuantiseFixed(vf + g * l * d, l * d, cfg.bits, vq.data() + g * l * d);
  }
  TopickKernelResult result;
  result.out = Tensor::Zeros(ElementType::kFp32, {heads, 1, d});
  result.pruned_after_chunk.assign(heads * l, -1);
  std::vector<float> out(d);
  TopickWorkspace<T> w;
  for (int64_t h = 0; h < heads; ++h) {
    RETURN_IF_ERROR(PollInterrupt());
    const int64_t g = h / group;
    const TopickCounts counts =
        RunHead<T>(cfg, qf + h * d, kq.data() + g * l * d, vq.data() + g * l * d, sk[g], sv[g], l,
                   d, scale, w, out.data(), result.pruned_after_chunk.data() + h * l);
    for (int64_t c = 0; c < d; ++c) result.out.Set(h * d + c, out[c]);
    result.stats.kv_positions += l;
    result.stats.kv_positions_read += counts.chunk_fetched[0];
    result.stats.v_rows_read += counts.v_fetched;
    result.stats.bytes_read += counts.k_bytes + counts.v_bytes;
    result.counts += counts;
  }
  return result;
}

}  // namespace

TopickCounts& TopickCounts::operator+=(const TopickCounts& o) {
  heads += o.heads;
  tokens += o.tokens;
  for (int b = 0; b < kTopickMaxChunks; ++b) {
    chunk_fetched[b] += o.chunk_fetched[b];
    pruned_after[b] += o.pruned_after[b];
  }
  v_fetched += o.v_fetched;
  k_bytes += o.k_bytes;
  v_bytes += o.v_bytes;
  sim_cycles += o.sim_cycles;
  return *this;
}

// -------------------------------------------------------------- Create ----

absl::StatusOr<std::unique_ptr<Device>> TopickDevice::Create(const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_topick()) {
    return absl::InvalidArgumentError("topick device: DeviceSpec.topick is not set");
  }
  const TopickSpec& t = spec.topick().topick();
  RETURN_IF_ERROR(RequireResolved(t, "topick", "TopickPreset"));
  for (auto [v, name, lo, hi] :
       {std::tuple<int64_t, const char*, int64_t, int64_t>{t.pe_lanes(), "pe_lanes", 1, 4096},
        {t.multipliers_per_lane(), "multipliers_per_lane", 1, 65536},
        {t.hbm_channels(), "hbm_channels", 1, 1024},
        {t.scoreboard_entries(), "scoreboard_entries", 1, 1 << 20},
        {t.chunk_bits(), "chunk_bits", 1, 8}}) {
    if (v < lo || v > hi) return Bad(name, static_cast<double>(v), absl::StrCat("in [", lo, ", ", hi, "]"));
  }
  if (t.operand_bits() != 3 * t.chunk_bits()) {
    return Bad("operand_bits", t.operand_bits(),
               absl::StrCat("3 x chunk_bits (", 3 * t.chunk_bits(), "): K is fetched in three chunks"));
  }
  // Upper limits keep cycle counts inside an integer (the DRAM latency in
  // cycles is added to int64 cycle stamps).
  for (auto [v, name, hi] :
       {std::tuple<double, const char*, double>{t.clock_hz(), "clock_hz", 1e11},
        {t.channel_bandwidth_bytes_per_s(), "channel_bandwidth_bytes_per_s", 1e15}}) {
    if (!(v > 0 && v <= hi)) return Bad(name, v, absl::StrCat("in (0, ", hi, "]"));
  }
  if (!(t.dram_latency_s() >= 0 && t.dram_latency_s() <= 1e-3)) {
    return Bad("dram_latency_s", t.dram_latency_s(), "in [0, 0.001]");
  }
  // The cycle-level kernel serves memory one cycle at a time: below 1/16
  // byte per cycle a head would take billions of cycles to simulate.
  const double bytes_per_cycle = BytesPerCycleOf(t);
  if (!(bytes_per_cycle >= 1.0 / 16)) {
    return Bad("channel_bandwidth_bytes_per_s", t.channel_bandwidth_bytes_per_s(),
               absl::StrCat("at least clock_hz / (16 x hbm_channels) = ",
                            t.clock_hz() / (16.0 * t.hbm_channels()),
                            " (1/16 byte per cycle); hbm_channels x channel_bandwidth_bytes_per_s "
                            "/ clock_hz = ",
                            bytes_per_cycle));
  }
  for (auto [v, name] :
       {std::pair<double, const char*>{t.lane_datapath_mw(), "lane_datapath_mw"},
        {t.lane_pec_mw(), "lane_pec_mw"},
        {t.lane_scoreboard_mw(), "lane_scoreboard_mw"}, {t.lane_rpdu_mw(), "lane_rpdu_mw"},
        {t.mux_network_mw(), "mux_network_mw"}, {t.margin_generator_mw(), "margin_generator_mw"},
        {t.dag_mw(), "dag_mw"}, {t.onchip_buffer_mw(), "onchip_buffer_mw"},
        {t.other_mw(), "other_mw"}, {t.dram_pj_per_bit(), "dram_pj_per_bit"}}) {
    if (!(v >= 0) || !std::isfinite(v)) return Bad(name, v, ">= 0");
  }
  if (!(t.threshold() >= 0 && t.threshold() < 1)) return Bad("threshold", t.threshold(), "in [0, 1)");
  if (t.on_demand_k() && !t.estimation()) {
    return absl::InvalidArgumentError(
        "topick device: on_demand_k = true needs estimation = true (the RPDU decides which chunk "
        "to request from the estimate)");
  }
  const auto& ds = spec.topick();
  const auto fidelity = ds.fidelity();
  if (fidelity < servesim::v1::PRUNE_FIDELITY_UNSPECIFIED || fidelity > servesim::v1::PRUNE_FIDELITY_FULL) {
    return Bad("fidelity", fidelity, "PRUNE_FIDELITY_ANALYTIC, _CALIBRATED or _FULL");
  }
  RETURN_IF_ERROR(CheckAttentionShape("topick", ds.model()));
  if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL) {
    const auto& m = ds.model();
    if (!m.has_layers() || !m.has_heads() || !m.has_d_head() || m.layers() < 1 ||
        m.heads() < 1 || m.d_head() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topick device: FULL fidelity needs model.layers >= 1, model.heads >= 1 and "
          "model.d_head >= 16 (got ", m.layers(), ", ", m.heads(), ", ", m.d_head(), ")"));
    }
  }
  if (ds.calibration().has_instances() &&
      (ds.calibration().instances() < 1 || ds.calibration().instances() > 1024)) {
    return Bad("calibration.instances", ds.calibration().instances(), "in [1, 1024]");
  }
  for (int64_t l : ds.calibration().lengths()) {
    if (l < 1 || l > (1 << 20)) return Bad("calibration.lengths", static_cast<double>(l), "in [1, 1048576]");
  }
  auto dev = std::unique_ptr<TopickDevice>(new TopickDevice(ds));
  if (fidelity == servesim::v1::PRUNE_FIDELITY_ANALYTIC ||
      fidelity == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED) {
    ASSIGN_OR_RETURN(auto row, TopickAnalyticFractions(t.preset()));
    ASSIGN_OR_RETURN(const TopickSpec preset, TopickPreset(t.preset()));
    RETURN_IF_ERROR(CheckAnalyticKnobs(
        "topick", t, preset, {"estimation", "on_demand_k", "threshold", "operand_bits", "chunk_bits"}));
    RETURN_IF_ERROR(CheckAnalyticUnused("topick", ds.data(), "data"));
    dev->profile_.lengths = {1.0};
    dev->profile_.rows = {{row[0], row[1], row[2]}};
    dev->profile_.Tabulate();
  } else {
    const int64_t d = ds.model().has_d_head() ? ds.model().d_head() : 64;
    ASSIGN_OR_RETURN(dev->source_, MakeAttentionSource(ds.data(), d));
    // FULL calibrates too: sequences with no request id (hypothetical
    // batches: the SLO cap, studies) are costed from the profile.
    RETURN_IF_ERROR(dev->Calibrate());
    if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL && FullKvCache::Fits(t.operand_bits())) {
      dev->cache_ = std::make_unique<FullKvCache>(dev->source_.get(), ds.model().layers(),
                                                  ds.model().heads(), t.operand_bits(),
                                                  /*keep_v=*/false,
                                                  FullCacheCap(ds.full_cache_bytes()));
    }
  }
  return std::unique_ptr<Device>(std::move(dev));
}

TopickDevice::TopickDevice(const servesim::v1::TopickDeviceSpec& spec) : spec_(spec) {}

absl::Status TopickDevice::Calibrate() {
  const auto start = std::chrono::steady_clock::now();
  const int instances = CalibrationInstances(spec_.calibration());
  constexpr int kHeads = 4;
  // Layers and heads within the model's shape when it is given (captured
  // .npy data has only those); the generator only seeds by them.
  const auto& m = spec_.model();
  const int layers = m.has_layers() && m.layers() > 0 ? m.layers() : 1 << 20;
  const int heads = m.has_heads() && m.heads() > 0 ? m.heads() : 1 << 20;
  for (int64_t l : CalibrationLengths(spec_.calibration())) {
    TopickCounts sum;
    for (int i = 0; i < instances; ++i) {
      for (int h = 0; h < kHeads; ++h) {
        // Requests far from the ones a run uses, one layer per instance.
        const AttentionInstance in{int64_t{1} << 40 | i, i % layers, h % heads};
        ASSIGN_OR_RETURN(AttentionCall call, source_->DecodeStep(in, l));
        ASSIGN_OR_RETURN(TopickKernelResult r, RunKernel(call));
        sum += r.counts;
      }
    }
    const double n = static_cast<double>(sum.tokens);
    profile_.lengths.push_back(static_cast<double>(l));
    profile_.rows.push_back({sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n, sum.v_fetched / n});
  }
  profile_.Tabulate();
  calibration_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

// ------------------------------------------------------------ geometry ----

double TopickDevice::BytesPerCycle() const { return BytesPerCycleOf(spec()); }

double TopickDevice::PowerW() const {
  const TopickSpec& t = spec();
  double mw = t.pe_lanes() * t.lane_datapath_mw() + t.mux_network_mw() + t.onchip_buffer_mw() +
              t.other_mw();
  if (t.estimation()) mw += t.margin_generator_mw() + t.dag_mw() + t.pe_lanes() * t.lane_pec_mw();
  if (t.on_demand_k()) mw += t.pe_lanes() * (t.lane_scoreboard_mw() + t.lane_rpdu_mw());
  return mw * 1e-3;
}

TopickHeadCost TopickDevice::HeadCost(int64_t l, int64_t d, double f2, double f3, double fv) const {
  const TopickSpec& t = spec();
  TopickHeadCost h;
  if (l < 1 || d < 1) return h;
  const double bpc = BytesPerCycle();
  const double cpc = static_cast<double>(CeilDiv(d, t.multipliers_per_lane()));
  const double lanes = t.pe_lanes();
  const double lat = std::ceil(t.dram_latency_s() * t.clock_hz() - 1e-9);
  const double L = static_cast<double>(l);
  const double chunk_bytes = static_cast<double>(d) * t.chunk_bits() / 8.0;
  const double row_bytes = static_cast<double>(d) * t.operand_bits() / 8.0;
  double chunk_ops;
  if (!t.on_demand_k()) {
    h.k_bytes = L * row_bytes;
    chunk_ops = L;
    h.k_cycles = std::max(h.k_bytes / bpc, L * cpc / lanes) + lat;
  } else {
    const double n = L * (1.0 + f2 + f3);
    h.k_bytes = n * chunk_bytes;
    chunk_ops = n;
    const double depth = f3 > 0 ? 3 : (f2 > 0 ? 2 : 1);
    const double scoreboard = (L / lanes) * (n / L) * lat / t.scoreboard_entries();
    h.k_cycles = std::max({h.k_bytes / bpc, n * cpc / lanes, scoreboard}) + depth * lat;
  }
  const double kept = t.estimation() ? fv * L : L;
  h.v_bytes = kept * row_bytes;
  h.v_cycles = kept > 0 ? std::max(h.v_bytes / bpc, kept * cpc / lanes) + lat : 0.0;
  h.macs = (chunk_ops + kept) * static_cast<double>(d);
  return h;
}

DeviceDescription TopickDevice::Describe() const {
  const TopickSpec& t = spec();
  DeviceDescription d;
  d.kind = "topick";
  d.preset = t.preset();
  d.accepts = {OpKind::kAttention};
  // FULL runs the kernel per (request, L) and reports the mean of what it
  // was asked.
  d.lookahead_ok = spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL;
  d.measures_steps = spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL;
  d.splits_layers = d.measures_steps;  // heads are independent: counts add over layers
  d.parameters = {
      {"fidelity", static_cast<double>(spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED
                                           ? servesim::v1::PRUNE_FIDELITY_ANALYTIC
                                           : spec_.fidelity())},
      {"pe_lanes", static_cast<double>(t.pe_lanes())},
      {"multipliers_per_lane", static_cast<double>(t.multipliers_per_lane())},
      {"clock_hz", t.clock_hz()},
      {"dram_bandwidth_bytes_per_s", t.hbm_channels() * t.channel_bandwidth_bytes_per_s()},
      {"scoreboard_entries", static_cast<double>(t.scoreboard_entries())},
      {"dram_latency_s", t.dram_latency_s()},
      {"estimation", t.estimation() ? 1.0 : 0.0},
      {"on_demand_k", t.on_demand_k() ? 1.0 : 0.0},
      {"threshold", t.threshold()},
      {"operand_bits", static_cast<double>(t.operand_bits())},
      {"chunk_bits", static_cast<double>(t.chunk_bits())},
      {"power_w", PowerW()},
      {"dram_pj_per_bit", t.dram_pj_per_bit()},
      {"calibration_s", calibration_s_},
  };
  // Measured (CALIBRATED), tabulated (ANALYTIC) or averaged so far (FULL)
  // keep ratios at L = 1024.
  // FULL: the mean over every (request, L) step run so far, summed in key
  // order so the figure is the same on every host.
  std::array<double, 3> f{0, 0, 0};
  bool have = false;
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL) {
    std::lock_guard<std::mutex> lock(memo_mu_);
    std::vector<std::pair<std::pair<int64_t, int64_t>, std::array<double, 3>>> steps(
        memo_.begin(), memo_.end());
    std::sort(steps.begin(), steps.end());
    for (const auto& [key, v] : steps) {
      for (int i = 0; i < 3; ++i) f[i] += v[i] / static_cast<double>(steps.size());
      have = true;
    }
  } else if (!profile_.rows.empty()) {
    const auto row = profile_.Eval(1024);
    f = {row[0], row[1], row[2]};
    have = true;
  }
  if (have) {
    d.parameters.push_back({"chunk2_fraction", f[0]});
    d.parameters.push_back({"chunk3_fraction", f[1]});
    d.parameters.push_back({"kept_fraction", f[2]});
    d.parameters.push_back({"v_pruning_ratio", f[2] > 0 ? 1.0 / f[2] : 0.0});
  }
  return d;
}

// ------------------------------------------------------------ Estimate ----

absl::StatusOr<std::array<double, 3>> TopickDevice::Fractions(int64_t request_id, int64_t l,
                                                              int64_t d_head) const {
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL && request_id >= 0) {
    return FullFractions(request_id, l);
  }
  std::vector<double> scratch;
  const double* row = profile_.Row(l, &scratch);
  return std::array<double, 3>{row[0], row[1], row[2]};
}

absl::StatusOr<std::array<double, 3>> TopickDevice::FullFractions(int64_t request_id,
                                                                  int64_t l) const {
  if (request_id < 0) {
    return absl::InvalidArgumentError(
        "topick device: FULL fidelity needs AttentionSeq.request_id >= 0 (got -1)");
  }
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    auto it = memo_.find({request_id, l});
    if (it != memo_.end()) return it->second;
  }
  // Computed outside the lock; two threads racing on one key compute the
  // same value (the kernel is deterministic), so either insert is right.
  ASSIGN_OR_RETURN(const TopickCounts sum, FullCounts(request_id, l, 0, spec_.model().layers()));
  const std::array<double, 3> f = FractionsOfCounts(
      {static_cast<double>(sum.tokens), static_cast<double>(sum.chunk_fetched[1]),
       static_cast<double>(sum.chunk_fetched[2]), static_cast<double>(sum.v_fetched)});
  std::lock_guard<std::mutex> lock(memo_mu_);
  if (memo_.emplace(std::make_pair(request_id, l), f).second) fresh_.Add(request_id, l);
  return f;
}

std::array<double, 3> TopickDevice::FractionsOfCounts(const std::array<double, 4>& c) {
  // {tokens, chunk 2 fetched, chunk 3 fetched, V fetched}, summed over heads.
  const double n = c[0];
  return {c[1] / n, c[2] / n, c[3] / n};
}

absl::StatusOr<TopickCounts> TopickDevice::FullCounts(int64_t request_id, int64_t l,
                                                      int32_t layer_begin,
                                                      int32_t layer_end) const {
  const auto& m = spec_.model();
  TopickCounts sum;
  if (cache_ != nullptr) {
    // The request's fixed-point K rows, grown by one row per step (the
    // counts never read V); the same integers RunKernel would quantise.
    const int64_t d = source_->d_head();
    const KernelConfig cfg = MakeConfig(*this, d);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    FullKvCache::Lease lease = cache_->Acquire(request_id);
    TopickWorkspace<int16_t> w;
    std::vector<float> q(d);
    std::vector<int8_t> pruned(l);
    for (int32_t layer = layer_begin; layer < layer_end; ++layer) {
      for (int32_t head = 0; head < m.heads(); ++head) {
        ASSIGN_OR_RETURN(FullKvCache::View kv, lease.Rows(layer, head, l));
        RETURN_IF_ERROR(source_->StepQuery({request_id, layer, head}, l, q.data()));
        sum += RunHead<int16_t>(cfg, q.data(), kv.k, nullptr, kv.k_scale, 1.0, l, d, scale, w,
                                nullptr, pruned.data());
      }
    }
  } else {
    for (int32_t layer = layer_begin; layer < layer_end; ++layer) {
      for (int32_t head = 0; head < m.heads(); ++head) {
        ASSIGN_OR_RETURN(AttentionCall call, source_->DecodeStep({request_id, layer, head}, l));
        ASSIGN_OR_RETURN(TopickKernelResult r, RunKernel(call));
        sum += r.counts;
      }
    }
  }
  return sum;
}

absl::StatusOr<std::vector<StepMeasurement>> TopickDevice::MeasureLayers(
    absl::Span<const StepKey> steps, int part, int parts) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) {
    return Device::MeasureLayers(steps, part, parts);
  }
  return MeasureShares<4>(
      "topick", steps, part, parts, spec_.model().layers(),
      [&](const StepKey& k, int32_t begin, int32_t end) -> absl::StatusOr<std::array<double, 4>> {
        ASSIGN_OR_RETURN(const TopickCounts c, FullCounts(k.request_id, k.l, begin, end));
        return std::array<double, 4>{
            static_cast<double>(c.tokens), static_cast<double>(c.chunk_fetched[1]),
            static_cast<double>(c.chunk_fetched[2]), static_cast<double>(c.v_fetched)};
      });
}

absl::StatusOr<std::vector<StepMeasurement>> TopickDevice::Measure(
    absl::Span<const StepKey> steps) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Measure(steps);
  return MeasureMemo<3>("topick", steps, memo_mu_, fresh_, memo_,
                        [&](int64_t r, int64_t l) { return FullFractions(r, l); });
}

absl::Status TopickDevice::Absorb(absl::Span<const StepMeasurement> measured) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Absorb(measured);
  return AbsorbMemoWithShares<3, 4>(
      "topick", measured, memo_mu_, memo_,
      [](const StepKey&, const std::array<double, 4>& c) { return FractionsOfCounts(c); });
}

Cost TopickDevice::HeadCostToCost(const TopickHeadCost& h, double heads) const {
  const TopickSpec& t = spec();
  Cost c;
  c.cycles = (h.k_cycles + h.v_cycles) * heads;
  c.time_s = c.cycles / t.clock_hz();
  c.score_s = h.k_cycles * heads / t.clock_hz();
  c.context_s = h.v_cycles * heads / t.clock_hz();
  c.dram_bytes = (h.k_bytes + h.v_bytes) * heads;
  c.flops = 2.0 * h.macs * heads;
  c.compute_energy_pj = PowerW() * c.time_s * 1e12;
  c.dram_energy_pj = c.dram_bytes * 8.0 * t.dram_pj_per_bit();
  return c;
}

absl::Status TopickDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  RETURN_IF_ERROR(CheckAttentionOps("topick", ops, costs.size()));
  const TopickSpec& t = spec();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const double heads = static_cast<double>(OpHeadCount(op));
    Cost total;
    for (const AttentionSeq& s : op.seqs) {
      const int64_t l = s.past_tokens + s.new_tokens;
      if (s.new_tokens == 1) {
        ASSIGN_OR_RETURN(auto f, Fractions(s.request_id, l, op.d_head));
        total += HeadCostToCost(HeadCost(l, op.d_head, f[0], f[1], f[2]), heads);
      } else {
        // Prefill: dense, K and V of the whole context loaded once into the
        // on-chip buffers and reused by every query (§4).
        const double bpc = BytesPerCycle();
        const double row = static_cast<double>(op.d_head) * t.operand_bits() / 8.0;
        const double n = static_cast<double>(s.new_tokens), p = static_cast<double>(s.past_tokens);
        const double pairs = n * p + n * (n + 1) / 2;  // causal (query, key) pairs
        TopickHeadCost h;
        h.k_bytes = static_cast<double>(l) * row;
        h.v_bytes = static_cast<double>(l) * row;
        h.macs = 2 * pairs * static_cast<double>(op.d_head);
        h.k_cycles = std::max((h.k_bytes + h.v_bytes) / bpc,
                              h.macs / (static_cast<double>(t.pe_lanes()) * t.multipliers_per_lane())) +
                     std::ceil(t.dram_latency_s() * t.clock_hz() - 1e-9);
        total += HeadCostToCost(h, heads);
      }
    }
    costs[i] = total;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- Execute ----

absl::StatusOr<AttentionResult> TopickDevice::Execute(const AttentionCall& call) const {
  ASSIGN_OR_RETURN(TopickKernelResult r, RunKernel(call));
  AttentionResult out;
  out.out = std::move(r.out);
  out.stats = r.stats;
  return out;
}

absl::StatusOr<TopickKernelResult> TopickDevice::RunKernel(const AttentionCall& call) const {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  if (call.q.shape[1] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topick kernel runs decode attention (q has ", call.q.shape[1], " tokens; expected 1)"));
  }
  // The integers are the same in either width; int16 is faster.
  if (FullKvCache::Fits(spec().operand_bits())) return RunKernelAs<int16_t>(*this, call);
  return RunKernelAs<int32_t>(*this, call);
}

SERVESIM_REGISTER_DEVICE(kTopick, "topick", &TopickDevice::Create);

}  // namespace servesim::devices
