// LAD device: the piecewise-linear exp, the per-head LAD state and step
// (Eq. 4-6, Alg. 1), the §IV cycle model and the fidelity modes the header
// describes.
#include "devices/lad/lad_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>
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

using servesim::v1::LadSpec;

absl::Status Bad(absl::string_view field, double v, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("lad device: ", field, " = ", v, "; expected ", expected));
}

// Bytes of cnt per position: I counters of 12 bits (§IV-C's cnt width).
double CounterBytes(int intervals) { return intervals * 1.5; }

}  // namespace

// ------------------------------------------------------------------ PWL ----

LadPwl LadPwl::Fit(int intervals, double pwl_min, double gamma) {
  LadPwl p;
  p.lower.assign(intervals, 0.0);
  p.a.assign(intervals, 0.0);
  p.b.assign(intervals, 0.0);
  p.lower[0] = -std::numeric_limits<double>::infinity();
  for (int k = 1; k < intervals; ++k) {
    p.lower[k] = pwl_min * std::pow(static_cast<double>(intervals - k) / (intervals - 1), gamma);
  }
  for (int k = 1; k < intervals; ++k) {
    const double lo = p.lower[k], hi = k + 1 < intervals ? p.lower[k + 1] : 0.0;
    // Least squares over [lo, hi]: the normal equations of
    // min int (a x + b - e^x)^2 dx, in closed form.
    const double s0 = hi - lo;
    const double s1 = (hi * hi - lo * lo) / 2;
    const double s2 = (hi * hi * hi - lo * lo * lo) / 3;
    const double e0 = std::exp(hi) - std::exp(lo);
    const double e1 = std::exp(hi) * (hi - 1) - std::exp(lo) * (lo - 1);
    const double det = s2 * s0 - s1 * s1;
    p.a[k] = (e1 * s0 - e0 * s1) / det;
    p.b[k] = (s2 * e0 - s1 * e1) / det;
  }
  return p;
}

int LadPwl::Interval(double x) const {
  return static_cast<int>(std::upper_bound(lower.begin() + 1, lower.end(), x) - lower.begin()) - 1;
}

LadCounts& LadCounts::operator+=(const LadCounts& o) {
  head_steps += o.head_steps;
  positions += o.positions;
  centres += o.centres;
  large_mode += o.large_mode;
  active += o.active;
  updates += o.updates;
  hits += o.hits;
  checked += o.checked;
  false_negatives += o.false_negatives;
  false_positives += o.false_positives;
  return *this;
}

// ---------------------------------------------------------- head state ----

LadHeadState::LadHeadState(const LadParams& p, const LadPwl* pwl)
    : p_(p), pwl_(pwl), ni_(pwl->intervals()) {
  A_.assign(p.d * p.d, 0.0);
  B_.assign(p.d, 0.0);
  C_.assign(p.d, 0.0);
  D_.assign(p.d, 0.0);
}

int64_t LadHeadState::bytes() const {
  const auto cap = [](const auto& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(v[0]));
  };
  return cap(k_) + cap(v_) + cap(cnt_) + cap(mode_) + cap(cid_) + cap(norm_) + cap(dnorm_) +
         cap(centres_) + cap(A_) + cap(B_) + cap(C_) + cap(D_) + cap(prev_active_) +
         cap(in_prev_) + static_cast<int64_t>(sizeof(*this));
}

namespace {
// a . b in fp32 with 8 independent partial sums (so the compiler can keep
// them in vector registers), added in double: the scores the kernel
// compares with interval bounds. Every score of a step comes from here, so
// the exact-score identity (Eq. 4) is exercised with one rounding rule.
inline double DotF(const float* a, const float* b, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= d; c += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[c + u] * b[c + u];
  }
  double s = 0;
  for (int u = 0; u < 8; ++u) s += acc[u];
  for (; c < d; ++c) s += static_cast<double>(a[c]) * b[c];
  return s;
}
}  // namespace

double LadHeadState::Dot(const float* qs, int64_t i) const {
  return DotF(qs, k_.data() + i * p_.d, p_.d);
}

// Alg. 1 for the key at position n_, then the row is kept.
void LadHeadState::Append(const float* k, const float* v) {
  const int64_t d = p_.d;
  k_.insert(k_.end(), k, k + d);
  v_.insert(v_.end(), v, v + d);
  cnt_.insert(cnt_.end(), ni_, uint16_t{0});
  mode_.push_back(0);
  in_prev_.push_back(0);
  double nn = 0;
  for (int64_t c = 0; c < d; ++c) nn += static_cast<double>(k[c]) * k[c];
  const float norm = static_cast<float>(std::sqrt(nn));
  double max_cos = 0;
  int32_t max_pos = 0;
  if (norm > 0) {
    for (int32_t pos : centres_) {
      if (norm_[pos] == 0) continue;
      const double dot = DotF(k, k_.data() + static_cast<int64_t>(pos) * d, d);
      const double cs = dot / (static_cast<double>(norm) * norm_[pos]);
      if (std::abs(cs) > std::abs(max_cos)) {
        max_cos = cs;
        max_pos = pos;
      }
    }
  }
  norm_.push_back(norm);
  if (max_cos > p_.centre_cos) {
    cid_.push_back(max_pos);
    dnorm_.push_back(norm / norm_[max_pos]);
  } else if (max_cos < -p_.centre_cos) {
    cid_.push_back(max_pos);
    dnorm_.push_back(-norm / norm_[max_pos]);
  } else {
    cid_.push_back(static_cast<int32_t>(n_));
    dnorm_.push_back(1.0f);
    centres_.push_back(static_cast<int32_t>(n_));
  }
  ++n_;
}

void LadHeadState::AppendPrompt(const float* k, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Append(k + i * p_.d, v + i * p_.d);
}

void LadHeadState::Warmup(const float* q, int64_t context, double scale) {
  const int64_t d = p_.d;
  std::vector<float> qs(d);
  std::vector<double> s(context);
  for (int64_t c = 0; c < d; ++c) qs[c] = static_cast<float>(q[c] * scale);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < context; ++i) m = std::max(m, s[i] = Dot(qs.data(), i));
  for (int64_t i = 0; i < context; ++i) {
    uint16_t& c = cnt_[i * ni_ + pwl_->Interval(s[i] - m)];
    if (c < UINT16_MAX) ++c;
  }
}

double LadHeadState::CacheDrift() const {
  const int64_t d = p_.d;
  std::vector<double> A(d * d, 0.0), B(d, 0.0), C(d, 0.0), D(d, 0.0);
  double E = 0, F = 0;
  for (int64_t i = 0; i < cached_; ++i) {
    const double a = pwl_->a[mode_[i]], b = pwl_->b[mode_[i]];
    const float* k = k_.data() + i * d;
    const float* v = v_.data() + i * d;
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t c = 0; c < d; ++c) A[r * d + c] += a * k[r] * v[c];
    }
    for (int64_t c = 0; c < d; ++c) {
      B[c] += a * v[c];
      C[c] += b * v[c];
      D[c] += a * k[c];
    }
    E += a;
    F += b;
  }
  const auto rel = [](const std::vector<double>& want, const std::vector<double>& got) {
    double diff = 0, mag = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(want[i] - got[i]));
      mag = std::max(mag, std::abs(want[i]));
    }
    return mag > 0 ? diff / mag : diff;
  };
  return std::max({rel(A, A_), rel(B, B_), rel(C, C_), rel(D, D_), rel({E}, {E_}),
                   rel({F}, {F_})});
}

// Eq. 5: position i joins the caches with its mode (argmax of its counters,
// ties to the larger interval).
void LadHeadState::Insert(int64_t i) {
  const int64_t d = p_.d;
  int best = 0;
  for (int k = 1; k < ni_; ++k) {
    if (cnt_[i * ni_ + k] >= cnt_[i * ni_ + best]) best = k;
  }
  mode_[i] = static_cast<uint8_t>(best);
  const double a = pwl_->a[best], b = pwl_->b[best];
  const float* k = k_.data() + i * d;
  const float* v = v_.data() + i * d;
  if (a != 0) {
    for (int64_t r = 0; r < d; ++r) {
      const double ak = a * k[r];
      double* row = A_.data() + r * d;
      for (int64_t c = 0; c < d; ++c) row[c] += ak * v[c];
    }
  }
  for (int64_t c = 0; c < d; ++c) {
    B_[c] += a * v[c];
    C_[c] += b * v[c];
    D_[c] += a * k[c];
  }
  E_ += a;
  F_ += b;
}

LadStepResult LadHeadState::Step(const float* q, const float* k_new, const float* v_new,
                                 double scale) {
  const int64_t d = p_.d;
  Append(k_new, v_new);
  const int64_t n = n_;
  LadStepResult r;
  LadCounts& cn = r.counts;
  cn.head_steps = 1;
  cn.positions = n;
  // Positions leaving the window of the latest `recent` join the caches.
  const int64_t target = std::max<int64_t>(0, n - p_.recent);
  while (cached_ < target) {
    Insert(cached_++);
    ++cn.updates;
  }
  // The scaled query: fp32 for the dot products, and its exact double
  // value for q A and q D (so a score and the caches see the same q).
  std::vector<float> qf(d);
  std::vector<double> qs(d);
  for (int64_t c = 0; c < d; ++c) {
    qf[c] = static_cast<float>(q[c] * scale);
    qs[c] = qf[c];
  }
  // EAS: centre scores, rescaled; exact for large modes.
  std::vector<double> s(n), centre_score(n, 0.0);
  cn.centres = static_cast<int64_t>(centres_.size());
  if (p_.exact_scores) {
    for (int64_t i = 0; i < n; ++i) s[i] = Dot(qf.data(), i);
  } else {
    for (int32_t c : centres_) centre_score[c] = Dot(qf.data(), c);
    for (int64_t i = 0; i < n; ++i) s[i] = centre_score[cid_[i]] * dnorm_[i];
  }
  std::vector<uint8_t> exact(n, p_.exact_scores ? 1 : 0);
  // EAS.3: exact scores for M, the large modes (§III-F) and the latest
  // positions (DECISION: they are computed exactly anyway, §III-E, and the
  // newest positions often hold the maximum m that every interval is
  // relative to; an approximate m shifts every position's interval).
  for (int64_t i = 0; i < n; ++i) {
    if (i >= cached_ || mode_[i] >= p_.large_mode_min) {
      ++cn.large_mode;
      if (!exact[i]) {
        s[i] = Dot(qf.data(), i);
        exact[i] = 1;
      }
    }
  }
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  r.m = m;
  // APID.
  std::vector<int32_t> J;
  for (int64_t i = 0; i < cached_; ++i) {
    if (pwl_->Interval(s[i] - m) != mode_[i]) {
      J.push_back(static_cast<int32_t>(i));
    } else {
      uint16_t& c = cnt_[i * ni_ + mode_[i]];
      if (c < UINT16_MAX) ++c;
    }
  }
  for (int64_t i = cached_; i < n; ++i) J.push_back(static_cast<int32_t>(i));
  cn.active = static_cast<int64_t>(J.size());
  // Measurement: every position's exact interval against the decision.
  if (p_.measure) {
    std::vector<double> se(n);
    double me = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) me = std::max(me, se[i] = Dot(qf.data(), i));
    std::vector<uint8_t> in_j(n, 0);
    for (int32_t j : J) in_j[j] = 1;
    double fn_weight = 0;
    for (int64_t i = 0; i < cached_; ++i) {
      const int id = pwl_->Interval(se[i] - m);
      ++cn.checked;
      if (!in_j[i] && id != mode_[i]) {
        ++cn.false_negatives;
        const double x = se[i] - m;
        fn_weight += std::abs(pwl_->a[id] * x + pwl_->b[id] -
                              (pwl_->a[mode_[i]] * x + pwl_->b[mode_[i]]));
        const float* v = v_.data() + i * d;
        for (int64_t c = 0; c < d; ++c) r.fn_vmax = std::max(r.fn_vmax, std::abs(double{v[c]}));
      }
      if (in_j[i] && id == mode_[i]) ++cn.false_positives;
    }
    r.pwl_out.assign(d, 0.0);
    r.exact_out.assign(d, 0.0);
    double pden = 0, eden = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double pw = pwl_->Eval(se[i] - m), ew = std::exp(se[i] - me);
      pden += pw;
      eden += ew;
      const float* v = v_.data() + i * d;
      for (int64_t c = 0; c < d; ++c) {
        r.pwl_out[c] += pw * v[c];
        r.exact_out[c] += ew * v[c];
      }
    }
    for (int64_t c = 0; c < d; ++c) {
      r.pwl_out[c] /= pden;
      r.exact_out[c] /= eden;
    }
    r.fn_mass = fn_weight / pden;
  }
  // AC.1-2: the mode-based numerator and denominator.
  std::vector<double> num(d, 0.0);
  for (int64_t rr = 0; rr < d; ++rr) {
    const double qr = qs[rr];
    const double* row = A_.data() + rr * d;
    for (int64_t c = 0; c < d; ++c) num[c] += qr * row[c];
  }
  double den = F_ - m * E_;
  for (int64_t c = 0; c < d; ++c) {
    num[c] += C_[c] - m * B_[c];
    den += qs[c] * D_[c];
  }
  // MD + AC.3: corrections for the active positions; counters and modes.
  struct Update {
    int32_t j;
    double alpha, beta;
  };
  std::vector<Update> U;
  for (int32_t j : J) {
    const double sj = exact[j] ? s[j] : Dot(qf.data(), j);
    const int id = pwl_->Interval(sj - m);
    const int mj = j < cached_ ? mode_[j] : 0;
    const double alpha = pwl_->a[id] - pwl_->a[mj], beta = pwl_->b[id] - pwl_->b[mj];
    const double cf = alpha * (sj - m) + beta;
    if (cf != 0) {
      const float* v = v_.data() + static_cast<int64_t>(j) * d;
      for (int64_t c = 0; c < d; ++c) num[c] += cf * v[c];
      den += cf;
    }
    uint16_t& cj = cnt_[static_cast<int64_t>(j) * ni_ + id];
    if (cj < UINT16_MAX) ++cj;
    if (j < cached_ && id != mj && cj > cnt_[static_cast<int64_t>(j) * ni_ + mj]) {
      mode_[j] = static_cast<uint8_t>(id);
      U.push_back({j, alpha, beta});
    }
  }
  r.out.resize(d);
  for (int64_t c = 0; c < d; ++c) r.out[c] = static_cast<float>(num[c] / den);
  // AC.5-8: Eq. 6.
  cn.updates += static_cast<int64_t>(U.size());
  for (const Update& u : U) {
    const float* k = k_.data() + static_cast<int64_t>(u.j) * d;
    const float* v = v_.data() + static_cast<int64_t>(u.j) * d;
    if (u.alpha != 0) {
      for (int64_t rr = 0; rr < d; ++rr) {
        const double ak = u.alpha * k[rr];
        double* row = A_.data() + rr * d;
        for (int64_t c = 0; c < d; ++c) row[c] += ak * v[c];
      }
    }
    for (int64_t c = 0; c < d; ++c) {
      B_[c] += u.alpha * v[c];
      C_[c] += u.beta * v[c];
      D_[c] += u.alpha * k[c];
    }
    E_ += u.alpha;
    F_ += u.beta;
  }
  // §IV-D: the previous step's active set is what was prefetched.
  for (int32_t j : J) cn.hits += in_prev_[j];
  for (int32_t j : prev_active_) in_prev_[j] = 0;
  for (int32_t j : J) in_prev_[j] = 1;
  prev_active_ = std::move(J);
  return r;
}

// -------------------------------------------------------------- device ----

namespace {

// The prompt of a first decode step at context l0 and its warm-up queries.
absl::Status StartHead(const AttentionSource& src, const AttentionInstance& in, int64_t l0,
                       int recent, double scale, LadHeadState* st) {
  const int64_t d = src.d_head();
  const int64_t p = l0 - 1;
  if (p > 0) {
    std::vector<float> k(p * d), v(p * d), q(d);
    RETURN_IF_ERROR(src.KeyValueRows(in, 0, p, k.data(), v.data()));
    st->AppendPrompt(k.data(), v.data(), p);
    for (int64_t t = std::max<int64_t>(0, p - recent); t < p; ++t) {
      RETURN_IF_ERROR(src.StepQuery(in, t + 1, q.data()));
      st->Warmup(q.data(), t + 1, scale);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LadStepResult> StepHead(const AttentionSource& src, const AttentionInstance& in,
                                       int64_t l, double scale, LadHeadState* st) {
  const int64_t d = src.d_head();
  std::vector<float> q(d), k(d), v(d);
  RETURN_IF_ERROR(src.StepQuery(in, l, q.data()));
  RETURN_IF_ERROR(src.KeyValueRows(in, l - 1, l, k.data(), v.data()));
  return st->Step(q.data(), k.data(), v.data(), scale);
}

LadFractions FractionsOf(const LadCounts& c) {
  const double n = c.positions > 0 ? static_cast<double>(c.positions) : 1.0;
  return {c.centres / n, c.large_mode / n, c.active / n, c.updates / n,
          c.active > 0 ? static_cast<double>(c.hits) / c.active : 0.0};
}

}  // namespace

LadParams LadDevice::KernelParams(int64_t d) const {
  LadParams p;
  p.d = d;
  p.recent = spec().recent_exact();
  p.centre_cos = spec().centre_cos();
  p.large_mode_min = spec().large_mode_min_interval();
  return p;
}

absl::StatusOr<std::unique_ptr<Device>> LadDevice::Create(const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_lad()) return absl::InvalidArgumentError("lad device: spec has no lad message");
  const LadSpec& t = spec.lad().lad();
  RETURN_IF_ERROR(RequireResolved(t, "lad", "LadPreset"));
  for (auto [v, name, lo, hi] :
       {std::tuple<int64_t, const char*, int64_t, int64_t>{t.tiles(), "tiles", 1, 4096},
        {t.vpu_width(), "vpu_width", 1, 65536},
        {t.vpus_per_tile(), "vpus_per_tile", 1, 1024},
        {t.eas_parallelism(), "eas_parallelism", 1, 1024},
        {t.apid_parallelism(), "apid_parallelism", 1, 1024},
        {t.md_parallelism(), "md_parallelism", 1, 1024},
        {t.ac_parallelism(), "ac_parallelism", 1, 1024},
        {t.pwl_intervals(), "pwl_intervals", 2, kLadMaxIntervals},
        {t.recent_exact(), "recent_exact", 0, 1 << 20},
        {t.large_mode_min_interval(), "large_mode_min_interval", 1, kLadMaxIntervals}}) {
    if (v < lo || v > hi) return Bad(name, static_cast<double>(v), absl::StrCat("in [", lo, ", ", hi, "]"));
  }
  for (auto [v, name] : {std::pair<double, const char*>{t.clock_hz(), "clock_hz"},
                         {t.hbm_bandwidth_bytes_per_s(), "hbm_bandwidth_bytes_per_s"},
                         {t.sram_bytes_per_tile(), "sram_bytes_per_tile"},
                         {t.pwl_gamma(), "pwl_gamma"},
                         {t.element_bytes(), "element_bytes"}}) {
    if (!(v > 0) || !std::isfinite(v)) return Bad(name, v, "> 0");
  }
  if (!(t.pwl_min() < 0) || !std::isfinite(t.pwl_min())) return Bad("pwl_min", t.pwl_min(), "< 0");
  if (!(t.centre_cos() > 0 && t.centre_cos() <= 1)) return Bad("centre_cos", t.centre_cos(), "in (0, 1]");
  if (!(t.prefetch_sram_fraction() >= 0 && t.prefetch_sram_fraction() <= 1)) {
    return Bad("prefetch_sram_fraction", t.prefetch_sram_fraction(), "in [0, 1]");
  }
  for (auto [v, name] :
       {std::pair<double, const char*>{t.dram_pj_per_bit(), "dram_pj_per_bit"},
        {t.eas_mw(), "eas_mw"}, {t.apid_mw(), "apid_mw"}, {t.md_mw(), "md_mw"},
        {t.ac_mw(), "ac_mw"}, {t.vpus_mw(), "vpus_mw"}, {t.sfm_mw(), "sfm_mw"},
        {t.sram_mw(), "sram_mw"}}) {
    if (!(v >= 0) || !std::isfinite(v)) return Bad(name, v, ">= 0");
  }
  const auto& ds = spec.lad();
  const auto fidelity = ds.fidelity();
  if (fidelity < servesim::v1::PRUNE_FIDELITY_UNSPECIFIED || fidelity > servesim::v1::PRUNE_FIDELITY_FULL) {
    return Bad("fidelity", fidelity, "PRUNE_FIDELITY_ANALYTIC, _CALIBRATED or _FULL");
  }
  RETURN_IF_ERROR(CheckAttentionShape("lad", ds.model()));
  if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL) {
    const auto& m = ds.model();
    if (!m.has_layers() || !m.has_heads() || !m.has_d_head() || m.layers() < 1 ||
        m.heads() < 1 || m.d_head() < 24) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lad device: FULL fidelity needs model.layers >= 1, model.heads >= 1 and "
          "model.d_head >= 24 (got ", m.layers(), ", ", m.heads(), ", ", m.d_head(), ")"));
    }
  }
  if (ds.calibration().has_instances() &&
      (ds.calibration().instances() < 1 || ds.calibration().instances() > 1024)) {
    return Bad("calibration.instances", ds.calibration().instances(), "in [1, 1024]");
  }
  for (int64_t l : ds.calibration().lengths()) {
    if (l < 2 || l > (1 << 16)) return Bad("calibration.lengths", static_cast<double>(l), "in [2, 65536]");
  }
  auto dev = std::unique_ptr<LadDevice>(new LadDevice(ds));
  if (!t.locality()) {
    // The ideal accelerator reads everything; its fractions are unused.
    dev->profile_.lengths = {1.0};
    dev->profile_.rows = {{1, 0, 1, 0, 0}};
    dev->profile_.Tabulate();
  } else if (fidelity == servesim::v1::PRUNE_FIDELITY_ANALYTIC ||
             fidelity == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED) {
    ASSIGN_OR_RETURN(auto row, LadAnalyticFractions(t.preset()));
    ASSIGN_OR_RETURN(const servesim::v1::LadSpec preset, LadPreset(t.preset()));
    RETURN_IF_ERROR(CheckAnalyticKnobs("lad", t, preset,
                                       {"pwl_intervals", "pwl_min", "pwl_gamma", "recent_exact",
                                        "centre_cos", "large_mode_min_interval"}));
    RETURN_IF_ERROR(CheckAnalyticUnused("lad", ds.data(), "data"));
    dev->profile_.lengths = {1.0};
    dev->profile_.rows = {std::vector<double>(row.begin(), row.end())};
    dev->profile_.Tabulate();
  } else {
    const int64_t d = ds.model().has_d_head() ? ds.model().d_head() : 128;
    ASSIGN_OR_RETURN(dev->source_, MakeAttentionSource(ds.data(), d));
    // FULL calibrates too: sequences with no request id are costed from it.
    RETURN_IF_ERROR(dev->Calibrate());
    dev->cap_bytes_ = ds.full_cache_bytes() > 0 ? ds.full_cache_bytes() : int64_t{4} << 30;
  }
  return std::unique_ptr<Device>(std::move(dev));
}

LadDevice::LadDevice(const servesim::v1::LadDeviceSpec& spec)
    : spec_(spec),
      pwl_(LadPwl::Fit(spec.lad().pwl_intervals(), spec.lad().pwl_min(), spec.lad().pwl_gamma())) {}

absl::Status LadDevice::Calibrate() {
  const auto start = std::chrono::steady_clock::now();
  const int instances = CalibrationInstances(spec_.calibration());
  constexpr int kHeads = 1;
  constexpr int64_t kAverageSteps = 8;
  std::vector<int64_t> lengths = CalibrationLengths(spec_.calibration());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  const auto& m = spec_.model();
  const int layers = m.has_layers() && m.layers() > 0 ? m.layers() : 1 << 20;
  const int heads = m.has_heads() && m.heads() > 0 ? m.heads() : 1 << 20;
  const int64_t d = source_->d_head();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Decoding starts at half the shortest length, so every length is
  // measured with at least that much decode history behind it (DECISION: a
  // request decodes from its prompt length, and LAD's modes need history;
  // the profile is indexed by L alone).
  const int64_t l0 = std::max<int64_t>(2, std::min(lengths.front() / 2,
                                                   lengths.front() - kAverageSteps + 1));
  std::vector<LadCounts> sums(lengths.size());
  LadCounts all;
  LadParams params = KernelParams(d);
  for (int i = 0; i < instances; ++i) {
    for (int h = 0; h < kHeads; ++h) {
      // Requests far from the ones a run uses, one layer per instance.
      const AttentionInstance in{int64_t{1} << 40 | i, i % layers, h % heads};
      LadHeadState st(params, &pwl_);
      RETURN_IF_ERROR(StartHead(*source_, in, l0, params.recent, scale, &st));
      size_t next = 0;
      for (int64_t l = l0; l <= lengths.back(); ++l) {
        while (next < lengths.size() && lengths[next] < l) ++next;
        const bool counted = next < lengths.size() && l > lengths[next] - kAverageSteps;
        ASSIGN_OR_RETURN(LadStepResult r, StepHead(*source_, in, l, scale, &st));
        if (counted) {
          sums[next] += r.counts;
          all += r.counts;
        }
      }
    }
  }
  // A separate, measured pass for false negatives at the middle length
  // (the exact scores of every position cost as much as the step again).
  {
    LadParams p = params;
    p.measure = true;
    LadCounts fn;
    const int64_t lmid = lengths[lengths.size() / 2];
    for (int i = 0; i < instances; ++i) {
      const AttentionInstance in{int64_t{1} << 41 | i, i % layers, 0};
      LadHeadState st(p, &pwl_);
      const int64_t start_l = std::max<int64_t>(2, lmid - 64);
      RETURN_IF_ERROR(StartHead(*source_, in, start_l, p.recent, scale, &st));
      for (int64_t l = start_l; l <= lmid; ++l) {
        ASSIGN_OR_RETURN(LadStepResult r, StepHead(*source_, in, l, scale, &st));
        fn += r.counts;
      }
    }
    fn_fraction_ = fn.checked > 0 ? static_cast<double>(fn.false_negatives) / fn.checked : 0.0;
  }
  for (size_t k = 0; k < lengths.size(); ++k) {
    const LadFractions f = FractionsOf(sums[k]);
    profile_.lengths.push_back(static_cast<double>(lengths[k]));
    profile_.rows.push_back(std::vector<double>(f.begin(), f.end()));
  }
  profile_.Tabulate();
  calibration_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

// ------------------------------------------------------------ geometry ----

double LadDevice::BytesPerCycle() const {
  return spec().hbm_bandwidth_bytes_per_s() / spec().clock_hz();
}

double LadDevice::PowerW() const {
  const LadSpec& t = spec();
  return t.tiles() *
         (t.eas_mw() + t.apid_mw() + t.md_mw() + t.ac_mw() + t.vpus_mw() + t.sfm_mw() + t.sram_mw()) *
         1e-3;
}

double LadDevice::PrefetchRowsCap(int64_t d, int64_t seqs) const {
  const LadSpec& t = spec();
  const double per_tile = std::ceil(static_cast<double>(std::max<int64_t>(seqs, 1)) / t.tiles());
  return t.prefetch_sram_fraction() * t.sram_bytes_per_tile() /
         (per_tile * 2.0 * static_cast<double>(d) * t.element_bytes());
}

LadHeadCost LadDevice::HeadCostCounts(int64_t n, int64_t d, double C, double M, double J,
                                      double U, double hits, double cap) const {
  const LadSpec& t = spec();
  LadHeadCost h;
  if (n < 1 || d < 1) return h;
  const double N = static_cast<double>(n), D = static_cast<double>(d);
  const double e = t.element_bytes();
  if (!t.locality()) {
    h.stage4_bytes = 2 * N * D * e;
    h.macs = 2 * N * D;
    h.compute_cycles = h.macs / (static_cast<double>(t.vpus_per_tile()) * t.vpu_width());
    return h;
  }
  const double w = std::ceil(D / t.vpu_width());
  h.eq7_terms[0] = (2 * C * w + N / t.vpu_width() + M * w) / t.eas_parallelism();
  h.eq7_terms[1] = N / t.apid_parallelism();
  h.eq7_terms[2] = J * w / t.md_parallelism();
  h.eq7_terms[3] = (D + J + U * D + 3 * U) * w / t.ac_parallelism();
  h.compute_cycles = *std::max_element(h.eq7_terms, h.eq7_terms + 4);
  const double caches = (D * D + 3 * D + 2) * e;
  const double counters = J * CounterBytes(t.pwl_intervals()) * 2;
  h.stage1_bytes = 8 * N + 2 * N + 8 + (C + M) * D * e + (U > 0 ? caches : 0.0) + counters;
  const double hit = std::min({hits, J, std::max(cap, 0.0)});
  h.stage4_bytes = caches + (J - hit) * 2 * D * e;
  h.prefetch_bytes = hit * 2 * D * e;
  h.macs = D * (2 * C + M) + (D + 4 * J) * D + U * (D * D + 3 * D);
  return h;
}

LadHeadCost LadDevice::HeadCost(int64_t n, int64_t d, const LadFractions& f, double cap) const {
  const double N = static_cast<double>(n);
  // Whatever the fractions say, the latest recent_exact positions are in M
  // and J, and past them one position a step enters the caches (|U| >= 1).
  const double window = std::min(N, static_cast<double>(spec().recent_exact()));
  const double J = std::min(N, std::max(f[2] * N, window));
  const double M = std::min(N, std::max(f[1] * N, window));
  const double U = std::max(f[3] * N, N > window ? 1.0 : 0.0);
  return HeadCostCounts(n, d, std::min(N, f[0] * N), M, J, U, f[4] * J, cap);
}

DeviceDescription LadDevice::Describe() const {
  const LadSpec& t = spec();
  DeviceDescription d;
  d.kind = "lad";
  d.preset = t.preset();
  d.accepts = {OpKind::kAttention};
  // FULL runs the kernel per (request, L) with state across steps and
  // reports the mean of what it was asked.
  d.lookahead_ok = spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL;
  d.measures_steps = spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL;
  d.parameters = {
      {"fidelity", static_cast<double>(spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED
                                           ? servesim::v1::PRUNE_FIDELITY_ANALYTIC
                                           : spec_.fidelity())},
      {"tiles", static_cast<double>(t.tiles())},
      {"clock_hz", t.clock_hz()},
      {"dram_bandwidth_bytes_per_s", t.hbm_bandwidth_bytes_per_s()},
      {"sram_bytes_per_tile", t.sram_bytes_per_tile()},
      {"pwl_intervals", static_cast<double>(t.pwl_intervals())},
      {"locality", t.locality() ? 1.0 : 0.0},
      {"power_w", PowerW()},
      {"dram_pj_per_bit", t.dram_pj_per_bit()},
      {"calibration_s", calibration_s_},
  };
  if (!t.locality()) return d;
  // FULL: the mean over every (request, L) step run so far, in key order so
  // the figure is the same on every host; otherwise the profile at 1024.
  LadFractions f{};
  bool have = false;
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL) {
    std::lock_guard<std::mutex> lock(memo_mu_);
    std::vector<std::pair<std::pair<int64_t, int64_t>, LadFractions>> steps(memo_.begin(),
                                                                           memo_.end());
    std::sort(steps.begin(), steps.end());
    for (const auto& [key, v] : steps) {
      for (int i = 0; i < 5; ++i) f[i] += v[i] / static_cast<double>(steps.size());
      have = true;
    }
  } else if (!profile_.rows.empty()) {
    const auto row = profile_.Eval(1024);
    for (int i = 0; i < 5; ++i) f[i] = row[i];
    have = true;
  }
  if (have) {
    d.parameters.push_back({"centre_fraction", f[0]});
    d.parameters.push_back({"large_mode_fraction", f[1]});
    d.parameters.push_back({"active_fraction", f[2]});
    d.parameters.push_back({"update_fraction", f[3]});
    d.parameters.push_back({"prefetch_hit_ratio", f[4]});
  }
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_ANALYTIC &&
      spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_UNSPECIFIED) {
    d.parameters.push_back({"false_negative_fraction", fn_fraction_});
  }
  // Eq. 5's caches against the KV cache (2 n d) at n = 2048.
  const double dh = spec_.model().has_d_head() ? spec_.model().d_head() : 128;
  d.parameters.push_back({"cache_kv_ratio_2048", (dh * dh + 3 * dh + 2) / (2 * 2048 * dh)});
  return d;
}

// ------------------------------------------------------------ Estimate ----

absl::StatusOr<LadFractions> LadDevice::Fractions(int64_t request_id, int64_t l) const {
  if (spec().locality() && spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL &&
      request_id >= 0) {
    return FullFractions(request_id, l);
  }
  std::vector<double> scratch;
  const double* row = profile_.Row(l, &scratch);
  return LadFractions{row[0], row[1], row[2], row[3], row[4]};
}

int64_t LadDevice::full_state_bytes() const {
  std::lock_guard<std::mutex> lock(memo_mu_);
  return state_bytes_;
}

// Steps the request's heads to context l (rebuilding from the first step
// seen when the state was dropped or l is behind it), memoising each step.
absl::Status LadDevice::Advance(int64_t request_id, RequestState* st, int64_t l) const {
  const auto& m = spec_.model();
  const int64_t d = source_->d_head();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const LadParams params = KernelParams(d);
  if (st->last_l == 0 || l <= st->last_l) {
    st->first_l = st->first_l == 0 ? l : std::min(st->first_l, l);
    st->heads.clear();
    st->heads.reserve(static_cast<size_t>(m.layers()) * m.heads());
    for (int32_t layer = 0; layer < m.layers(); ++layer) {
      for (int32_t head = 0; head < m.heads(); ++head) {
        st->heads.emplace_back(params, &pwl_);
        RETURN_IF_ERROR(StartHead(*source_, {request_id, layer, head}, st->first_l,
                                  params.recent, scale, &st->heads.back()));
      }
    }
    st->last_l = st->first_l - 1;
  }
  for (int64_t step = st->last_l + 1; step <= l; ++step) {
    LadCounts sum;
    for (int32_t layer = 0; layer < m.layers(); ++layer) {
      for (int32_t head = 0; head < m.heads(); ++head) {
        ASSIGN_OR_RETURN(LadStepResult r,
                         StepHead(*source_, {request_id, layer, head}, step, scale,
                                  &st->heads[static_cast<size_t>(layer) * m.heads() + head]));
        sum += r.counts;
      }
    }
    st->last_l = step;
    std::lock_guard<std::mutex> lock(memo_mu_);
    if (memo_.emplace(std::make_pair(request_id, step), FractionsOf(sum)).second) {
      fresh_.Add(request_id, step);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LadFractions> LadDevice::FullFractions(int64_t request_id, int64_t l) const {
  std::shared_ptr<RequestState> st;
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    auto it = memo_.find({request_id, l});
    if (it != memo_.end()) return it->second;
    auto& slot = states_[request_id];
    if (slot == nullptr) slot = std::make_shared<RequestState>();
    st = slot;
  }
  std::unique_lock<std::mutex> req_lock(st->mu);
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    auto it = memo_.find({request_id, l});
    if (it != memo_.end()) return it->second;
  }
  RETURN_IF_ERROR(Advance(request_id, st.get(), l));
  int64_t bytes = 0;
  for (const LadHeadState& h : st->heads) bytes += h.bytes();
  std::lock_guard<std::mutex> lock(memo_mu_);
  state_bytes_ += bytes - st->bytes;
  st->bytes = bytes;
  if (st->listed) lru_.erase(st->lru);
  st->lru = lru_.insert(lru_.end(), request_id);
  st->listed = true;
  // Drop least-recently-used requests' state down to the cap (never the
  // one just used; skipping any another thread is using).
  for (auto it = lru_.begin(); state_bytes_ > cap_bytes_ && it != lru_.end();) {
    const int64_t id = *it;
    auto& other = states_[id];
    if (id == request_id || !other->mu.try_lock()) {
      ++it;
      continue;
    }
    std::vector<LadHeadState>().swap(other->heads);
    other->last_l = 0;
    state_bytes_ -= other->bytes;
    other->bytes = 0;
    other->listed = false;
    it = lru_.erase(it);
    other->mu.unlock();
  }
  return memo_.at({request_id, l});
}

absl::StatusOr<std::vector<StepMeasurement>> LadDevice::Measure(
    absl::Span<const StepKey> steps) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Measure(steps);
  return MeasureMemo<5>("lad", steps, memo_mu_, fresh_, memo_,
                        [&](int64_t r, int64_t l) { return FullFractions(r, l); });
}

absl::Status LadDevice::Absorb(absl::Span<const StepMeasurement> measured) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Absorb(measured);
  return AbsorbMemo<5>("lad", measured, memo_mu_, memo_);
}

absl::Status LadDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  RETURN_IF_ERROR(CheckAttentionOps("lad", ops, costs.size()));
  const LadSpec& t = spec();
  const double bpc = BytesPerCycle();
  const double tile_bpc = bpc / t.tiles();
  const double vpu_macs = static_cast<double>(t.vpus_per_tile()) * t.vpu_width();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const double heads = static_cast<double>(OpHeadCount(op));
    int64_t decode_seqs = 0;
    for (const AttentionSeq& s : op.seqs) decode_seqs += s.new_tokens == 1 ? 1 : 0;
    const double cap = PrefetchRowsCap(op.d_head, decode_seqs);
    double crit_bytes = 0, prefetch_bytes = 0, comp = 0, stage = 0, macs = 0;
    for (const AttentionSeq& s : op.seqs) {
      const int64_t l = s.past_tokens + s.new_tokens;
      LadHeadCost h;
      if (s.new_tokens == 1) {
        ASSIGN_OR_RETURN(LadFractions f, Fractions(s.request_id, l));
        h = HeadCost(l, op.d_head, f, cap);
      } else {
        // Prefill: dense; K and V of the context read once, every causal
        // (query, key) pair on all VPUs of a tile.
        const double n = static_cast<double>(s.new_tokens), p = static_cast<double>(s.past_tokens);
        const double pairs = n * p + n * (n + 1) / 2;
        h.stage4_bytes = 2.0 * static_cast<double>(l) * op.d_head * t.element_bytes();
        h.macs = 2 * pairs * static_cast<double>(op.d_head);
        h.compute_cycles = h.macs / vpu_macs;
      }
      const double b = h.stage1_bytes + h.stage4_bytes;
      crit_bytes += heads * b;
      prefetch_bytes += heads * h.prefetch_bytes;
      comp += heads * h.compute_cycles;
      macs += heads * h.macs;
      stage = std::max({stage, h.compute_cycles, b / tile_bpc});
    }
    Cost c;
    const double mem_cycles = crit_bytes / bpc;
    const double comp_cycles = comp / t.tiles();
    c.cycles = std::max(mem_cycles, comp_cycles) + 5 * stage;
    c.time_s = c.cycles / t.clock_hz();
    c.score_s = mem_cycles / t.clock_hz();
    c.context_s = comp_cycles / t.clock_hz();
    c.dram_bytes = crit_bytes + prefetch_bytes;
    c.flops = 2 * macs;
    c.compute_energy_pj = PowerW() * c.time_s * 1e12;
    c.dram_energy_pj = c.dram_bytes * 8.0 * t.dram_pj_per_bit();
    costs[i] = c;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- Execute ----

absl::StatusOr<AttentionResult> LadDevice::Execute(const AttentionCall& call) const {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  if (call.q.shape[1] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lad kernel runs decode attention (q has ", call.q.shape[1], " tokens; expected 1)"));
  }
  const int64_t heads = call.q.shape[0], kvh = call.k.shape[0], l = call.k.shape[1],
                d = call.q.shape[2];
  const double scale = call.scale > 0 ? call.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> qf, kf, vf;
  const float* q = AsFloats(call.q, &qf);
  const float* k = AsFloats(call.k, &kf);
  const float* v = AsFloats(call.v, &vf);
  AttentionResult res;
  res.out = Tensor::Zeros(ElementType::kFp32, {heads, 1, d});
  const LadParams params = KernelParams(d);
  std::unique_lock<std::mutex> lock(sess_mu_, std::defer_lock);
  SessionState* ss = nullptr;
  bool fresh = true;
  std::vector<LadHeadState> local;
  if (call.session >= 0) {
    lock.lock();
    auto& slot = sessions_[call.session];
    if (slot == nullptr) {
      slot = std::make_unique<SessionState>();
      slot->lru = sess_lru_.insert(sess_lru_.end(), call.session);
    } else {
      sess_lru_.splice(sess_lru_.end(), sess_lru_, slot->lru);
    }
    ss = slot.get();
    fresh = !(ss->l == l - 1 && ss->heads == heads && ss->d == d &&
              ss->state.size() == static_cast<size_t>(heads));
    if (fresh) ss->state.clear();
  }
  std::vector<LadHeadState>& states = ss != nullptr ? ss->state : local;
  for (int64_t h = 0; h < heads; ++h) {
    if (absl::Status st = PollInterrupt(); !st.ok()) {
      // Some heads stepped, others not: the session starts afresh next time.
      states.clear();
      return st;
    }
    const int64_t g = h / (heads / kvh);
    const float* kh = k + g * l * d;
    const float* vh = v + g * l * d;
    const float* qh = q + h * d;
    if (fresh) {
      states.emplace_back(params, &pwl_);
      states.back().AppendPrompt(kh, vh, l - 1);
      // No history: the call's own query seeds the counters (DECISION).
      if (l > 1) states.back().Warmup(qh, l - 1, scale);
    }
    LadStepResult r = states[h].Step(qh, kh + (l - 1) * d, vh + (l - 1) * d, scale);
    for (int64_t c = 0; c < d; ++c) res.out.Set(h * d + c, r.out[c]);
    res.stats.kv_positions += l;
    res.stats.kv_positions_read += r.counts.active + r.counts.centres + r.counts.large_mode;
    res.stats.v_rows_read += r.counts.active;
    res.stats.bytes_read +=
        static_cast<double>((r.counts.active * 2 + r.counts.centres + r.counts.large_mode) * d) *
        spec().element_bytes();
  }
  if (ss != nullptr) {
    ss->l = l;
    ss->heads = heads;
    ss->d = d;
    while (sessions_.size() > kLadMaxSessions) {
      sessions_.erase(sess_lru_.front());
      sess_lru_.pop_front();
    }
  }
  return res;
}

SERVESIM_REGISTER_DEVICE(kLad, "lad", &LadDevice::Create);

}  // namespace servesim::devices
