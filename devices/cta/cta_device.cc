// CTA device: LSH token compression, attention on compressed tokens, the
// token generator, the systolic-array cycle model and the fidelity modes the
// header describes.
#include "devices/cta/cta_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "devices/attention_data.h"
#include "devices/interrupt.h"
#include "devices/presets.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "google/protobuf/descriptor.h"

namespace servesim::devices {
namespace {

using servesim::v1::CtaSpec;

absl::Status Bad(absl::string_view field, double v, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("cta device: ", field, " = ", v, "; expected ", expected));
}

double CeilDiv(double a, double b) { return std::ceil(a / b - 1e-12); }

// A stream seed from several integers (SplitMix64 chaining).
uint64_t Mix(uint64_t seed, std::initializer_list<uint64_t> parts) {
  uint64_t s = seed;
  uint64_t h = SplitMix64(s);
  for (uint64_t p : parts) {
    s = h ^ (p * 0x9e3779b97f4a7c15ULL);
    h = SplitMix64(s);
  }
  return h;
}

// Keys as a hashable string of m int64 values.
struct KeyView {
  const int64_t* p;
  int m;
  bool operator==(const KeyView& o) const { return std::equal(p, p + m, o.p); }
  template <typename H>
  friend H AbslHashValue(H h, const KeyView& k) {
    return H::combine_contiguous(std::move(h), k.p, static_cast<size_t>(k.m));
  }
};

}  // namespace

// ------------------------------------------------------------------ LSH ----

CtaLsh CtaLsh::Make(int64_t dim, int hashes, double width, uint64_t seed,
                    absl::string_view stream) {
  CtaLsh l;
  l.dim = dim;
  l.hashes = hashes;
  l.width = width;
  Rng rng(seed, absl::StrCat("cta.lsh.", stream));
  l.a.resize(static_cast<size_t>(hashes * dim));
  l.b.resize(static_cast<size_t>(hashes));
  for (int i = 0; i < hashes; ++i) {
    double norm = 0;
    for (int64_t c = 0; c < dim; ++c) {
      const double v = rng.Normal();
      l.a[i * dim + c] = v;
      norm += v * v;
    }
    norm = std::sqrt(norm);
    for (int64_t c = 0; c < dim; ++c) l.a[i * dim + c] /= norm;
    l.b[i] = rng.Uniform() * width;
  }
  return l;
}

void CtaLsh::Project(const double* x, double scale, double* p) const {
  for (int i = 0; i < hashes; ++i) {
    const double* a_row = a.data() + i * dim;
    double s = 0;
    for (int64_t c = 0; c < dim; ++c) s += a_row[c] * x[c];
    p[i] = s * scale;
  }
}

int64_t CtaLsh::Key(double p, int i) const {
  const double v = std::floor((p + b[i]) / width);
  constexpr double kLim = 4e18;
  // NaN (finite inputs whose products overflow) hashes to bucket 0, as
  // converting NaN to an integer is undefined.
  return v == v ? static_cast<int64_t>(std::clamp(v, -kLim, kLim)) : 0;
}

std::vector<int32_t> CtaClusterKeys(const std::vector<int64_t>& keys, int64_t n, int m,
                                    int64_t* k) {
  std::vector<int32_t> ct;
  CtaClusterKeysInto(keys.data(), n, m, k, &ct);
  return ct;
}

void CtaClusterKeysInto(const int64_t* keys, int64_t n, int m, int64_t* k,
                        std::vector<int32_t>* ct) {
  ct->resize(static_cast<size_t>(n));
  absl::flat_hash_map<KeyView, int32_t> index;
  index.reserve(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    auto [it, inserted] =
        index.try_emplace(KeyView{keys + j * m, m}, static_cast<int32_t>(index.size()));
    (*ct)[j] = it->second;
  }
  *k = static_cast<int64_t>(index.size());
}

std::vector<int64_t> CtaLevel2Keys(const CtaLsh& lsh2, const std::vector<double>& p2,
                                   const std::vector<int32_t>& ct1, int64_t k1, int64_t n) {
  std::vector<int64_t> keys;
  CtaLevel2KeysInto(lsh2, p2.data(), ct1, k1, n, &keys);
  return keys;
}

void CtaLevel2KeysInto(const CtaLsh& lsh2, const double* p2, const std::vector<int32_t>& ct1,
                       int64_t k1, int64_t n, std::vector<int64_t>* keys) {
  const int m = lsh2.hashes;
  std::vector<double> mean(static_cast<size_t>(k1 * m), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(k1), 0);
  for (int64_t j = 0; j < n; ++j) {
    ++count[ct1[j]];
    for (int i = 0; i < m; ++i) mean[ct1[j] * m + i] += p2[j * m + i];
  }
  for (int64_t c = 0; c < k1; ++c) {
    for (int i = 0; i < m; ++i) mean[c * m + i] /= static_cast<double>(count[c]);
  }
  keys->resize(static_cast<size_t>(n * m));
  for (int64_t j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      (*keys)[j * m + i] = lsh2.Key(p2[j * m + i] - mean[ct1[j] * m + i], i);
    }
  }
}

namespace {

// Centroids of x's rows per cluster (mean, summed in row order).
std::vector<double> Centroids(const double* x, int64_t n, int64_t dim,
                              const std::vector<int32_t>& ct, int64_t k) {
  std::vector<double> c(static_cast<size_t>(k * dim), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(k), 0);
  for (int64_t j = 0; j < n; ++j) {
    ++count[ct[j]];
    double* row = c.data() + ct[j] * dim;
    for (int64_t e = 0; e < dim; ++e) row[e] += x[j * dim + e];
  }
  for (int64_t q = 0; q < k; ++q) {
    for (int64_t e = 0; e < dim; ++e) c[q * dim + e] /= static_cast<double>(count[q]);
  }
  return c;
}

}  // namespace

CtaCompression CtaCompress(const double* x, int64_t n, int64_t dim, double hash_scale,
                           const CtaLsh& lsh1, const CtaLsh* lsh2) {
  CtaCompression c;
  c.n = n;
  c.dim = dim;
  const int m1 = lsh1.hashes;
  std::vector<double> p(static_cast<size_t>(std::max(m1, lsh2 ? lsh2->hashes : 0)));
  std::vector<int64_t> keys(static_cast<size_t>(n * m1));
  for (int64_t j = 0; j < n; ++j) {
    lsh1.Project(x + j * dim, hash_scale, p.data());
    for (int i = 0; i < m1; ++i) keys[j * m1 + i] = lsh1.Key(p[i], i);
  }
  c.ct1 = CtaClusterKeys(keys, n, m1, &c.k1);
  c.c1 = Centroids(x, n, dim, c.ct1, c.k1);
  if (lsh2 == nullptr) return c;
  const int m2 = lsh2->hashes;
  std::vector<double> p2(static_cast<size_t>(n * m2));
  for (int64_t j = 0; j < n; ++j) lsh2->Project(x + j * dim, hash_scale, p2.data() + j * m2);
  const std::vector<int64_t> keys2 = CtaLevel2Keys(*lsh2, p2, c.ct1, c.k1, n);
  c.ct2 = CtaClusterKeys(keys2, n, m2, &c.k2);
  std::vector<double> residual(static_cast<size_t>(n * dim));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t e = 0; e < dim; ++e) {
      residual[j * dim + e] = x[j * dim + e] - c.c1[c.ct1[j] * dim + e];
    }
  }
  c.c2 = Centroids(residual.data(), n, dim, c.ct2, c.k2);
  return c;
}

CtaOpCounts& CtaOpCounts::operator+=(const CtaOpCounts& o) {
  n_q += o.n_q;
  n_kv += o.n_kv;
  k0 += o.k0;
  k1 += o.k1;
  k2 += o.k2;
  hash_macs += o.hash_macs;
  linear_macs += o.linear_macs;
  dense_linear_macs += o.dense_linear_macs;
  score_macs += o.score_macs;
  dense_score_macs += o.dense_score_macs;
  pag_exps += o.pag_exps;
  dense_exps += o.dense_exps;
  output_macs += o.output_macs;
  dense_output_macs += o.dense_output_macs;
  cag_ops += o.cag_ops;
  return *this;
}

void CtaCoreAttention(const double* qbar, int64_t k0, const double* kbar, const double* vbar,
                      int64_t k1, int64_t k2, const std::vector<int32_t>& ctq,
                      const std::vector<int32_t>& ct1, const std::vector<int32_t>& ct2,
                      int64_t d, double scale, bool causal, double* out, CtaOpCounts* counts) {
  const int64_t n_q = static_cast<int64_t>(ctq.size());
  const int64_t n_kv = static_cast<int64_t>(ct1.size());
  const int64_t kk = k1 + k2;
  const bool two = k2 > 0;
  // Step 2: Sbar = Qbar Kbar^T * scale.
  std::vector<double> s(static_cast<size_t>(k0 * kk));
  for (int64_t c = 0; c < k0; ++c) {
    for (int64_t r = 0; r < kk; ++r) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += qbar[c * d + e] * kbar[r * d + e];
      s[c * kk + r] = acc * scale;
    }
  }
  // Query positions and, per cluster, its members in position order.
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(k0));
  for (int64_t i = 0; i < n_q; ++i) members[ctq[i]].push_back(i);
  const int64_t offset = n_kv - n_q;
  std::vector<double> ap(static_cast<size_t>(kk));
  std::vector<double> rows;  // AP snapshots, one per query (causal) or cluster
  double exps = 0, out_rows = 0;
  for (int64_t c = 0; c < k0; ++c) {
    if (members[c].empty()) continue;
    const double* srow = s.data() + c * kk;
    // The PPE's max subtraction: largest level-1 plus largest level-2 score.
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < k1; ++r) m = std::max(m, srow[r]);
    if (two) {
      double m2 = -std::numeric_limits<double>::infinity();
      for (int64_t r = k1; r < kk; ++r) m2 = std::max(m2, srow[r]);
      m += m2;
    }
    std::fill(ap.begin(), ap.end(), 0.0);
    const int64_t last = causal ? offset + members[c].back() : n_kv - 1;
    size_t next = 0;  // next member to snapshot (causal)
    auto emit = [&](int64_t query) {
      // Step 4 for this query: AP Vbar / (sum AP / 2).
      double sum = 0;
      for (int64_t r = 0; r < kk; ++r) sum += ap[r];
      const double norm = two ? sum / 2 : sum;
      double* o = out + query * d;
      for (int64_t e = 0; e < d; ++e) o[e] = 0;
      for (int64_t r = 0; r < kk; ++r) {
        const double w = ap[r] / norm;
        for (int64_t e = 0; e < d; ++e) o[e] += w * vbar[r * d + e];
      }
      out_rows += 1;
    };
    for (int64_t j = 0; j <= last; ++j) {
      const int32_t a = ct1[j];
      if (two) {
        const int64_t b = k1 + ct2[j];
        const double e = std::exp(srow[a] + srow[b] - m);
        ap[a] += e;
        ap[b] += e;
      } else {
        ap[a] += std::exp(srow[a] - m);
      }
      exps += 1;
      if (causal) {
        while (next < members[c].size() && offset + members[c][next] == j) {
          emit(members[c][next]);
          ++next;
        }
      }
    }
    if (!causal) {
      // One output row per cluster, shared by its queries.
      emit(members[c][0]);
      for (size_t t = 1; t < members[c].size(); ++t) {
        std::copy(out + members[c][0] * d, out + members[c][0] * d + d, out + members[c][t] * d);
      }
    }
  }
  if (counts != nullptr) {
    const double pairs = causal ? static_cast<double>(n_q) * static_cast<double>(offset) +
                                      static_cast<double>(n_q) * static_cast<double>(n_q + 1) / 2
                                : static_cast<double>(n_q) * static_cast<double>(n_kv);
    counts->n_q += n_q;
    counts->n_kv += n_kv;
    counts->score_macs += static_cast<double>(k0 * kk * d);
    counts->dense_score_macs += pairs * static_cast<double>(d);
    counts->pag_exps += exps;
    counts->dense_exps += pairs;
    counts->output_macs += out_rows * static_cast<double>(kk * d);
    counts->dense_output_macs += pairs * static_cast<double>(d);
  }
}

CtaHashes MakeCtaHashes(const CtaSpec& t, int64_t dim, uint64_t seed) {
  // compress = false: w -> 0 (every distinct token its own cluster).
  constexpr double kTiny = 1e-12;
  CtaHashes h;
  h.q = CtaLsh::Make(dim, t.query_hashes(), t.compress() ? t.query_width() : kTiny, seed, "q");
  h.kv1 = CtaLsh::Make(dim, t.kv1_hashes(), t.compress() ? t.kv1_width() : kTiny, seed, "kv1");
  h.kv2 = CtaLsh::Make(dim, t.kv2_hashes(), t.compress() ? t.kv2_width() : kTiny, seed, "kv2");
  return h;
}

namespace {

// x (n x D) times w (D x dh): n x dh.
std::vector<double> MatMul(const double* x, int64_t n, int64_t D, const double* w, int64_t dh) {
  std::vector<double> y(static_cast<size_t>(n * dh), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double* yr = y.data() + j * dh;
    for (int64_t c = 0; c < D; ++c) {
      const double xv = x[j * D + c];
      const double* wr = w + c * dh;
      for (int64_t e = 0; e < dh; ++e) yr[e] += xv * wr[e];
    }
  }
  return y;
}

// Exact attention on double Q/K/V (n_q x d, n_kv x d), causal or not.
void ExactDouble(const double* q, int64_t n_q, const double* k, const double* v, int64_t n_kv,
                 int64_t d, double scale, bool causal, double* out) {
  std::vector<double> s(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t last = causal ? n_kv - n_q + i : n_kv - 1;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= last; ++j) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += q[i * d + e] * k[j * d + e];
      s[j] = acc * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (int64_t e = 0; e < d; ++e) out[i * d + e] = 0;
    for (int64_t j = 0; j <= last; ++j) {
      const double p = std::exp(s[j] - m);
      sum += p;
      for (int64_t e = 0; e < d; ++e) out[i * d + e] += p * v[j * d + e];
    }
    for (int64_t e = 0; e < d; ++e) out[i * d + e] /= sum;
  }
}

}  // namespace

CtaLayerResult CtaLayer(const CtaHashes& h, const std::vector<double>& x, int64_t n,
                        int64_t D, const std::vector<double>& wq, const std::vector<double>& wk,
                        const std::vector<double>& wv, int64_t heads, int64_t dh, bool causal) {
  CtaLayerResult r;
  const CtaCompression cq = CtaCompress(x.data(), n, D, 1.0, h.q, nullptr);
  const CtaCompression ckv = CtaCompress(x.data(), n, D, 1.0, h.kv1, &h.kv2);
  const int64_t k0 = cq.k1, k1 = ckv.k1, k2 = ckv.k2, kk = k1 + k2;
  // Level-1 then level-2 centroids, one matrix.
  std::vector<double> ckv_all(ckv.c1);
  ckv_all.insert(ckv_all.end(), ckv.c2.begin(), ckv.c2.end());
  r.out.assign(static_cast<size_t>(heads * n * dh), 0.0);
  r.exact.assign(static_cast<size_t>(heads * n * dh), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  CtaOpCounts& c = r.counts;
  for (int64_t hd = 0; hd < heads; ++hd) {
    const double* wqh = wq.data() + hd * D * dh;
    const double* wkh = wk.data() + hd * D * dh;
    const double* wvh = wv.data() + hd * D * dh;
    const auto qbar = MatMul(cq.c1.data(), k0, D, wqh, dh);
    const auto kbar = MatMul(ckv_all.data(), kk, D, wkh, dh);
    const auto vbar = MatMul(ckv_all.data(), kk, D, wvh, dh);
    CtaCoreAttention(qbar.data(), k0, kbar.data(), vbar.data(), k1, k2, cq.ct1, ckv.ct1, ckv.ct2,
                     dh, scale, causal, r.out.data() + hd * n * dh, &c);
    const auto q = MatMul(x.data(), n, D, wqh, dh);
    const auto k = MatMul(x.data(), n, D, wkh, dh);
    const auto v = MatMul(x.data(), n, D, wvh, dh);
    ExactDouble(q.data(), n, k.data(), v.data(), n, dh, scale, causal,
                r.exact.data() + hd * n * dh);
    c.linear_macs += static_cast<double>((k0 + 2 * kk) * D * dh);
    c.dense_linear_macs += static_cast<double>(3 * n * D * dh);
  }
  c.k0 = k0;
  c.k1 = k1;
  c.k2 = k2;
  c.n_q = n;
  c.n_kv = n;
  c.hash_macs = static_cast<double>(n * D * (h.q.hashes + h.kv1.hashes + h.kv2.hashes));
  c.cag_ops = static_cast<double>(4 * n * D);
  double num = 0, den = 0;
  for (size_t i = 0; i < r.out.size(); ++i) {
    num += (r.out[i] - r.exact[i]) * (r.out[i] - r.exact[i]);
    den += r.exact[i] * r.exact[i];
  }
  r.relative_error = den > 0 ? std::sqrt(num / den) : 0;
  return r;
}

// ------------------------------------------------------- token generator --

CtaTokenGenerator::CtaTokenGenerator(uint64_t seed, int64_t d_model,
                                     const servesim::v1::CtaTokenDataSpec& spec)
    : seed_(seed), d_model_(d_model) {
  const int64_t types = spec.has_vocab_types() ? spec.vocab_types() : 50257;
  const double s = spec.has_zipf_exponent() ? spec.zipf_exponent() : 1.1;
  noise_ = spec.has_context_noise() ? spec.context_noise() : 0.05;
  score_std_ = spec.has_score_std() ? spec.score_std() : 2.0;
  const int64_t per_class = spec.has_types_per_class() ? spec.types_per_class() : 16;
  classes_ = std::max<int64_t>(1, types / std::max<int64_t>(1, per_class));
  class_weight_ = spec.has_class_weight() ? spec.class_weight() : 0.95;
  cdf_.resize(static_cast<size_t>(types));
  double acc = 0;
  for (int64_t r = 0; r < types; ++r) {
    acc += std::pow(static_cast<double>(r + 1), -s);
    cdf_[r] = acc;
  }
  for (double& v : cdf_) v /= acc;
}

int64_t CtaTokenGenerator::Type(int64_t request, int64_t position) const {
  Rng rng(Mix(seed_, {1, static_cast<uint64_t>(request), static_cast<uint64_t>(position)}),
          "cta.type");
  const double u = rng.Uniform();
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  return std::min<int64_t>(static_cast<int64_t>(it - cdf_.begin()),
                           static_cast<int64_t>(cdf_.size()) - 1);
}

void CtaTokenGenerator::Token(int64_t request, int64_t layer, int64_t position, double* out) const {
  const int64_t type = Type(request, position);
  Rng e(Mix(seed_, {2, static_cast<uint64_t>(layer), static_cast<uint64_t>(type)}), "cta.embed");
  Rng u(Mix(seed_, {5, static_cast<uint64_t>(layer), static_cast<uint64_t>(type % classes_)}),
        "cta.class");
  const double own = std::sqrt(std::max(0.0, 1 - class_weight_ * class_weight_));
  Rng g(Mix(seed_, {3, static_cast<uint64_t>(request), static_cast<uint64_t>(layer),
                    static_cast<uint64_t>(position)}),
        "cta.context");
  double mean = 0;
  for (int64_t c = 0; c < d_model_; ++c) {
    out[c] = class_weight_ * FastNormal(u) + own * FastNormal(e) + noise_ * FastNormal(g);
    mean += out[c];
  }
  mean /= static_cast<double>(d_model_);
  double var = 0;
  for (int64_t c = 0; c < d_model_; ++c) {
    out[c] -= mean;
    var += out[c] * out[c];
  }
  const double inv = 1.0 / std::sqrt(std::max(var / static_cast<double>(d_model_), 1e-30));
  for (int64_t c = 0; c < d_model_; ++c) out[c] *= inv;
}

void CtaTokenGenerator::HeadWeights(int64_t layer, int64_t head, int64_t d_head,
                                    std::vector<double>* wq, std::vector<double>* wk,
                                    std::vector<double>* wv) const {
  // q_e = sum_c x_c W_ce with unit-RMS x and W_ce ~ N(0, g^2 / d_model):
  // Var(q_e) = g^2. For independent q, k (random token pairs) q.k has
  // variance d_head g^4, so q.k / sqrt(d_head) has standard deviation g^2:
  // g = sqrt(score_std).
  const double g = std::sqrt(score_std_);
  const double sigma = g / std::sqrt(static_cast<double>(d_model_));
  int which = 0;
  for (std::vector<double>* w : {wq, wk, wv}) {
    Rng rng(Mix(seed_, {4, static_cast<uint64_t>(layer), static_cast<uint64_t>(head),
                        static_cast<uint64_t>(which++)}),
            "cta.weights");
    w->resize(static_cast<size_t>(d_model_ * d_head));
    for (double& v : *w) v = rng.Normal() * sigma;
  }
}

// -------------------------------------------------------------- Create ----

absl::StatusOr<std::unique_ptr<Device>> CtaDevice::Create(const servesim::v1::DeviceSpec& spec) {
  if (!spec.has_cta()) return absl::InvalidArgumentError("cta device: DeviceSpec.cta is not set");
  const CtaSpec& t = spec.cta().cta();
  RETURN_IF_ERROR(RequireResolved(t, "cta", "CtaPreset"));
  for (auto [v, name, lo, hi] :
       {std::tuple<int64_t, const char*, int64_t, int64_t>{t.sa_rows(), "sa_rows", 1, 4096},
        {t.sa_cols(), "sa_cols", 1, 4096},
        {t.operand_bits(), "operand_bits", 2, 32},
        {t.cim_tokens_per_cycle(), "cim_tokens_per_cycle", 1, 4096},
        {t.cag_lanes(), "cag_lanes", 1, 65536},
        {t.pag_lanes(), "pag_lanes", 1, 65536},
        {t.hbm_channels(), "hbm_channels", 1, 1024},
        {t.query_hashes(), "query_hashes", 1, 256},
        {t.kv1_hashes(), "kv1_hashes", 1, 256},
        {t.kv2_hashes(), "kv2_hashes", 1, 256}}) {
    if (v < lo || v > hi) {
      return Bad(name, static_cast<double>(v), absl::StrCat("in [", lo, ", ", hi, "]"));
    }
  }
  for (auto [v, name] : {std::pair<double, const char*>{t.clock_hz(), "clock_hz"},
                         {t.channel_bandwidth_bytes_per_s(), "channel_bandwidth_bytes_per_s"},
                         {t.query_width(), "query_width"},
                         {t.kv1_width(), "kv1_width"},
                         {t.kv2_width(), "kv2_width"}}) {
    if (!(v > 0) || !std::isfinite(v)) return Bad(name, v, "> 0");
  }
  for (auto [v, name] : {std::pair<double, const char*>{t.dram_latency_s(), "dram_latency_s"},
                         {t.mac_pj(), "mac_pj"},
                         {t.exp_pj(), "exp_pj"},
                         {t.aux_op_pj(), "aux_op_pj"},
                         {t.static_power_w(), "static_power_w"},
                         {t.dram_pj_per_bit(), "dram_pj_per_bit"}}) {
    if (!(v >= 0) || !std::isfinite(v)) return Bad(name, v, ">= 0");
  }
  const auto& ds = spec.cta();
  const auto fidelity = ds.fidelity();
  if (fidelity < servesim::v1::PRUNE_FIDELITY_UNSPECIFIED ||
      fidelity > servesim::v1::PRUNE_FIDELITY_FULL) {
    return Bad("fidelity", fidelity, "PRUNE_FIDELITY_ANALYTIC, _CALIBRATED or _FULL");
  }
  RETURN_IF_ERROR(CheckAttentionShape("cta", ds.model()));
  const auto& m = ds.model();
  if (fidelity == servesim::v1::PRUNE_FIDELITY_FULL && (!m.has_layers() || m.layers() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cta device: FULL fidelity needs model.layers >= 1 (got ", m.layers(), ")"));
  }
  if (ds.has_full_cache_bytes() && ds.full_cache_bytes() < 0) {
    return Bad("full_cache_bytes", static_cast<double>(ds.full_cache_bytes()), ">= 0");
  }
  if (ds.has_d_model() && (ds.d_model() < 1 || ds.d_model() > 65536)) {
    return Bad("d_model", ds.d_model(), "in [1, 65536]");
  }
  const auto& tk = ds.tokens();
  if (tk.has_vocab_types() && (tk.vocab_types() < 1 || tk.vocab_types() > (1 << 24))) {
    return Bad("tokens.vocab_types", tk.vocab_types(), "in [1, 16777216]");
  }
  if (tk.has_zipf_exponent() && !(tk.zipf_exponent() >= 0 && tk.zipf_exponent() <= 10)) {
    return Bad("tokens.zipf_exponent", tk.zipf_exponent(), "in [0, 10]");
  }
  if (tk.has_context_noise() && !(tk.context_noise() >= 0 && tk.context_noise() <= 100)) {
    return Bad("tokens.context_noise", tk.context_noise(), "in [0, 100]");
  }
  if (tk.has_score_std() && !(tk.score_std() > 0 && tk.score_std() <= 100)) {
    return Bad("tokens.score_std", tk.score_std(), "in (0, 100]");
  }
  if (tk.has_types_per_class() && tk.types_per_class() < 1) {
    return Bad("tokens.types_per_class", tk.types_per_class(), ">= 1");
  }
  if (tk.has_class_weight() && !(tk.class_weight() >= 0 && tk.class_weight() <= 1)) {
    return Bad("tokens.class_weight", tk.class_weight(), "in [0, 1]");
  }
  if (ds.calibration().has_instances() &&
      (ds.calibration().instances() < 1 || ds.calibration().instances() > 1024)) {
    return Bad("calibration.instances", ds.calibration().instances(), "in [1, 1024]");
  }
  for (int64_t l : ds.calibration().lengths()) {
    if (l < 1 || l > (1 << 16)) {
      return Bad("calibration.lengths", static_cast<double>(l), "in [1, 65536]");
    }
  }
  auto dev = std::unique_ptr<CtaDevice>(new CtaDevice(ds));
  if (fidelity == servesim::v1::PRUNE_FIDELITY_ANALYTIC ||
      fidelity == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED) {
    ASSIGN_OR_RETURN(auto row, CtaAnalyticFractions(t.preset()));
    ASSIGN_OR_RETURN(const servesim::v1::CtaSpec preset, CtaPreset(t.preset()));
    RETURN_IF_ERROR(CheckAnalyticKnobs("cta", t, preset,
                                       {"compress", "query_hashes", "query_width", "kv1_hashes",
                                        "kv1_width", "kv2_hashes", "kv2_width"}));
    RETURN_IF_ERROR(CheckAnalyticUnused("cta", ds.tokens(), "tokens"));
    dev->profile_.lengths = {1.0};
    dev->profile_.rows = {{row[0], row[1], 0.0}};
    dev->profile_.Tabulate();
    dev->profile_ready_ = true;
  } else {
    if (fidelity != servesim::v1::PRUNE_FIDELITY_FULL) {
      RETURN_IF_ERROR(dev->Calibrate());
      dev->profile_ready_ = true;
    }
    dev->level_split_known_ = true;
  }
  return std::unique_ptr<Device>(std::move(dev));
}

CtaDevice::CtaDevice(const servesim::v1::CtaDeviceSpec& spec) : spec_(spec) {
  const auto& m = spec_.model();
  const int64_t heads = m.has_heads() && m.heads() > 0 ? m.heads() : 16;
  const int64_t dh = m.has_d_head() && m.d_head() > 0 ? m.d_head() : 64;
  d_model_ = spec_.has_d_model() ? spec_.d_model() : heads * dh;
  const uint64_t seed = spec_.data().has_seed() ? spec_.data().seed() : 1;
  tokens_ = std::make_unique<CtaTokenGenerator>(seed, d_model_, spec_.tokens());
  hashes_ = MakeCtaHashes(spec_.cta(), d_model_, seed);
}

void CtaDevice::EnsureProfile() const {
  if (profile_ready_.load(std::memory_order_acquire)) return;
  std::call_once(profile_once_, [this] {
    (void)Calibrate();  // cannot fail: the spec was checked at creation
    profile_ready_.store(true, std::memory_order_release);
  });
}

absl::Status CtaDevice::Calibrate() const {
  const auto start = std::chrono::steady_clock::now();
  const int instances = CalibrationInstances(spec_.calibration());
  const auto& m = spec_.model();
  const int layers = m.has_layers() && m.layers() > 0 ? m.layers() : 24;
  std::vector<double> x;
  for (int64_t l : CalibrationLengths(spec_.calibration())) {
    double k0 = 0, k1 = 0, k2 = 0;
    x.resize(static_cast<size_t>(l * d_model_));
    for (int i = 0; i < instances; ++i) {
      // Requests far from the ones a run uses, one layer per instance.
      const int64_t request = int64_t{1} << 40 | i;
      for (int64_t j = 0; j < l; ++j) tokens_->Token(request, i % layers, j, x.data() + j * d_model_);
      const CtaCompression q = CtaCompress(x.data(), l, d_model_, 1.0, hashes_.q, nullptr);
      const CtaCompression kv = CtaCompress(x.data(), l, d_model_, 1.0, hashes_.kv1, &hashes_.kv2);
      k0 += static_cast<double>(q.k1);
      k1 += static_cast<double>(kv.k1);
      k2 += static_cast<double>(kv.k2);
    }
    const double n = static_cast<double>(l) * instances;
    profile_.lengths.push_back(static_cast<double>(l));
    profile_.rows.push_back({k0 / n, (k1 + k2) / n, k2 / n});
  }
  profile_.Tabulate();
  calibration_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

// ------------------------------------------------------------ fidelity ----

absl::StatusOr<CtaFractions> CtaDevice::Fractions(int64_t request_id, int64_t n) const {
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL && request_id >= 0) {
    return FullFractions(request_id, n);
  }
  EnsureProfile();
  std::vector<double> scratch;
  const double* row = profile_.Row(n, &scratch);
  return CtaFractions{row[0], row[1], row[2]};
}

absl::StatusOr<CtaFractions> CtaDevice::FullFractions(int64_t request_id, int64_t n) const {
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    auto it = memo_.find({request_id, n});
    if (it != memo_.end()) return it->second;
  }
  const int layers = spec_.model().layers();
  ASSIGN_OR_RETURN(const auto counts, FullCounts(request_id, n, 0, layers));
  const CtaFractions f = FractionsOfCounts(n, layers, counts);
  std::lock_guard<std::mutex> lock(memo_mu_);
  if (memo_.emplace(std::make_pair(request_id, n), f).second) fresh_.Add(request_id, n);
  return f;
}

CtaFractions CtaDevice::FractionsOfCounts(int64_t n, int layers, const std::array<double, 2>& k) {
  // {level-1 clusters, level-2 clusters}, summed over layers.
  const double tot = static_cast<double>(n) * layers;
  // Decode has one query: k0 = 1 (reported as 1 / n).
  return CtaFractions{1.0 / static_cast<double>(n), (k[0] + k[1]) / tot, k[1] / tot};
}

absl::StatusOr<std::array<double, 2>> CtaDevice::FullCounts(int64_t request_id, int64_t n,
                                                            int32_t layer_begin,
                                                            int32_t layer_end) const {
  std::shared_ptr<FullRequest> req;
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    auto& slot = requests_[request_id];
    if (slot == nullptr) slot = std::make_shared<FullRequest>();
    req = slot;
  }
  const int layers = spec_.model().layers();
  const int m1 = hashes_.kv1.hashes, m2 = hashes_.kv2.hashes;
  double k1_sum = 0, k2_sum = 0;
  {
    std::lock_guard<std::mutex> lock(req->mu);
    if (req->layers.empty()) {
      req->layers.resize(static_cast<size_t>(layers));
      std::lock_guard<std::mutex> lock(memo_mu_);
      ++full_builds_;
    }
    {
      // Grow each layer's projections to n tokens (positions never change).
      std::vector<double> x(static_cast<size_t>(d_model_));
      std::vector<double> p(static_cast<size_t>(std::max(m1, m2)));
      for (int l = layer_begin; l < layer_end; ++l) {
        FullLayer& fl = req->layers[l];
        if (fl.tokens >= n) continue;
        // Grow by at least 1/8 (not the default doubling): one token a step.
        auto grow = [n](auto& v, int m) {
          const size_t want = static_cast<size_t>(n * m);
          if (v.capacity() < want) v.reserve(std::max(want, v.capacity() + v.capacity() / 8));
          v.resize(want);
        };
        grow(fl.keys1, m1);
        grow(fl.p2, m2);
        for (int64_t j = fl.tokens; j < n; ++j) {
          tokens_->Token(request_id, l, j, x.data());
          hashes_.kv1.Project(x.data(), 1.0, p.data());
          for (int i = 0; i < m1; ++i) fl.keys1[j * m1 + i] = hashes_.kv1.Key(p[i], i);
          hashes_.kv2.Project(x.data(), 1.0, fl.p2.data() + j * m2);
        }
        fl.tokens = n;
      }
    }
    // Scratch kept between steps: a step's lists are L long, and fresh ones
    // of over 128 KiB would each be a new mapping to fault in.
    thread_local std::vector<int32_t> ct1, ct2;
    thread_local std::vector<int64_t> keys2;
    for (int l = layer_begin; l < layer_end; ++l) {
      const FullLayer& fl = req->layers[l];
      // The first n tokens' keys and projections (a layer may hold more).
      int64_t k1 = 0, k2 = 0;
      CtaClusterKeysInto(fl.keys1.data(), n, m1, &k1, &ct1);
      CtaLevel2KeysInto(hashes_.kv2, fl.p2.data(), ct1, k1, n, &keys2);
      CtaClusterKeysInto(keys2.data(), n, m2, &k2, &ct2);
      k1_sum += static_cast<double>(k1);
      k2_sum += static_cast<double>(k2);
    }
  }
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(req->mu);
    for (const FullLayer& fl : req->layers) {
      bytes += static_cast<int64_t>(fl.keys1.capacity() * sizeof(int64_t) +
                                    fl.p2.capacity() * sizeof(double));
    }
  }
  std::lock_guard<std::mutex> lock(memo_mu_);
  auto it = requests_.find(request_id);
  if (it != requests_.end() && it->second == req) {
    full_bytes_ += bytes - req->bytes;
    req->bytes = bytes;
    req->last_use = ++use_clock_;
    // Least recently used first, never the request just used.
    const int64_t cap = FullCacheCap(spec_.full_cache_bytes());
    while (full_bytes_ > cap && requests_.size() > 1) {
      auto victim = requests_.end();
      for (auto r = requests_.begin(); r != requests_.end(); ++r) {
        if (r->second != req &&
            (victim == requests_.end() || r->second->last_use < victim->second->last_use)) {
          victim = r;
        }
      }
      if (victim == requests_.end()) break;
      full_bytes_ -= victim->second->bytes;
      requests_.erase(victim);
    }
  }
  return std::array<double, 2>{k1_sum, k2_sum};
}

int64_t CtaDevice::full_bytes() const {
  std::lock_guard<std::mutex> lock(memo_mu_);
  return full_bytes_;
}

int64_t CtaDevice::full_builds() const {
  std::lock_guard<std::mutex> lock(memo_mu_);
  return full_builds_;
}

// ------------------------------------------------------------ geometry ----

double CtaDevice::BytesPerCycle() const {
  return spec().hbm_channels() * spec().channel_bandwidth_bytes_per_s() / spec().clock_hz();
}

double CtaDevice::GemmCycles(double rows, double cols, double depth) const {
  if (rows <= 0 || cols <= 0 || depth <= 0) return 0;
  const double r = spec().sa_rows(), c = spec().sa_cols();
  return CeilDiv(rows, r) * CeilDiv(cols, c) * depth + r + c;
}

CtaCycles CtaDevice::SeqCycles(int64_t new_tokens, int64_t past_tokens, int64_t heads,
                               int64_t d_head, double k0, double kkv) const {
  const CtaSpec& t = spec();
  CtaCycles c;
  const double n = static_cast<double>(new_tokens);
  const double l = static_cast<double>(new_tokens + past_tokens);
  const double H = static_cast<double>(heads), d = static_cast<double>(d_head);
  const double D = static_cast<double>(d_model_);
  const double mq = t.query_hashes(), m1 = t.kv1_hashes(), m2 = t.kv2_hashes();
  const double eb = t.operand_bits() / 8.0;
  const double idx_bytes = l > 65536 ? 4 : 2;
  if (new_tokens == 1) {
    // Decode: hash and merge the new token, then attend to the compressed KV.
    c.hash = GemmCycles(1, m1, D) + GemmCycles(1, m2, D);
    c.cim = 2.0 / t.cim_tokens_per_cycle();
    c.aux_ops = 2 * 2 * H * d + m2;  // level-1/2 Kbar and Vbar rows, level-2 projection mean
    c.cag = CeilDiv(c.aux_ops, t.cag_lanes());
    c.score = H * GemmCycles(kkv, 1, d);
    c.pag = H * CeilDiv(l, t.pag_lanes());
    c.output = H * GemmCycles(d, 1, kkv);
    c.macs = D * (m1 + m2) + H * 2 * kkv * d;
    c.exps = H * l;
    // Kbar/Vbar read, the two updated rows written back, the CT tables.
    c.bytes = H * (2 * kkv * d + 2 * 2 * d) * eb + 2 * l * idx_bytes;
  } else {
    // Prefill of n tokens (causal, queries' output rows n) after past ones.
    c.hash = GemmCycles(n, mq + m1, D) + GemmCycles(n, m2, D);
    c.cim = CeilDiv(3 * n, t.cim_tokens_per_cycle());
    c.aux_ops = 4 * n * D;
    c.cag = CeilDiv(c.aux_ops, t.cag_lanes());
    c.linear = GemmCycles(H * d, k0, D) + GemmCycles(2 * H * d, kkv, D);
    c.score = H * GemmCycles(kkv, k0, d);
    c.pag = H * CeilDiv(k0 * l, t.pag_lanes());
    c.output = H * GemmCycles(d, n, kkv);
    c.macs = n * D * (mq + m1 + m2) + (k0 + 2 * kkv) * D * H * d + H * k0 * kkv * d +
             H * n * kkv * d;
    c.exps = H * k0 * l;
    // X in, W^Q/K/V in, Kbar/Vbar out, the new queries' output, CT tables.
    c.bytes = (n * D + 3 * D * H * d + 2 * kkv * H * d + n * H * d) * eb + 3 * n * idx_bytes;
  }
  c.memory = c.bytes / BytesPerCycle();
  c.latency = std::ceil(t.dram_latency_s() * t.clock_hz() - 1e-9);
  c.total = std::max(c.compute(), c.memory) + c.latency;
  return c;
}

DeviceDescription CtaDevice::Describe() const {
  const CtaSpec& t = spec();
  DeviceDescription d;
  d.kind = "cta";
  d.preset = t.preset();
  d.static_power_w = t.static_power_w();  // charged per op while busy (Estimate)
  d.static_in_op_energy = true;
  d.accepts = {OpKind::kAttention};
  // FULL runs the kernel per (request, L) and reports the mean of what it
  // was asked.
  d.lookahead_ok = spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL;
  d.measures_steps = spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL;
  d.splits_layers = d.measures_steps;  // layers are clustered apart: counts add over layers
  d.parameters = {
      {"fidelity", static_cast<double>(spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_UNSPECIFIED
                                           ? servesim::v1::PRUNE_FIDELITY_ANALYTIC
                                           : spec_.fidelity())},
      {"sa_rows", static_cast<double>(t.sa_rows())},
      {"sa_cols", static_cast<double>(t.sa_cols())},
      {"clock_hz", t.clock_hz()},
      {"dram_bandwidth_bytes_per_s", t.hbm_channels() * t.channel_bandwidth_bytes_per_s()},
      {"dram_latency_s", t.dram_latency_s()},
      {"compress", t.compress() ? 1.0 : 0.0},
      {"query_hashes", static_cast<double>(t.query_hashes())},
      {"query_width", t.query_width()},
      {"kv1_hashes", static_cast<double>(t.kv1_hashes())},
      {"kv1_width", t.kv1_width()},
      {"kv2_hashes", static_cast<double>(t.kv2_hashes())},
      {"kv2_width", t.kv2_width()},
      {"d_model", static_cast<double>(d_model_)},
      {"calibration_s", profile_ready_.load(std::memory_order_acquire) ? calibration_s_ : 0.0},
  };
  // Cluster fractions at n = 1024 (ANALYTIC, CALIBRATED) or the mean over
  // the decode steps run so far (FULL, summed in key order).
  CtaFractions f{0, 0, 0};
  bool have = false, full = false;
  if (spec_.fidelity() == servesim::v1::PRUNE_FIDELITY_FULL) {
    std::lock_guard<std::mutex> lock(memo_mu_);
    for (const auto& [key, v] : memo_) {
      for (int i = 1; i < 3; ++i) f[i] += v[i] / static_cast<double>(memo_.size());
      have = full = true;
    }
  }
  // FULL before any step: the profile's, if a prefill chunk needed it.
  if (!have && profile_ready_.load(std::memory_order_acquire) && !profile_.rows.empty()) {
    const auto row = profile_.Eval(1024);
    f = {row[0], row[1], row[2]};
    have = true;
  }
  if (have) {
    if (!full) d.parameters.push_back({"query_fraction", f[0]});
    d.parameters.push_back({"kv_fraction", f[1]});
    if (level_split_known_) {
      d.parameters.push_back({"kv1_fraction", f[1] - f[2]});
      d.parameters.push_back({"kv2_fraction", f[2]});
    }
    d.parameters.push_back({"kv_compression_ratio", f[1] > 0 ? 1.0 / f[1] : 0.0});
    if (!full) {
      d.parameters.push_back({"rl", (f[0] + 2 * f[1]) / 3});
      d.parameters.push_back({"ra", f[0] * f[1]});
    }
  }
  return d;
}

absl::StatusOr<std::vector<StepMeasurement>> CtaDevice::Measure(
    absl::Span<const StepKey> steps) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Measure(steps);
  return MeasureMemo<3>("cta", steps, memo_mu_, fresh_, memo_,
                        [&](int64_t r, int64_t l) { return FullFractions(r, l); });
}

absl::StatusOr<std::vector<StepMeasurement>> CtaDevice::MeasureLayers(
    absl::Span<const StepKey> steps, int part, int parts) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) {
    return Device::MeasureLayers(steps, part, parts);
  }
  return MeasureShares<2>("cta", steps, part, parts, spec_.model().layers(),
                          [&](const StepKey& k, int32_t begin, int32_t end) {
                            return FullCounts(k.request_id, k.l, begin, end);
                          });
}

absl::Status CtaDevice::Absorb(absl::Span<const StepMeasurement> measured) const {
  if (spec_.fidelity() != servesim::v1::PRUNE_FIDELITY_FULL) return Device::Absorb(measured);
  const int layers = spec_.model().layers();
  return AbsorbMemoWithShares<3, 2>("cta", measured, memo_mu_, memo_,
                                    [&](const StepKey& k, const std::array<double, 2>& c) {
                                      return FractionsOfCounts(k.l, layers, c);
                                    });
}

// ------------------------------------------------------------ Estimate ----

absl::Status CtaDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  RETURN_IF_ERROR(CheckAttentionOps("cta", ops, costs.size()));
  const CtaSpec& t = spec();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const int64_t heads = OpHeadCount(op);
    Cost total;
    for (const AttentionSeq& s : op.seqs) {
      const int64_t l = s.past_tokens + s.new_tokens;
      double k0 = 1, kkv = 0;
      if (s.new_tokens == 1) {
        ASSIGN_OR_RETURN(CtaFractions f, Fractions(s.request_id, l));
        kkv = f[1] * static_cast<double>(l);
      } else {
        // The profile's query fraction at the chunk length (hypothetical
        // prefill: no FULL state), the KV fraction at the context.
        EnsureProfile();
        std::vector<double> scratch;
        k0 = profile_.Row(s.new_tokens, &scratch)[0] * static_cast<double>(s.new_tokens);
        kkv = profile_.Row(l, &scratch)[1] * static_cast<double>(l);
      }
      k0 = std::max(1.0, k0);
      kkv = std::max(1.0, kkv);
      const CtaCycles cy = SeqCycles(s.new_tokens, s.past_tokens, heads, op.d_head, k0, kkv);
      Cost c;
      c.cycles = cy.total;
      c.time_s = cy.total / t.clock_hz();
      c.score_s = cy.score / t.clock_hz();
      c.softmax_s = cy.pag / t.clock_hz();
      c.context_s = cy.output / t.clock_hz();
      c.dram_bytes = cy.bytes;
      c.flops = 2 * cy.macs;
      c.compute_energy_pj = cy.macs * t.mac_pj() + cy.exps * t.exp_pj() +
                            cy.aux_ops * t.aux_op_pj() + t.static_power_w() * c.time_s * 1e12;
      c.dram_energy_pj = cy.bytes * 8 * t.dram_pj_per_bit();
      total += c;
    }
    costs[i] = total;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- Execute ----

absl::StatusOr<AttentionResult> CtaDevice::Execute(const AttentionCall& call) const {
  ASSIGN_OR_RETURN(auto r, RunKernel(call));
  return std::move(r.first);
}

absl::StatusOr<std::pair<AttentionResult, CtaOpCounts>> CtaDevice::RunKernel(
    const AttentionCall& call) const {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  const int64_t heads = call.q.shape[0], nq = call.q.shape[1], d = call.q.shape[2];
  const int64_t kv_heads = call.k.shape[0], nkv = call.k.shape[1];
  const int64_t group = heads / kv_heads;
  const double scale = call.scale != 0 ? call.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> qs, ks, vs;
  const float* qf = AsFloats(call.q, &qs);
  const float* kf = AsFloats(call.k, &ks);
  const float* vf = AsFloats(call.v, &vs);
  const uint64_t seed = spec_.data().has_seed() ? spec_.data().seed() : 1;
  // Hashes on the call's widths: 2d for [k | v], d for q.
  const CtaHashes hkv = MakeCtaHashes(spec(), 2 * d, seed);
  const CtaHashes hq = MakeCtaHashes(spec(), d, seed);
  auto rms_scale = [](const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    s = std::sqrt(s / static_cast<double>(std::max<size_t>(1, x.size())));
    return s > 0 ? 1.0 / s : 1.0;
  };
  std::pair<AttentionResult, CtaOpCounts> result;
  AttentionResult& res = result.first;
  CtaOpCounts& counts = result.second;
  res.out = Tensor::Zeros(ElementType::kFp32, {heads, nq, d});
  std::vector<double> out(static_cast<size_t>(nq * d));
  for (int64_t g = 0; g < kv_heads; ++g) {
    std::vector<double> kv(static_cast<size_t>(nkv * 2 * d));
    for (int64_t j = 0; j < nkv; ++j) {
      for (int64_t e = 0; e < d; ++e) {
        kv[j * 2 * d + e] = kf[(g * nkv + j) * d + e];
        kv[j * 2 * d + d + e] = vf[(g * nkv + j) * d + e];
      }
    }
    const CtaCompression ckv = CtaCompress(kv.data(), nkv, 2 * d, rms_scale(kv), hkv.kv1, &hkv.kv2);
    const int64_t kk = ckv.k1 + ckv.k2;
    std::vector<double> kbar(static_cast<size_t>(kk * d)), vbar(static_cast<size_t>(kk * d));
    for (int64_t r = 0; r < kk; ++r) {
      const double* c = r < ckv.k1 ? ckv.c1.data() + r * 2 * d : ckv.c2.data() + (r - ckv.k1) * 2 * d;
      std::copy(c, c + d, kbar.begin() + r * d);
      std::copy(c + d, c + 2 * d, vbar.begin() + r * d);
    }
    counts.k1 += ckv.k1;
    counts.k2 += ckv.k2;
    counts.hash_macs += static_cast<double>(nkv * 2 * d * (hkv.kv1.hashes + hkv.kv2.hashes));
    counts.cag_ops += static_cast<double>(3 * nkv * 2 * d);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      RETURN_IF_ERROR(PollInterrupt());
      std::vector<double> q(static_cast<size_t>(nq * d));
      for (int64_t i = 0; i < nq * d; ++i) q[i] = qf[h * nq * d + i];
      const CtaCompression cq = CtaCompress(q.data(), nq, d, rms_scale(q), hq.q, nullptr);
      counts.k0 += cq.k1;
      counts.hash_macs += static_cast<double>(nq * d * hq.q.hashes);
      counts.cag_ops += static_cast<double>(nq * d);
      CtaCoreAttention(cq.c1.data(), cq.k1, kbar.data(), vbar.data(), ckv.k1, ckv.k2, cq.ct1,
                       ckv.ct1, ckv.ct2, d, scale, /*causal=*/true, out.data(), &counts);
      for (int64_t i = 0; i < nq * d; ++i) res.out.Set(h * nq * d + i, static_cast<float>(out[i]));
      const double pairs = static_cast<double>(nq) * static_cast<double>(nkv - nq) +
                           static_cast<double>(nq) * static_cast<double>(nq + 1) / 2;
      res.stats.kv_positions += static_cast<int64_t>(pairs);
      // The compressed rows every query of the head reads.
      res.stats.kv_positions_read += nq * kk;
      res.stats.v_rows_read += nq * kk;
      res.stats.bytes_read += static_cast<double>((cq.k1 + 2 * kk) * d) * spec().operand_bits() / 8.0;
    }
  }
  return result;
}

SERVESIM_REGISTER_DEVICE(kCta, "cta", &CtaDevice::Create);

}  // namespace servesim::devices
