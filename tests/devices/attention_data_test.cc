// Attention data: the generator's determinism, stability and statistics
// (Token-Picker Fig. 3's spread of dominant tokens, entropy, the sink), and
// the .npy loader on files the test writes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "devices/attention_data.h"
#include "devices/reference_attention.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

AttentionDataGenerator Gen(AttentionDataParams p = {}) {
  auto g = AttentionDataGenerator::Create(p);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

const float* F32(const Tensor& t) { return reinterpret_cast<const float*>(t.bytes.data()); }

// Exact probabilities (double) of a decode step.
std::vector<double> Probabilities(const AttentionCall& c) {
  const int64_t l = c.k.shape[1], d = c.k.shape[2];
  std::vector<double> s(l);
  double mx = -INFINITY;
  for (int64_t j = 0; j < l; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(c.q.At(i)) * c.k.At(j * d + i);
    s[j] = dot / std::sqrt(static_cast<double>(d));
    mx = std::max(mx, s[j]);
  }
  double z = 0;
  for (double& x : s) z += (x = std::exp(x - mx));
  for (double& x : s) x /= z;
  return s;
}

struct Stats {
  double above_1e3 = 0, entropy = 0, sink = 0;
};

Stats Measure(const AttentionDataGenerator& g, int instances, int64_t l) {
  Stats st;
  for (int i = 0; i < instances; ++i) {
    auto c = g.DecodeStep({i, i % 24, i % 16}, l);
    EXPECT_TRUE(c.ok());
    const auto p = Probabilities(*c);
    double above = 0, h = 0;
    for (double x : p) {
      above += x > 1e-3;
      if (x > 0) h -= x * std::log(x);
    }
    st.above_1e3 += above / static_cast<double>(l) / instances;
    st.entropy += h / instances;
    st.sink += p[0] / instances;
  }
  return st;
}

TEST(AttentionDataTest, DeterministicAndOrderIndependent) {
  const auto g = Gen();
  const AttentionInstance in{7, 3, 5};
  auto a = g.DecodeStep(in, 100), b = g.DecodeStep(in, 100), c = g.DecodeStep(in, 300);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->q.bytes, b->q.bytes);
  EXPECT_EQ(a->k.bytes, b->k.bytes);
  EXPECT_EQ(a->k.shape, (std::vector<int64_t>{1, 100, 64}));
  // A position's K and V never change: the first 100 rows at L = 300 are
  // those at L = 100, and a single key generated alone equals its row.
  EXPECT_TRUE(std::equal(a->k.bytes.begin(), a->k.bytes.end(), c->k.bytes.begin()));
  EXPECT_TRUE(std::equal(a->v.bytes.begin(), a->v.bytes.end(), c->v.bytes.begin()));
  std::vector<float> k(64);
  g.Key(in, 42, k.data());
  EXPECT_TRUE(std::equal(k.begin(), k.end(), F32(c->k) + 42 * 64));
  // Other instances, other seeds: other data.
  auto other = g.DecodeStep({8, 3, 5}, 100);
  EXPECT_NE(other->k.bytes, a->k.bytes);
  AttentionDataParams p;
  p.seed = 2;
  EXPECT_NE(Gen(p).DecodeStep(in, 100)->k.bytes, a->k.bytes);
}

TEST(AttentionDataTest, QueryDriftsSlowly) {
  const auto g = Gen();
  const AttentionInstance in{1, 2, 3};
  std::vector<float> q0(64), q1(64), q100(64);
  g.Query(in, 500, q0.data());
  g.Query(in, 501, q1.data());
  g.Query(in, 600, q100.data());
  // Content part (dimensions 17..63): u_t = cos(theta t) a + sin(theta t) b
  // with a, b orthonormal, so u_t . u_t' = cos(0.02 (t' - t)).
  auto cosine = [](const std::vector<float>& x, const std::vector<float>& y) {
    double xy = 0, xx = 0, yy = 0;
    for (int i = 17; i < 64; ++i) xy += x[i] * y[i], xx += x[i] * x[i], yy += y[i] * y[i];
    return xy / std::sqrt(xx * yy);
  };
  EXPECT_NEAR(cosine(q0, q1), std::cos(0.02), 1e-5);
  EXPECT_NEAR(cosine(q0, q100), std::cos(2.0), 1e-5);
  EXPECT_GE(g.Spread(in), 0.6);
  EXPECT_LE(g.Spread(in), 2.0);
}

TEST(AttentionDataTest, SinkAndRecencyTermsAreExact) {
  // With no content spread left (spread 1e-9), scores are the sink and
  // recency terms alone: s_0 = sink + rec * mean_f cos(w_f t), s_t = rec.
  AttentionDataParams p;
  p.spread_min = p.spread_max = 1e-9;
  const auto g = Gen(p);
  auto c = g.DecodeStep({0, 0, 0}, 50);
  ASSERT_TRUE(c.ok());
  auto score = [&](int64_t j) {
    double s = 0;
    for (int i = 0; i < 64; ++i) s += static_cast<double>(c->q.At(i)) * c->k.At(j * 64 + i);
    return s / 8.0;
  };
  double kernel_t = 0;
  for (int f = 0; f < 8; ++f) kernel_t += std::cos(std::exp2(0.5 * f) * 49 / 16.0) / 8;
  EXPECT_NEAR(score(0), 6.0 + 3.0 * kernel_t, 1e-4);
  EXPECT_NEAR(score(49), 3.0, 1e-4);
  double kernel_4 = 0;
  for (int f = 0; f < 8; ++f) kernel_4 += std::cos(std::exp2(0.5 * f) * 4 / 16.0) / 8;
  EXPECT_NEAR(score(45), 3.0 * kernel_4, 1e-4);
}

// Token-Picker Fig. 3: 4.6% vs 23.5% of tokens above 1e-3 in two instances
// of one layer, head and length. Our two extremes of the default spread
// range, at L = 1024, 24 instances each.
TEST(AttentionDataTest, DominantTokenFractionsAtTheSpreadExtremes) {
  AttentionDataParams narrow, wide;
  narrow.spread_min = narrow.spread_max = 0.6;
  wide.spread_min = wide.spread_max = 2.0;
  const Stats n = Measure(Gen(narrow), 24, 1024);
  const Stats w = Measure(Gen(wide), 24, 1024);
  std::printf("spread 0.6: above 1e-3 %.4f entropy %.3f sink %.4f\n", n.above_1e3, n.entropy,
              n.sink);
  std::printf("spread 2.0: above 1e-3 %.4f entropy %.3f sink %.4f\n", w.above_1e3, w.entropy,
              w.sink);
  EXPECT_GE(n.above_1e3, 0.18);
  EXPECT_LE(n.above_1e3, 0.29);
  EXPECT_GE(w.above_1e3, 0.02);
  EXPECT_LE(w.above_1e3, 0.09);
  // Entropy (nats): near-flat for the narrow spread (uniform: ln 1024 =
  // 6.93), a few nats for the wide one.
  EXPECT_GE(n.entropy, 5.0);
  EXPECT_LE(n.entropy, 6.6);
  EXPECT_GE(w.entropy, 1.5);
  EXPECT_LE(w.entropy, 4.0);
  // The sink: e^6 / (e^6 + sum of the rest) is a few to ~15% of the mass,
  // hundreds of times the 1/1024 of an average token.
  EXPECT_GE(n.sink, 0.05);
  EXPECT_LE(n.sink, 0.2);
  EXPECT_GE(w.sink, 0.01);
  EXPECT_LE(w.sink, 0.12);
}

TEST(AttentionDataTest, InstancesVaryAsFig3) {
  // Default parameters: across instances the dominant fraction ranges over
  // the paper's two examples.
  const auto g = Gen();
  double lo = 1, hi = 0;
  for (int i = 0; i < 32; ++i) {
    auto c = g.DecodeStep({i, 5, i % 16}, 1024);
    const auto p = Probabilities(*c);
    double above = 0;
    for (double x : p) above += x > 1e-3;
    lo = std::min(lo, above / 1024);
    hi = std::max(hi, above / 1024);
  }
  EXPECT_LT(lo, 0.08);
  EXPECT_GT(hi, 0.18);
}

TEST(AttentionDataTest, BadParamsNameTheField) {
  AttentionDataParams p;
  p.d_head = 8;
  auto g = AttentionDataGenerator::Create(p);
  ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("d_head"), std::string::npos);
  p = {};
  p.spread_max = 0.1;
  g = AttentionDataGenerator::Create(p);
  EXPECT_NE(g.status().message().find("spread_max"), std::string::npos);
  EXPECT_EQ(Gen().DecodeStep({0, 0, 0}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// ----------------------------------------------------------------- .npy --

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("servesim_npy_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void WriteRaw(const std::string& name, const std::string& bytes) const {
    std::ofstream(Path(name), std::ios::binary) << bytes;
  }
  std::filesystem::path dir_;
};

Tensor Ramp(ElementType type, std::vector<int64_t> shape, float step) {
  Tensor t = Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) t.Set(i, step * static_cast<float>(i) - 1.0f);
  return t;
}

TEST_F(NpyTest, RoundTripFp32AndFp16) {
  for (ElementType type : {ElementType::kFp32, ElementType::kFp16}) {
    const Tensor t = Ramp(type, {3, 5}, 0.25f);
    ASSERT_TRUE(WriteNpy(Path("a.npy"), t).ok());
    auto back = LoadNpy(Path("a.npy"));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->type, type);
    EXPECT_EQ(back->shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(back->bytes, t.bytes);
    // The header is numpy's: magic, version 1.0, a 64-byte aligned dict.
    std::ifstream in(Path("a.npy"), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(data.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const size_t header = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    EXPECT_EQ((10 + header) % 64, 0u);
    EXPECT_EQ(data.size(), 10 + header + t.bytes.size());
  }
  const Tensor v = Ramp(ElementType::kFp32, {7}, 1.0f);
  ASSERT_TRUE(WriteNpy(Path("v.npy"), v).ok());
  EXPECT_EQ(LoadNpy(Path("v.npy"))->shape, (std::vector<int64_t>{7}));
}

TEST_F(NpyTest, HandWrittenVersion2Header) {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  h.append(64 - (12 + h.size() + 1) % 64, ' ');
  h.push_back('\n');
  std::string file("\x93NUMPY\x02\x00", 8);
  const uint32_t n = static_cast<uint32_t>(h.size());
  file.append(reinterpret_cast<const char*>(&n), 4);
  file += h;
  const float vals[4] = {1.5f, -2.0f, 3.25f, 0.0f};
  file.append(reinterpret_cast<const char*>(vals), sizeof(vals));
  WriteRaw("v2.npy", file);
  auto t = LoadNpy(Path("v2.npy"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->At(2), 3.25f);
}

TEST(NpyParseTest, ShapesPastAnyFileAreASizeMismatchNotAnOverflow) {
  // (2^40, 2^40) fp32 needs 2^82 bytes: the size saturates at SIZE_MAX (it
  // used to overflow int64, undefined behaviour that UBSan reports).
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }";
  h.append(64 - (10 + h.size() + 1) % 64, ' ');
  h.push_back('\n');
  std::string file("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(h.size()));
  file.push_back(0);
  file += h;
  file.append(16, '\0');
  auto t = ParseNpy(file, "huge.npy");
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_EQ(t.status().message(),
            "huge.npy: holds 16 data bytes; shape (1099511627776, 1099511627776) of <f4 needs "
            "18446744073709551615");
  // An empty dimension makes an empty tensor, whatever the others.
  std::string e = "{'descr': '<f2', 'fortran_order': False, 'shape': (0, 1099511627776), }";
  e.append(64 - (10 + e.size() + 1) % 64, ' ');
  e.push_back('\n');
  std::string empty("\x93NUMPY\x01\x00", 8);
  empty.push_back(static_cast<char>(e.size()));
  empty.push_back(0);
  empty += e;
  // A NaN (fp16 0x7e00) in the data: the kernels need finite values.
  std::string nan = empty;
  nan.replace(nan.find("(0, 1099511627776)"), 18, "(3,)              ");
  nan += std::string("\x00\x3c\x00\x7e\x00\x3c", 6);
  auto n = ParseNpy(nan, "nan.npy");
  ASSERT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << n.status();
  EXPECT_EQ(n.status().message(), "nan.npy: element 1 is NaN or infinite; the kernels need finite values");
  auto z = ParseNpy(empty, "empty.npy");
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->shape, (std::vector<int64_t>{0, 1099511627776}));
  EXPECT_TRUE(z->bytes.empty());
}

TEST_F(NpyTest, BadFilesNameTheFile) {
  auto expect_error = [&](const std::string& name, absl::StatusCode code, const std::string& what) {
    auto t = LoadNpy(Path(name));
    ASSERT_EQ(t.status().code(), code) << t.status();
    EXPECT_NE(t.status().message().find(Path(name)), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status();
  };
  expect_error("missing.npy", absl::StatusCode::kNotFound, "cannot open");
  WriteRaw("magic.npy", "PK\x03\x04 not numpy at all");
  expect_error("magic.npy", absl::StatusCode::kInvalidArgument, "magic");
  auto with_header = [](const std::string& dict, size_t body) {
    std::string h = dict;
    h.append(64 - (10 + h.size() + 1) % 64, ' ');
    h.push_back('\n');
    std::string f("\x93NUMPY\x01\x00", 8);
    f.push_back(static_cast<char>(h.size()));
    f.push_back(0);
    return f + h + std::string(body, '\0');
  };
  WriteRaw("f8.npy", with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16));
  expect_error("f8.npy", absl::StatusCode::kInvalidArgument, "'<f8'");
  WriteRaw("fortran.npy", with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16));
  expect_error("fortran.npy", absl::StatusCode::kInvalidArgument, "fortran_order");
  WriteRaw("short.npy", with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20));
  expect_error("short.npy", absl::StatusCode::kInvalidArgument, "needs 24");
}

TEST_F(NpyTest, HeadLayoutAndDecodeStep) {
  const auto g = Gen();
  auto step = g.DecodeStep({0, 1, 2}, 12);
  ASSERT_TRUE(step.ok());
  // A capture of T = 12 positions: q row t is the query at position t.
  Tensor q = Tensor::Zeros(ElementType::kFp32, {12, 64});
  std::vector<float> row(64);
  for (int t = 0; t < 12; ++t) {
    g.Query({0, 1, 2}, t, row.data());
    for (int c = 0; c < 64; ++c) q.Set(t * 64 + c, row[c]);
  }
  Tensor k = step->k, v = step->v;
  k.shape = v.shape = {12, 64};
  ASSERT_TRUE(WriteNpy(Path("layer1_head2_q.npy"), q).ok());
  ASSERT_TRUE(WriteNpy(Path("layer1_head2_k.npy"), k).ok());
  ASSERT_TRUE(WriteNpy(Path("layer1_head2_v.npy"), v).ok());
  auto head = LoadNpyHead(dir_.string(), 1, 2);
  ASSERT_TRUE(head.ok()) << head.status();
  auto call = DecodeStepFromHead(*head, 12);
  ASSERT_TRUE(call.ok());
  EXPECT_EQ(call->q.bytes, step->q.bytes);
  EXPECT_EQ(call->k.bytes, step->k.bytes);
  EXPECT_EQ(call->v.bytes, step->v.bytes);
  auto shorter = DecodeStepFromHead(*head, 5);
  EXPECT_EQ(shorter->k.shape, (std::vector<int64_t>{1, 5, 64}));
  EXPECT_EQ(DecodeStepFromHead(*head, 13).status().code(), absl::StatusCode::kInvalidArgument);
  // Through the source interface (layer0_head0 gives d_head).
  for (const char* n : {"q", "k", "v"}) {
    std::filesystem::copy_file(Path(std::string("layer1_head2_") + n + ".npy"),
                               Path(std::string("layer0_head0_") + n + ".npy"));
  }
  auto src = NpyAttentionSource::Create(dir_.string());
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->d_head(), 64);
  EXPECT_EQ(src->DecodeStep({99, 1, 2}, 12)->k.bytes, step->k.bytes);
  // Mismatched shapes name the files.
  ASSERT_TRUE(WriteNpy(Path("layer1_head2_v.npy"), Ramp(ElementType::kFp16, {11, 64}, 0.01f)).ok());
  auto bad = LoadNpyHead(dir_.string(), 1, 2);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("layer1_head2_{q,k,v}.npy"), std::string::npos);
  auto missing = LoadNpyHead(dir_.string(), 3, 0);
  EXPECT_NE(missing.status().message().find("layer3_head0_q.npy"), std::string::npos);
}

}  // namespace
}  // namespace servesim::devices
