// SpAtten device: the session kernel, Alg. 3, the cycle model and the
// fidelity modes the header describes.
#include "devices/spatten/spatten_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "devices/interrupt.h"
#include "devices/presets.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "google/protobuf/descriptor.h"

namespace servesim::devices {
namespace {

using servesim::v1::SpattenSpec;

absl::Status Bad(absl::string_view field, double v, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("spatten device: ", field, " = ", v, "; expected ", expected));
}

double Interpolate(int layer, int layers, double front, double start, double end) {
  const int n_front = static_cast<int>(std::lround(front * layers));
  if (layer < n_front) return 0.0;
  const int m = layers - n_front;
  if (m <= 1) return start;
  return start + (end - start) * (layer - n_front) / (m - 1);
}

}  // namespace

// ---------------------------------------------------------------- top-k --

TopK QuickSelect(const std::vector<double>& values, int64_t k, uint64_t seed, int64_t* work) {
  Rng rng(seed, "spatten.topk");
  std::vector<double> fifo_l = values, fifo_r, next_l, next_r;
  int64_t target = k, num_eq_pivot = 0, pushed = 0;
  double pivot = 0;
  TopK out;
  if (k <= 0 || values.empty()) return out;
  while (true) {
    int select;
    if (static_cast<int64_t>(fifo_r.size()) + num_eq_pivot <= target) {
      // The pivot was too large (or no pivot yet): search the left part.
      target -= static_cast<int64_t>(fifo_r.size()) + num_eq_pivot;
      fifo_r.clear();
      select = 0;
      pivot = fifo_l[rng.UniformInt(fifo_l.size())];
    } else if (static_cast<int64_t>(fifo_r.size()) > target) {
      fifo_l.clear();
      select = 1;
      pivot = fifo_r[rng.UniformInt(fifo_r.size())];
    } else {
      out.kth = pivot;
      out.num_eq = target - static_cast<int64_t>(fifo_r.size());
      break;
    }
    // STATE_RUN: partition FIFO[select] around the pivot.
    std::vector<double>& src = select == 0 ? fifo_l : fifo_r;
    next_l.clear();
    next_r.clear();
    num_eq_pivot = 0;
    for (double item : src) {
      ++pushed;
      if (item < pivot) {
        next_l.push_back(item);
      } else if (item > pivot) {
        next_r.push_back(item);
      } else {
        ++num_eq_pivot;
      }
    }
    fifo_l.swap(next_l);
    fifo_r.swap(next_r);
  }
  if (work != nullptr) *work += pushed;
  return out;
}

std::vector<int64_t> TopKIndices(const std::vector<double>& values, int64_t k, uint64_t seed,
                                 int64_t* work) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<int64_t> idx;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  if (k <= 0) return idx;
  const TopK t = QuickSelect(values, k, seed, work);
  int64_t eq = t.num_eq;
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] > t.kth || (values[i] == t.kth && eq-- > 0)) idx.push_back(i);
  }
  if (work != nullptr) *work += n;  // the filter pass
  return idx;
}

SpattenCounts& SpattenCounts::operator+=(const SpattenCounts& o) {
  heads += o.heads;
  heads_run += o.heads_run;
  context += o.context;
  k_tokens += o.k_tokens;
  v_rows += o.v_rows;
  lsb_heads += o.lsb_heads;
  topk_token_work += o.topk_token_work;
  topk_value_work += o.topk_value_work;
  k_bytes += o.k_bytes;
  v_bytes += o.v_bytes;
  return *this;
}

// -------------------------------------------------------------- session --

SpattenSession::SpattenSession(const SpattenDevice& device, int layers, int heads)
    : dev_(device), layers_(layers), heads_(heads), head_importance_(heads, 0.0),
      head_alive_(heads, 1) {}

namespace {

// q . k with the low bits of both cleared by `mask` (the MSBs: in two's
// complement (x >> s) * 2^s == x & ~(2^s - 1)); q is already masked.
template <typename T>
inline int64_t MsbDot(const T* q, const T* k, int64_t d, T mask, bool narrow) {
  if (narrow) {
    int32_t s = 0;
    for (int64_t x = 0; x < d; ++x) {
      s += static_cast<int32_t>(q[x]) * static_cast<int32_t>(static_cast<T>(k[x] & mask));
    }
    return s;
  }
  int64_t s = 0;
  for (int64_t x = 0; x < d; ++x) s += int64_t{q[x]} * static_cast<T>(k[x] & mask);
  return s;
}

}  // namespace

absl::StatusOr<AttentionResult> SpattenSession::RunLayer(int layer, const AttentionCall& call,
                                                         SpattenCounts* counts) {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  const SpattenSpec& t = dev_.spec();
  const int64_t heads = call.q.shape[0], d = call.q.shape[2];
  const int64_t kv_heads = call.k.shape[0], l = call.k.shape[1];
  if (call.q.shape[1] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spatten session runs decode steps (q has ", call.q.shape[1], " tokens; expected 1)"));
  }
  const int bits = t.msb_bits() + t.lsb_bits();
  std::vector<float> qs, ks, vs;
  const float* qf = AsFloats(call.q, &qs);
  const float* kf = AsFloats(call.k, &ks);
  const float* vf = AsFloats(call.v, &vs);
  AttentionResult result;
  result.out = Tensor::Zeros(ElementType::kFp32, {heads, 1, d});
  std::vector<float> out(heads * d, 0.0f);
  SpattenCounts c;
  // K and V in fixed point, one scale per KV head (the integers are the same
  // in either width; int16 is faster).
  auto run = [&](auto zero) -> absl::Status {
    using T = decltype(zero);
    std::vector<T> kq(kv_heads * l * d), vq(kv_heads * l * d);
    std::vector<FixedKvHead<T>> kv(kv_heads);
    for (int64_t g = 0; g < kv_heads; ++g) {
      kv[g].k = kq.data() + g * l * d;
      kv[g].v = vq.data() + g * l * d;
      kv[g].k_scale = QuantiseFixed(kf + g * l * d, l * d, bits, kq.data() + g * l * d);
      kv[g].v_scale = QuantiseFixed(vf + g * l * d, l * d, bits, vq.data() + g * l * d);
    }
    return RunLayerFixed<T>(layer, qf, heads, kv_heads, l, d, call.scale, kv.data(), out.data(), &c);
  };
  RETURN_IF_ERROR(FullKvCache::Fits(bits) ? run(int16_t{0}) : run(int32_t{0}));
  for (int64_t i = 0; i < heads * d; ++i) result.out.Set(i, out[i]);
  result.stats.kv_positions = heads * l;
  result.stats.kv_positions_read = c.k_tokens;
  result.stats.v_rows_read = c.v_rows;
  result.stats.bytes_read = c.k_bytes + c.v_bytes;
  if (counts != nullptr) *counts += c;
  return result;
}

template <typename T>
absl::Status SpattenSession::RunLayerFixed(int layer, const float* q_in, int64_t heads,
                                           int64_t kv_heads, int64_t l, int64_t d,
                                           double call_scale, const FixedKvHead<T>* kv,
                                           float* out, SpattenCounts* counts) {
  const SpattenSpec& t = dev_.spec();
  if (heads != heads_ || layer < 0 || layer >= layers_ || kv_heads < 1 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("spatten session of ", layers_, " layers x ",
                                                   heads_, " heads got layer ", layer, " with ",
                                                   heads, " heads, ", kv_heads, " KV heads"));
  }
  if (l < last_l_) {
    return absl::InvalidArgumentError(
        absl::StrCat("spatten session: context ", l, " below the previous step's ", last_l_));
  }
  const int64_t group = heads / kv_heads;
  last_l_ = l;
  if (layer == 0) std::fill(head_alive_.begin(), head_alive_.end(), 1);
  token_importance_.resize(l, 0.0);
  token_pruned_.resize(l, 0);
  const double scale = call_scale != 0 ? call_scale : 1.0 / std::sqrt(static_cast<double>(d));
  const uint64_t seed = (static_cast<uint64_t>(l) << 16) ^ static_cast<uint64_t>(layer);
  SpattenCounts c;

  // Cascade token pruning: keep at most ceil(L (1 - r_t)) tokens, the
  // current one always.
  const double rt = dev_.TokenRatio(layer, layers_);
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(l * (1.0 - rt) - 1e-9)));
  std::vector<int64_t>& alive = alive_;
  alive.clear();
  for (int64_t j = 0; j + 1 < l; ++j) {
    if (!token_pruned_[j]) alive.push_back(j);
  }
  if (static_cast<int64_t>(alive.size()) + 1 > cap) {
    std::vector<double> imp(alive.size());
    for (size_t i = 0; i < alive.size(); ++i) imp[i] = token_importance_[alive[i]];
    int64_t work = 0;
    const auto keep = TopKIndices(imp, cap - 1, seed, &work);
    c.topk_token_work += work;
    std::vector<int64_t> kept;
    size_t ki = 0;
    for (size_t i = 0; i < alive.size(); ++i) {
      if (ki < keep.size() && keep[ki] == static_cast<int64_t>(i)) {
        kept.push_back(alive[i]);
        ++ki;
      } else {
        token_pruned_[alive[i]] = 1;
      }
    }
    alive.swap(kept);
  }
  alive.push_back(l - 1);
  const int64_t n = static_cast<int64_t>(alive.size());

  const int msb = t.msb_bits(), lsb = t.lsb_bits(), bits = msb + lsb;
  const int64_t qmax = (int64_t{1} << (bits - 1)) - 1;
  // Dot products of d terms fit int32 (MSB-cleared operands are at most
  // 2^(bits-1) in magnitude).
  const bool narrow = d * (qmax + 1) * (qmax + 1) < (int64_t{1} << 31);
  std::vector<T> q(d), qm(d);
  std::vector<double>& s = s_;
  std::vector<double>& p = p_;
  s.resize(n);
  p.resize(n);
  std::vector<double> acc(d);
  const double v_keep_frac = 1.0 - t.value_ratio();
  for (int64_t h = 0; h < heads; ++h) {
    RETURN_IF_ERROR(PollInterrupt());
    ++c.heads;
    c.context += l;
    if (!head_alive_[h]) continue;
    ++c.heads_run;
    const int64_t g = h / group;
    const T* kh = kv[g].k;
    const T* vh = kv[g].v;
    const double sq = QuantiseFixed(q_in + h * d, d, bits, q.data());
    const double f = sq * kv[g].k_scale * scale;
    auto softmax = [&](int drop) {
      const T mask = static_cast<T>(~((int64_t{1} << drop) - 1));
      for (int64_t x = 0; x < d; ++x) qm[x] = static_cast<T>(q[x] & mask);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t dot = MsbDot(qm.data(), kh + alive[i] * d, d, mask, narrow);
        s[i] = static_cast<double>(dot) * f;
        mx = std::max(mx, s[i]);
      }
      double z = 0, pmax = 0;
      for (int64_t i = 0; i < n; ++i) z += (p[i] = std::exp(s[i] - mx));
      for (int64_t i = 0; i < n; ++i) pmax = std::max(pmax, p[i] /= z);
      return pmax;
    };
    int drop = lsb;
    const double pmax = softmax(drop);
    c.k_tokens += n;
    c.k_bytes += static_cast<double>(n) * d * msb / 8.0;
    if (lsb > 0 && pmax < t.lsb_threshold()) {  // flat: fetch LSBs, recompute
      drop = 0;
      softmax(0);
      ++c.lsb_heads;
      c.k_bytes += static_cast<double>(n) * d * lsb / 8.0;
    }
    // Local value pruning, then prob x V at the width the head ended with.
    const int64_t kvn = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(n * v_keep_frac - 1e-9)));
    std::vector<int64_t> vsel;
    if (kvn < n) {
      int64_t work = 0;
      vsel = TopKIndices(p, kvn, seed ^ (0x9e37ULL * (h + 1)), &work);
      c.topk_value_work += work;
    } else {
      for (int64_t i = 0; i < n; ++i) vsel.push_back(i);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    const T vmask = static_cast<T>(~((int64_t{1} << drop) - 1));
    for (int64_t i : vsel) {
      const T* v = vh + alive[i] * d;
      const double pi = p[i];
      for (int64_t x = 0; x < d; ++x) acc[x] += pi * static_cast<T>(v[x] & vmask);
    }
    c.v_rows += static_cast<int64_t>(vsel.size());
    c.v_bytes += static_cast<double>(vsel.size()) * d * (bits - drop) / 8.0;
    double mag = 0;
    for (int64_t x = 0; x < d; ++x) {
      const double o = acc[x] * kv[g].v_scale;
      if (out != nullptr) out[h * d + x] = static_cast<float>(o);
      mag += std::fabs(o);
    }
    for (int64_t i = 0; i < n; ++i) token_importance_[alive[i]] += p[i];
    head_importance_[h] += mag;
  }
  // Cascade head pruning for the next layer.
  if (layer + 1 < layers_) {
    const double rh = dev_.HeadRatio(layer + 1, layers_);
    const int64_t hcap = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(heads_ * (1.0 - rh) - 1e-9)));
    std::vector<int64_t> live;
    for (int64_t h = 0; h < heads_; ++h) {
      if (head_alive_[h]) live.push_back(h);
    }
    if (static_cast<int64_t>(live.size()) > hcap) {
      std::vector<double> imp(live.size());
      for (size_t i = 0; i < live.size(); ++i) imp[i] = head_importance_[live[i]];
      const auto keep = TopKIndices(imp, hcap, seed ^ 0x5bd1e995ULL, nullptr);
      std::fill(head_alive_.begin(), head_alive_.end(), 0);
      for (int64_t i : keep) head_alive_[live[i]] = 1;
    }
  }
  if (counts != nullptr) *counts += c;
  return absl::OkStatus();
}

// -------------------------------------------------------------- Create ----

absl::StatusOr<std::unique_ptr<Device>> SpattenDevice::Create(const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_spatten()) return absl::InvalidArgumentError("spatten device: DeviceSpec.spatten is not set");
  const SpattenSpec& t = spec.spatten().spatten();
  RETURN_IF_ERROR(RequireResolved(t, "spatten", "SpattenPreset"));
  for (auto [v, name] : {std::pair<int64_t, const char*>{t.qk_multipliers(), "qk_multipliers"},
                         {t.pv_multipliers(), "pv_multipliers"},
                         {t.adder_tree_outputs(), "adder_tree_outputs"},
                         {t.softmax_lanes(), "softmax_lanes"},
                         {t.topk_comparators(), "topk_comparators"},
                         {t.hbm_channels(), "hbm_channels"}}) {
    if (v < 1) return Bad(name, static_cast<double>(v), ">= 1");
  }
  for (auto [v, name] : {std::pair<double, const char*>{t.clock_hz(), "clock_hz"},
                         {t.channel_bandwidth_bytes_per_s(), "channel_bandwidth_bytes_per_s"}}) {
    if (!(v > 0) || !std::isfinite(v)) return Bad(name, v, "> 0 and finite");
  }
  for (auto [v, name] :
       {std::pair<double, const char*>{t.token_ratio_start(), "token_ratio_start"},
        {t.token_ratio_end(), "token_ratio_end"}, {t.head_ratio_start(), "head_ratio_start"},
        {t.head_ratio_end(), "head_ratio_end"}, {t.value_ratio(), "value_ratio"},
        {t.token_front_unpruned(), "token_front_unpruned"},
        {t.head_front_unpruned(), "head_front_unpruned"}}) {
    if (!(v >= 0 && v < 1)) return Bad(name, v, "in [0, 1)");
  }
  if (t.msb_bits() < 2 || t.msb_bits() > 16) return Bad("msb_bits", t.msb_bits(), "in [2, 16]");
  if (t.lsb_bits() < 0 || t.msb_bits() + t.lsb_bits() > 24) {
    return Bad("lsb_bits", t.lsb_bits(), "in [0, 24 - msb_bits]");
  }
  for (auto [v, name] : {std::pair<double, const char*>{t.dram_latency_s(), "dram_latency_s"},
                         {t.lsb_threshold(), "lsb_threshold"}, {t.logic_power_w(), "logic_power_w"},
                         {t.sram_power_w(), "sram_power_w"}, {t.dram_pj_per_bit(), "dram_pj_per_bit"}}) {
    if (!(v >= 0) || !std::isfinite(v)) return Bad(name, v, ">= 0");
  }
  const auto& ds = spec.spatten();
  const auto fidelity = ds.fidelity();
  if (fidelity < servesim::v1::PRUNE_FIDELITY_UNSPECIFIED || fidelity > servesim::v1::PRUNE_FIDELITY_FULL) {
    return Bad("fidelity", fidelity, "PRUNE_FIDELITY_ANALYTIC, _CALIBRATED or _FULL");
  }
  RETURN_IF_ERROR(CheckAttentionShape("spatten", ds.model()));
  const auto& m = ds.model();
  if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL &&
      (!m.has_layers() || !m.has_heads() || !m.has_d_head() || m.layers() < 1 || m.heads() < 1 ||
       m.d_head() < 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spatten device: FULL fidelity needs model.layers >= 1, model.heads >= 1 and "
        "model.d_head >= 24 (got ", m.layers(), ", ", m.heads(), ", ", m.d_head(), ")"));
  }
  auto dev = std::unique_ptr<SpattenDevice>(new SpattenDevice(ds));
  if (fidelity == servesim::v1::PRUNE_FIDELITY_ANALYTIC ||
      fidelity == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED) {
    ASSIGN_OR_RETURN(Row row, SpattenAnalyticRow(t.preset()));
    ASSIGN_OR_RETURN(const servesim::v1::SpattenSpec preset, SpattenPreset(t.preset()));
    RETURN_IF_ERROR(CheckAnalyticKnobs(
        "spatten", t, preset,
        {"token_ratio_start", "token_ratio_end", "token_front_unpruned", "head_ratio_start",
         "head_ratio_end", "head_front_unpruned", "value_ratio", "msb_bits", "lsb_bits",
         "lsb_threshold"}));
    RETURN_IF_ERROR(CheckAnalyticUnused("spatten", ds.data(), "data"));
    dev->profile_.lengths = {1.0};
    dev->profile_.rows = {std::vector<double>(row.begin(), row.end())};
    dev->profile_.Tabulate();
  } else {
    ASSIGN_OR_RETURN(dev->source_, MakeAttentionSource(ds.data(), m.has_d_head() ? m.d_head() : 64));
    // FULL calibrates too: sequences with no request id (hypothetical
    // batches: the SLO cap, studies) are costed from the profile.
    RETURN_IF_ERROR(dev->Calibrate());
    const int bits = t.msb_bits() + t.lsb_bits();
    if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL && FullKvCache::Fits(bits)) {
      dev->cache_ = std::make_unique<FullKvCache>(dev->source_.get(), m.layers(), m.heads(), bits,
                                                  /*keep_v=*/true,
                                                  FullCacheCap(ds.full_cache_bytes()));
    }
  }
  return std::unique_ptr<Device>(std::move(dev));
}

double SpattenDevice::TokenRatio(int layer, int layers) const {
  return Interpolate(layer, layers, spec().token_front_unpruned(), spec().token_ratio_start(),
                     spec().token_ratio_end());
}
double SpattenDevice::HeadRatio(int layer, int layers) const {
  return Interpolate(layer, layers, spec().head_front_unpruned(), spec().head_ratio_start(),
                     spec().head_ratio_end());
}

absl::StatusOr<AttentionCall> LayerCall(const AttentionSource& src, int64_t request, int layer,
                                        int heads, int64_t l) {
  const int64_t d = src.d_head();
  AttentionCall call;
  call.q = Tensor::Zeros(ElementType::kFp32, {heads, 1, d});
  call.k = Tensor::Zeros(ElementType::kFp32, {heads, l, d});
  call.v = Tensor::Zeros(ElementType::kFp32, {heads, l, d});
  for (int h = 0; h < heads; ++h) {
    ASSIGN_OR_RETURN(AttentionCall one, src.DecodeStep({request, layer, h}, l));
    std::copy(one.q.bytes.begin(), one.q.bytes.end(), call.q.bytes.begin() + h * d * 4);
    std::copy(one.k.bytes.begin(), one.k.bytes.end(), call.k.bytes.begin() + h * l * d * 4);
    std::copy(one.v.bytes.begin(), one.v.bytes.end(), call.v.bytes.begin() + h * l * d * 4);
  }
  return call;
}

namespace {

// One decode step of context l (every layer, in order) of `session` on the
// cache's rows of `request`, summed into *sum.
absl::Status CachedStep(const AttentionSource& src, FullKvCache::Lease& lease,
                        SpattenSession& session, int64_t request, int layers, int heads, int64_t l,
                        SpattenCounts* sum) {
  const int64_t d = src.d_head();
  std::vector<float> q(static_cast<size_t>(heads * d));
  std::vector<FullKvCache::View> kv(heads);
  for (int layer = 0; layer < layers; ++layer) {
    for (int h = 0; h < heads; ++h) {
      ASSIGN_OR_RETURN(kv[h], lease.Rows(layer, h, l));
      RETURN_IF_ERROR(src.StepQuery({request, layer, h}, l, q.data() + h * d));
    }
    RETURN_IF_ERROR(session.RunLayerFixed<int16_t>(layer, q.data(), heads, heads, l, d, 0.0,
                                                   kv.data(), nullptr, sum));
  }
  return absl::OkStatus();
}

}  // namespace

SpattenDevice::Row SpattenDevice::RowOf(const SpattenCounts& c) {
  const double runs = std::max<double>(1, c.heads_run);
  const double l = static_cast<double>(c.context) / std::max<double>(1, c.heads);
  return {static_cast<double>(c.heads_run) / std::max<double>(1, c.heads),
          c.k_tokens / runs / l,
          c.v_rows / runs / l,
          c.lsb_heads / runs,
          c.topk_token_work / static_cast<double>(std::max<int64_t>(1, c.heads)) / l,
          c.topk_value_work / runs / l};
}

absl::Status SpattenDevice::Calibrate() {
  const auto start = std::chrono::steady_clock::now();
  const auto& m = spec_.model();
  const int layers = std::min(8, m.has_layers() ? m.layers() : 24);
  const int heads = std::min(4, m.has_heads() ? m.heads() : 16);
  const int instances = spec_.calibration().has_instances() ? spec_.calibration().instances() : 1;
  // The instances' fixed-point rows are kept across steps and lengths (each
  // length extends the last), as in FULL mode; uncapped, dropped at the end.
  const int bits = spec().msb_bits() + spec().lsb_bits();
  std::unique_ptr<FullKvCache> cache;
  if (FullKvCache::Fits(bits)) {
    cache = std::make_unique<FullKvCache>(source_.get(), layers, heads, bits, /*keep_v=*/true,
                                          std::numeric_limits<int64_t>::max());
  }
  for (int64_t l : CalibrationLengths(spec_.calibration())) {
    SpattenCounts sum;
    for (int i = 0; i < instances; ++i) {
      SpattenSession session(*this, layers, heads);
      const int64_t request = int64_t{1} << 40 | i;
      for (int64_t step : {std::max<int64_t>(1, l - 1), l}) {
        SpattenCounts c;
        if (cache != nullptr) {
          FullKvCache::Lease lease = cache->Acquire(request);
          RETURN_IF_ERROR(CachedStep(*source_, lease, session, request, layers, heads, step, &c));
        } else {
          for (int layer = 0; layer < layers; ++layer) {
            ASSIGN_OR_RETURN(AttentionCall call, LayerCall(*source_, request, layer, heads, step));
            RETURN_IF_ERROR(session.RunLayer(layer, call, &c).status());
          }
        }
        if (step == l) sum += c;
      }
    }
    const Row row = RowOf(sum);
    profile_.lengths.push_back(static_cast<double>(l));
    profile_.rows.push_back(std::vector<double>(row.begin(), row.end()));
  }
  profile_.Tabulate();
  calibration_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

absl::StatusOr<SpattenDevice::Row> SpattenDevice::Fractions(int64_t request_id, int64_t l) const {
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL && request_id >= 0) {
    return FullFractions(request_id, l);
  }
  std::vector<double> scratch;
  const double* r = profile_.Row(l, &scratch);
  Row row{};
  std::copy(r, r + std::min(row.size(), profile_.rows.front().size()), row.begin());
  return row;
}

absl::StatusOr<SpattenDevice::Row> SpattenDevice::FullFractions(int64_t request_id, int64_t l) const {
  if (request_id < 0) {
    return absl::InvalidArgumentError(
        "spatten device: FULL fidelity needs AttentionSeq.request_id >= 0 (got -1)");
  }
  AskingScope asking(asking_);
  std::lock_guard<std::mutex> lock(mu_);
  RequestState& st = requests_[request_id];
  if (auto it = st.memo.find(l); it != st.memo.end()) return it->second;
  const auto& m = spec_.model();
  if (st.session == nullptr || l < st.first_l) {
    st.session = std::make_unique<SpattenSession>(*this, m.layers(), m.heads());
    st.memo.clear();
    st.ahead.clear();
    st.first_l = l;
    st.last_l = l - 1;
  }
  // The steps measured ahead up to l join the memo, in order, as if run now.
  while (!st.ahead.empty() && st.ahead.begin()->first <= l) {
    auto node = st.ahead.extract(st.ahead.begin());
    if (st.memo.emplace(node.key(), node.mapped()).second) fresh_.Add(request_id, node.key());
  }
  if (auto it = st.memo.find(l); it != st.memo.end()) return it->second;
  RETURN_IF_ERROR(RunStepsLocked(request_id, st, l, st.memo, /*ahead=*/false));
  return st.memo.at(l);
}

absl::Status SpattenDevice::RunStepsLocked(int64_t request_id, RequestState& st, int64_t l,
                                           std::map<int64_t, Row>& into, bool ahead) const {
  const auto& m = spec_.model();
  std::optional<FullKvCache::Lease> lease;
  if (cache_ != nullptr) lease.emplace(cache_->Acquire(request_id));
  for (int64_t step = st.last_l + 1; step <= l; ++step) {
    // Ahead, a waiting call goes first, between steps: a step begun ends,
    // since the call most often asks that very step, and a step stopped
    // part-way would be work lost (and its session copied beforehand to
    // go back to).
    if (ahead && asking_.load() > 0) return absl::OkStatus();
    SpattenCounts sum;
    absl::Status ran;
    if (lease.has_value()) {
      // The request's fixed-point rows, grown by one row per step: the same
      // integers RunLayer would quantise from LayerCall.
      ran =
          CachedStep(*source_, *lease, *st.session, request_id, m.layers(), m.heads(), step, &sum);
    } else {
      for (int layer = 0; layer < m.layers() && ran.ok(); ++layer) {
        absl::StatusOr<AttentionCall> call =
            LayerCall(*source_, request_id, layer, m.heads(), step);
        ran = call.ok() ? st.session->RunLayer(layer, *call, &sum).status() : call.status();
      }
    }
    RETURN_IF_ERROR(ran);
    if (into.emplace(step, RowOf(sum)).second && !ahead) fresh_.Add(request_id, step);
    st.last_l = step;
  }
  return absl::OkStatus();
}

absl::Status SpattenDevice::MeasureAhead(absl::Span<const StepKey> steps) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::MeasureAhead(steps);
  for (size_t i = 0; i < steps.size(); ++i) {
    RETURN_IF_ERROR(CheckStepKey("spatten", "steps", i, steps[i]));
  }
  for (const StepKey& k : steps) {
    // A call waiting for the memo goes first; so does a caller that stops.
    if (asking_.load() > 0) return absl::OkStatus();
    RETURN_IF_ERROR(PollInterrupt());
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(k.request_id);
    if (it == requests_.end()) continue;
    RequestState& st = it->second;
    // Only a running session moves ahead, from where it is: its first step
    // is the one a Measure asked.
    if (st.session == nullptr || k.l <= st.last_l) continue;
    RETURN_IF_ERROR(RunStepsLocked(k.request_id, st, k.l, st.ahead, /*ahead=*/true));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepMeasurement>> SpattenDevice::Measure(
    absl::Span<const StepKey> steps) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Measure(steps);
  AskingScope asking(asking_);  // through the whole call, not one step
  return MeasureSteps<6>(
      "spatten", steps, mu_, fresh_,
      [&](const StepKey& k) { return FullFractions(k.request_id, k.l); },
      [&](const StepKey& k, Row* v) {
        auto r = requests_.find(k.request_id);
        if (r == requests_.end()) return false;
        auto it = r->second.memo.find(k.l);
        if (it == r->second.memo.end()) return false;
        *v = it->second;
        return true;
      });
}

absl::Status SpattenDevice::Absorb(absl::Span<const StepMeasurement> measured) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Absorb(measured);
  RETURN_IF_ERROR(CheckMeasurements("spatten", 6, measured));
  AskingScope asking(asking_);
  std::lock_guard<std::mutex> lock(mu_);
  for (const StepMeasurement& m : measured) {
    requests_[m.step.request_id].memo.emplace(m.step.l, StepValues<6>(m));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------- cycle model ---

double SpattenDevice::BytesPerCycle() const {
  return spec().hbm_channels() * spec().channel_bandwidth_bytes_per_s() / spec().clock_hz();
}

SpattenDevice::HeadCost SpattenDevice::HeadCostOf(int64_t l, int64_t d, const Row& row) const {
  const SpattenSpec& t = spec();
  HeadCost h;
  const double L = static_cast<double>(l), dd = static_cast<double>(d);
  const double nk = row[1] * L, nv = row[2] * L, f = row[3];
  const double bits = t.msb_bits() + f * t.lsb_bits();
  h.k_bytes = nk * dd * bits / 8.0;
  h.v_bytes = nv * dd * bits / 8.0;
  const double qk_rate = std::min<double>(std::max(1.0, std::floor(t.qk_multipliers() / dd)),
                                          t.adder_tree_outputs());
  const double pv_rate = std::max(1.0, std::floor(t.pv_multipliers() / dd));
  const double per_row = std::ceil(dd / std::min<double>(dd, t.qk_multipliers()));
  h.cycles = std::max({(h.k_bytes + h.v_bytes) / BytesPerCycle(), nk * (1 + f) * per_row / qk_rate,
                       nk * (1 + f) / t.softmax_lanes(), row[4] * L / t.topk_comparators(),
                       row[5] * L / t.topk_comparators(), nv * per_row / pv_rate});
  h.macs = (nk * (1 + f) + nv) * dd;
  return h;
}

DeviceDescription SpattenDevice::Describe() const {
  const SpattenSpec& t = spec();
  DeviceDescription d;
  d.kind = "spatten";
  d.preset = t.preset();
  d.accepts = {OpKind::kAttention};
  // FULL runs the kernel per (request, L) and reports the mean of what it
  // was asked.
  d.lookahead_ok = spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL;
  d.measures_steps = spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL;
  // A request's first FULL step fills its K/V rows for the whole prompt and
  // starts its session: at GPT-2-medium size it took 32-33 steady steps'
  // per-position time per prompt token at L = 1024 and 4096 (17 at 256), a
  // steady step's time growing with L through the origin (fit over 256, 1024
  // and 4096: intercept -40 positions); bench/prune_full_bench.cc,
  // BM_SpattenFullDecode. Both scale with layers x heads x d_head alike.
  if (d.measures_steps) d.first_step_positions_per_token = 32;
  d.parameters = {
      {"fidelity", static_cast<double>(spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED
                                           ? servesim::v1::PRUNE_FIDELITY_ANALYTIC
                                           : spec_.fidelity())},
      {"qk_multipliers", static_cast<double>(t.qk_multipliers())},
      {"pv_multipliers", static_cast<double>(t.pv_multipliers())},
      {"clock_hz", t.clock_hz()},
      {"dram_bandwidth_bytes_per_s", t.hbm_channels() * t.channel_bandwidth_bytes_per_s()},
      {"topk_comparators", static_cast<double>(t.topk_comparators())},
      {"token_ratio_start", t.token_ratio_start()},
      {"token_ratio_end", t.token_ratio_end()},
      {"head_ratio_start", t.head_ratio_start()},
      {"head_ratio_end", t.head_ratio_end()},
      {"value_ratio", t.value_ratio()},
      {"msb_bits", static_cast<double>(t.msb_bits())},
      {"lsb_bits", static_cast<double>(t.lsb_bits())},
      {"lsb_threshold", t.lsb_threshold()},
      {"power_w", t.logic_power_w() + t.sram_power_w()},
      {"calibration_s", calibration_s_},
  };
  // FULL: the mean over every (request, L) step run so far (std::map:
  // summed in key order); otherwise the profile at L = 1024.
  std::vector<double> row;
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) {
    if (!profile_.rows.empty()) row = profile_.Eval(1024);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    row.assign(6, 0.0);
    for (const auto& [id, st] : requests_) {
      for (const auto& [l, r] : st.memo) {
        for (int i = 0; i < 6; ++i) row[i] += r[i];
        ++n;
      }
    }
    if (n == 0) row.clear();
    for (double& x : row) x /= static_cast<double>(n);
  }
  if (!row.empty()) {
    d.parameters.push_back({"heads_kept_fraction", row[0]});
    d.parameters.push_back({"k_kept_fraction", row[1]});
    d.parameters.push_back({"v_kept_fraction", row[2]});
    d.parameters.push_back({"lsb_fraction", row[3]});
  }
  return d;
}

absl::Status SpattenDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  RETURN_IF_ERROR(CheckAttentionOps("spatten", ops, costs.size()));
  AskingScope asking(asking_);  // before any step measured ahead, for the whole call
  const SpattenSpec& t = spec();
  const double lat = std::ceil(t.dram_latency_s() * t.clock_hz() - 1e-9);
  const double power = t.logic_power_w() + t.sram_power_w();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const double heads = static_cast<double>(OpHeadCount(op));
    double cycles = op.seqs.empty() ? 0.0 : lat, bytes = 0, macs = 0;
    for (const AttentionSeq& s : op.seqs) {
      const int64_t l = s.past_tokens + s.new_tokens;
      if (s.new_tokens == 1) {
        ASSIGN_OR_RETURN(Row row, Fractions(s.request_id, l));
        const HeadCost h = HeadCostOf(l, op.d_head, row);
        const double run = heads * row[0];
        cycles += h.cycles * run;
        bytes += (h.k_bytes + h.v_bytes) * run;
        macs += h.macs * run;
      } else {
        // Prefill: dense, K and V fetched once at full width and reused
        // from the SRAMs by every query (§IV.A).
        const double n = static_cast<double>(s.new_tokens), p = static_cast<double>(s.past_tokens);
        const double pairs = n * p + n * (n + 1) / 2;
        const double b = 2.0 * static_cast<double>(l) * op.d_head * (t.msb_bits() + t.lsb_bits()) / 8.0;
        const double m = pairs * op.d_head;
        cycles += heads * std::max({b / BytesPerCycle(), m / t.qk_multipliers(), m / t.pv_multipliers()});
        bytes += heads * b;
        macs += heads * 2 * m;
      }
    }
    Cost c;
    c.cycles = cycles;
    c.time_s = cycles / t.clock_hz();
    c.dram_bytes = bytes;
    c.flops = 2 * macs;
    c.compute_energy_pj = power * c.time_s * 1e12;
    c.dram_energy_pj = bytes * 8 * t.dram_pj_per_bit();
    costs[i] = c;
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionResult> SpattenDevice::Execute(const AttentionCall& call) const {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  const int layers = spec_.model().has_layers() ? spec_.model().layers() : 24;
  SpattenSession session(*this, layers, static_cast<int>(call.q.shape[0]));
  return session.RunLayer(layers - 1, call, nullptr);
}

SERVESIM_REGISTER_DEVICE(kSpatten, "spatten", &SpattenDevice::Create);

}  // namespace servesim::devices
