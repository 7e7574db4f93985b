#include "devices/attention_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace servesim::devices {
namespace {

constexpr int kPairs = 8;          // rotary pairs of the recency term (F)
constexpr int kContentStart = 1 + 2 * kPairs;
enum Tag : uint64_t { kTagInstance = 1, kTagKey = 2, kTagValue = 3 };

// A stream seed from the ids: SplitMix64 over each word, so nearby ids give
// unrelated streams.
uint64_t Mix(uint64_t seed, const AttentionInstance& in, int64_t position, Tag tag) {
  uint64_t h = seed;
  for (uint64_t w : {static_cast<uint64_t>(in.request), static_cast<uint64_t>(in.layer),
                     static_cast<uint64_t>(in.head), static_cast<uint64_t>(position),
                     static_cast<uint64_t>(tag)}) {
    uint64_t s = h ^ (w * 0xd1b54a32d192ed03ULL);
    h = SplitMix64(s);
  }
  return h;
}

double Omega(int f, double recency_tokens) { return std::exp2(0.5 * f) / recency_tokens; }

}  // namespace

absl::Status AttentionSource::StepQuery(const AttentionInstance& instance, int64_t context_len,
                                       float* q) const {
  ASSIGN_OR_RETURN(AttentionCall call, DecodeStep(instance, context_len));
  const auto* src = reinterpret_cast<const float*>(call.q.bytes.data());
  std::copy(src, src + d_head(), q);
  return absl::OkStatus();
}

absl::Status AttentionSource::KeyValueRows(const AttentionInstance& instance, int64_t begin,
                                          int64_t end, float* k, float* v) const {
  if (begin < 0 || end <= begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention rows [", begin, ", ", end, "); expected 0 <= begin < end"));
  }
  ASSIGN_OR_RETURN(AttentionCall call, DecodeStep(instance, end));
  const int64_t d = d_head();
  const auto* ks = reinterpret_cast<const float*>(call.k.bytes.data());
  const auto* vs = reinterpret_cast<const float*>(call.v.bytes.data());
  std::copy(ks + begin * d, ks + end * d, k);
  if (v != nullptr) std::copy(vs + begin * d, vs + end * d, v);
  return absl::OkStatus();
}

absl::Status ValidateAttentionDataParams(const AttentionDataParams& p) {
  auto bad = [](absl::string_view field, double v, absl::string_view range) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention data: ", field, " = ", v, "; expected ", range));
  };
  if (p.d_head < kContentStart + 7 || p.d_head > 4096) {
    return bad("d_head", static_cast<double>(p.d_head), "in [24, 4096]");
  }
  if (!(p.recency_logit >= 0) || p.recency_logit > 100) {
    return bad("recency_logit", p.recency_logit, "in [0, 100]");
  }
  if (!(std::fabs(p.sink_logit) <= 100)) return bad("sink_logit", p.sink_logit, "in [-100, 100]");
  if (!(p.recency_tokens >= 1) || p.recency_tokens > 1e6) {
    return bad("recency_tokens", p.recency_tokens, "in [1, 1e6]");
  }
  if (!(p.spread_min > 0) || p.spread_min > 100) {
    return bad("spread_min", p.spread_min, "in (0, 100]");
  }
  if (!(p.spread_max >= p.spread_min) || p.spread_max > 100) {
    return bad("spread_max", p.spread_max, absl::StrCat("in [spread_min (", p.spread_min, "), 100]"));
  }
  if (!(p.tail_dof >= 1) || p.tail_dof > 1e6) return bad("tail_dof", p.tail_dof, "in [1, 1e6]");
  if (!(std::fabs(p.query_drift_rad_per_step) <= 3.2)) {
    return bad("query_drift_rad_per_step", p.query_drift_rad_per_step, "in [-3.2, 3.2]");
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionDataGenerator> AttentionDataGenerator::Create(
    const AttentionDataParams& params) {
  RETURN_IF_ERROR(ValidateAttentionDataParams(params));
  return AttentionDataGenerator(params);
}

double AttentionDataGenerator::Spread(const AttentionInstance& in) const {
  Rng rng(Mix(p_.seed, in, 0, kTagInstance), "attention_data.spread");
  const double u = rng.Uniform();
  return std::exp(std::log(p_.spread_min) + u * (std::log(p_.spread_max) - std::log(p_.spread_min)));
}

void AttentionDataGenerator::Query(const AttentionInstance& in, int64_t t, float* out) const {
  const int64_t d = p_.d_head, m = d - kContentStart;
  const double c = std::sqrt(std::sqrt(static_cast<double>(d)));
  const double a_pos = std::sqrt(p_.recency_logit / kPairs * std::sqrt(static_cast<double>(d)));
  out[0] = static_cast<float>(c);
  for (int f = 0; f < kPairs; ++f) {
    const double w = Omega(f, p_.recency_tokens) * static_cast<double>(t);
    out[1 + 2 * f] = static_cast<float>(a_pos * std::cos(w));
    out[2 + 2 * f] = static_cast<float>(a_pos * std::sin(w));
  }
  // Orthonormal a, b of the instance (Gram-Schmidt on normal vectors).
  Rng rng(Mix(p_.seed, in, 0, kTagInstance), "attention_data.direction");
  std::vector<double> a(m), b(m);
  double na = 0, ab = 0, nb = 0;
  for (int64_t i = 0; i < m; ++i) a[i] = FastNormal(rng), na += a[i] * a[i];
  for (int64_t i = 0; i < m; ++i) b[i] = FastNormal(rng);
  na = std::sqrt(na);
  for (int64_t i = 0; i < m; ++i) a[i] /= na, ab += a[i] * b[i];
  for (int64_t i = 0; i < m; ++i) b[i] -= ab * a[i], nb += b[i] * b[i];
  nb = std::sqrt(nb);
  const double theta = p_.query_drift_rad_per_step * static_cast<double>(t);
  const double ca = std::cos(theta), sb = std::sin(theta);
  const double scale = Spread(in) * c;
  for (int64_t i = 0; i < m; ++i) {
    out[kContentStart + i] = static_cast<float>(scale * (ca * a[i] + sb * b[i] / nb));
  }
}

void AttentionDataGenerator::Key(const AttentionInstance& in, int64_t j, float* out) const {
  const int64_t d = p_.d_head, m = d - kContentStart;
  const double c = std::sqrt(std::sqrt(static_cast<double>(d)));
  const double b_pos = std::sqrt(p_.recency_logit / kPairs * std::sqrt(static_cast<double>(d)));
  out[0] = j == 0 ? static_cast<float>(p_.sink_logit * std::sqrt(static_cast<double>(d)) / c) : 0.0f;
  for (int f = 0; f < kPairs; ++f) {
    const double w = Omega(f, p_.recency_tokens) * static_cast<double>(j);
    out[1 + 2 * f] = static_cast<float>(b_pos * std::cos(w));
    out[2 + 2 * f] = static_cast<float>(b_pos * std::sin(w));
  }
  Rng rng(Mix(p_.seed, in, j, kTagKey), "attention_data.key");
  // lambda = sqrt(nu / chi2_nu), chi2_nu = Gamma(nu / 2, scale 2).
  const double chi2 = rng.Gamma(p_.tail_dof / 2.0, 2.0);
  const double lambda = std::sqrt(p_.tail_dof / std::max(chi2, 1e-12));
  const double scale = c * lambda;
  for (int64_t i = 0; i < m; ++i) out[kContentStart + i] = static_cast<float>(scale * FastNormal(rng));
}

void AttentionDataGenerator::Value(const AttentionInstance& in, int64_t j, float* out) const {
  Rng rng(Mix(p_.seed, in, j, kTagValue), "attention_data.value");
  for (int64_t i = 0; i < p_.d_head; ++i) out[i] = FastNormal(rng);
}

absl::StatusOr<AttentionCall> AttentionDataGenerator::DecodeStep(const AttentionInstance& in,
                                                                 int64_t context_len) const {
  if (context_len < 1 || context_len > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention data: context_len = ", context_len, "; expected in [1, 16777216]"));
  }
  const int64_t d = p_.d_head;
  AttentionCall call;
  call.q = Tensor::Zeros(ElementType::kFp32, {1, 1, d});
  call.k = Tensor::Zeros(ElementType::kFp32, {1, context_len, d});
  call.v = Tensor::Zeros(ElementType::kFp32, {1, context_len, d});
  auto* q = reinterpret_cast<float*>(call.q.bytes.data());
  auto* k = reinterpret_cast<float*>(call.k.bytes.data());
  auto* v = reinterpret_cast<float*>(call.v.bytes.data());
  Query(in, context_len - 1, q);
  for (int64_t j = 0; j < context_len; ++j) {
    Key(in, j, k + j * d);
    Value(in, j, v + j * d);
  }
  return call;
}

absl::Status AttentionDataGenerator::StepQuery(const AttentionInstance& in, int64_t context_len,
                                              float* q) const {
  if (context_len < 1 || context_len > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention data: context_len = ", context_len, "; expected in [1, 16777216]"));
  }
  Query(in, context_len - 1, q);
  return absl::OkStatus();
}

absl::Status AttentionDataGenerator::KeyValueRows(const AttentionInstance& in, int64_t begin,
                                                 int64_t end, float* k, float* v) const {
  if (begin < 0 || end <= begin || end > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention data: rows [", begin, ", ", end, "); expected 0 <= begin < end <= 16777216"));
  }
  const int64_t d = p_.d_head;
  for (int64_t j = begin; j < end; ++j) {
    Key(in, j, k + (j - begin) * d);
    if (v != nullptr) Value(in, j, v + (j - begin) * d);
  }
  return absl::OkStatus();
}

// ----------------------------------------------------------------- .npy --

absl::StatusOr<Tensor> LoadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseNpy(data, path);
}

absl::StatusOr<Tensor> ParseNpy(absl::string_view data, const std::string& path) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) {
    return bad("not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(data[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i) header_len |= size_t{static_cast<unsigned char>(data[8 + i])} << (8 * i);
    header_start = 12;
  } else {
    return bad(absl::StrCat("format version ", major, "; expected 1, 2 or 3"));
  }
  if (header_start + header_len > data.size()) return bad("truncated header");
  const std::string header(data.substr(header_start, header_len));
  auto field = [&](absl::string_view key) -> std::string {
    const size_t at = header.find(absl::StrCat("'", key, "'"));
    if (at == std::string::npos) return "";
    size_t colon = header.find(':', at);
    if (colon == std::string::npos) return "";
    size_t s = colon + 1;
    while (s < header.size() && header[s] == ' ') ++s;
    size_t e = s;
    if (s < header.size() && header[s] == '(') {
      e = header.find(')', s);
      return e == std::string::npos ? "" : header.substr(s, e - s + 1);
    }
    if (s < header.size() && header[s] == '\'') {
      e = header.find('\'', s + 1);
      return e == std::string::npos ? "" : header.substr(s + 1, e - s - 1);
    }
    while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
    return header.substr(s, e - s);
  };
  Tensor t;
  const std::string descr = field("descr");
  if (descr == "<f2") {
    t.type = ElementType::kFp16;
  } else if (descr == "<f4") {
    t.type = ElementType::kFp32;
  } else {
    return bad(absl::StrCat("dtype '", descr, "'; expected '<f2' (fp16) or '<f4' (fp32)"));
  }
  const std::string fortran = field("fortran_order");
  if (fortran != "False") {
    return bad(absl::StrCat("fortran_order = ", fortran.empty() ? "(missing)" : fortran,
                            "; expected False (C order)"));
  }
  std::string shape = field("shape");
  if (shape.size() < 2) return bad("no shape in the header");
  shape = shape.substr(1, shape.size() - 2);
  // The data size the shape needs, saturating at SIZE_MAX (a shape larger
  // than any file is reported as a size mismatch, not an overflow).
  size_t want = Tensor::ElementSize(t.type);
  for (absl::string_view part : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return bad(absl::StrCat("bad shape (", shape, ")"));
    }
    t.shape.push_back(dim);
    const size_t d = static_cast<size_t>(dim);
    want = d != 0 && want > std::numeric_limits<size_t>::max() / d
               ? std::numeric_limits<size_t>::max()
               : want * d;
  }
  const size_t body = header_start + header_len;
  if (data.size() - body != want) {
    return bad(absl::StrCat("holds ", data.size() - body, " data bytes; shape (", shape,
                            ") of ", descr, " needs ", want));
  }
  const auto* elements = reinterpret_cast<const uint8_t*>(data.data() + body);
  if (const int64_t i = FirstNonFinite(t.type, elements, want); i >= 0) {
    return bad(absl::StrCat("element ", i, " is NaN or infinite; the kernels need finite values"));
  }
  t.bytes.assign(elements, elements + want);
  return t;
}

absl::Status WriteNpy(const std::string& path, const Tensor& t) {
  std::string shape;
  for (int64_t d : t.shape) absl::StrAppend(&shape, d, ", ");
  if (t.shape.size() > 1) shape.resize(shape.size() - 1);  // "(2, 3)" / "(5,)"
  if (!shape.empty() && shape.back() == ' ') shape.pop_back();
  std::string header = absl::StrCat("{'descr': '", t.type == ElementType::kFp16 ? "<f2" : "<f4",
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad so that magic (6) + version (2) + length (2) + header is a multiple
  // of 64, ending in '\n' (the format's alignment rule).
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open for writing"));
  out.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header.size() & 0xff),
                       static_cast<char>((header.size() >> 8) & 0xff)};
  out.write(len, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!out) return absl::InvalidArgumentError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<NpyHead> LoadNpyHead(const std::string& dir, int64_t layer, int64_t head) {
  NpyHead h;
  Tensor* dst[3] = {&h.q, &h.k, &h.v};
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const std::string path = absl::StrCat(dir, "/layer", layer, "_head", head, "_", names[i], ".npy");
    ASSIGN_OR_RETURN(*dst[i], LoadNpy(path));
    if (dst[i]->shape.size() != 2 || dst[i]->shape[0] < 1 || dst[i]->shape[1] < 1) {
      std::string shape;
      for (int64_t d : dst[i]->shape) absl::StrAppend(&shape, d, " ");
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": shape [ ", shape, "]; expected [T, d_head], both >= 1"));
    }
  }
  if (h.q.shape != h.k.shape || h.k.shape != h.v.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/layer", layer, "_head", head, "_{q,k,v}.npy: shapes differ: q [", h.q.shape[0], ", ",
        h.q.shape[1], "], k [", h.k.shape[0], ", ", h.k.shape[1], "], v [", h.v.shape[0], ", ",
        h.v.shape[1], "]; expected all [T, d_head]"));
  }
  return h;
}

absl::StatusOr<AttentionCall> DecodeStepFromHead(const NpyHead& head, int64_t context_len) {
  const int64_t t = head.k.shape[0], d = head.k.shape[1];
  if (context_len < 1 || context_len > t) {
    return absl::InvalidArgumentError(absl::StrCat("context_len = ", context_len,
                                                   "; expected in [1, ", t, "] (the capture's T)"));
  }
  AttentionCall call;
  call.q = Tensor::Zeros(ElementType::kFp32, {1, 1, d});
  call.k = Tensor::Zeros(ElementType::kFp32, {1, context_len, d});
  call.v = Tensor::Zeros(ElementType::kFp32, {1, context_len, d});
  for (int64_t c = 0; c < d; ++c) call.q.Set(c, head.q.At((context_len - 1) * d + c));
  for (int64_t i = 0; i < context_len * d; ++i) {
    call.k.Set(i, head.k.At(i));
    call.v.Set(i, head.v.At(i));
  }
  return call;
}

absl::StatusOr<NpyAttentionSource> NpyAttentionSource::Create(const std::string& dir) {
  ASSIGN_OR_RETURN(NpyHead h, LoadNpyHead(dir, 0, 0));
  return NpyAttentionSource(dir, h.k.shape[1]);
}

absl::StatusOr<AttentionCall> NpyAttentionSource::DecodeStep(const AttentionInstance& in,
                                                             int64_t context_len) const {
  ASSIGN_OR_RETURN(NpyHead h, LoadNpyHead(dir_, in.layer, in.head));
  if (h.k.shape[1] != d_head_) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, "/layer", in.layer, "_head", in.head,
                                                   "_k.npy: d_head ", h.k.shape[1], "; expected ",
                                                   d_head_, " (as layer0_head0)"));
  }
  return DecodeStepFromHead(h, context_len);
}

}  // namespace servesim::devices
