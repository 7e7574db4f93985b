// FULL fidelity's K/V cache (devices/prune_common.h, FullKvCache): its rows
// and scales are bit for bit what QuantiseFixed gives on the whole decode
// step, through growth, scale rises, prefixes and eviction; and the two
// devices' FULL costs do not depend on the cache (a cap that drops every
// request after each call, the default cap, the order requests are asked
// in, and the uncached kernels all agree exactly).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "devices/attention_data.h"
#include "devices/prune_common.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

// A source with only DecodeStep (as the .npy source): the cache goes through
// the AttentionSource defaults of StepQuery and KeyValueRows.
class DecodeStepOnly : public AttentionSource {
 public:
  explicit DecodeStepOnly(const AttentionDataGenerator& g) : g_(g) {}
  int64_t d_head() const override { return g_.d_head(); }
  absl::StatusOr<AttentionCall> DecodeStep(const AttentionInstance& in, int64_t l) const override {
    return g_.DecodeStep(in, l);
  }

 private:
  const AttentionDataGenerator& g_;
};

// The cache's rows of (request, layer, head) at context l equal QuantiseFixed
// on DecodeStep, integers and scales; *k_scale receives K's scale.
void ExpectRowsExact(const AttentionSource& src, FullKvCache& cache, int64_t request, int layer,
                     int head, int64_t l, int bits, double* k_scale = nullptr) {
  const int64_t d = src.d_head();
  auto call = src.DecodeStep({request, layer, head}, l);
  ASSERT_TRUE(call.ok());
  std::vector<int16_t> k(l * d), v(l * d);
  const double sk = QuantiseFixed(reinterpret_cast<const float*>(call->k.bytes.data()), l * d,
                                  bits, k.data());
  const double sv = QuantiseFixed(reinterpret_cast<const float*>(call->v.bytes.data()), l * d,
                                  bits, v.data());
  FullKvCache::Lease lease = cache.Acquire(request);
  auto view = lease.Rows(layer, head, l);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->k_scale, sk) << "l " << l;
  EXPECT_EQ(view->v_scale, sv) << "l " << l;
  EXPECT_TRUE(std::equal(k.begin(), k.end(), view->k)) << "K at l " << l;
  EXPECT_TRUE(std::equal(v.begin(), v.end(), view->v)) << "V at l " << l;
  if (k_scale != nullptr) *k_scale = sk;
}

TEST(FullKvCacheTest, RowsEqualTheQuantisedDecodeStepThroughGrowthRisesAndPrefixes) {
  AttentionDataParams p;
  p.d_head = 24;
  p.tail_dof = 2;  // very heavy tails: K's maximum rises often as L grows
  auto g = AttentionDataGenerator::Create(p);
  ASSERT_TRUE(g.ok());
  const DecodeStepOnly slow(*g);
  for (const AttentionSource* src : {static_cast<const AttentionSource*>(&*g),
                                     static_cast<const AttentionSource*>(&slow)}) {
    for (int bits : {12, 16}) {
      FullKvCache cache(src, 2, 2, bits, /*keep_v=*/true, FullKvCache::kDefaultCapBytes);
      // Grow step by step (the scale must rise at least once), then ask
      // prefixes (same scale and a smaller one), then grow again.
      double first_scale = 0, scale = 0;
      int rises = 0;
      for (int64_t l = 1; l <= 160; ++l) {
        double s = 0;
        ExpectRowsExact(*src, cache, 3, 1, 0, l, bits, &s);
        if (l == 1) first_scale = s;
        rises += l > 1 && s != scale;
        scale = s;
      }
      EXPECT_GE(rises, 2);
      EXPECT_NE(first_scale, scale);
      for (int64_t l : {150, 40, 2, 1, 90, 161, 170}) ExpectRowsExact(*src, cache, 3, 1, 0, l, bits);
      // Another head and request: their own rows.
      ExpectRowsExact(*src, cache, 4, 0, 1, 77, bits);
      ExpectRowsExact(*src, cache, 3, 0, 1, 77, bits);
    }
  }
}

TEST(FullKvCacheTest, EvictsLeastRecentlyUsedUnderTheCapAndRebuildsExactly) {
  auto g = AttentionDataGenerator::Create({});
  ASSERT_TRUE(g.ok());
  // K and V of 2 x 2 heads, d 64, int16: 1 KiB per position. A first build
  // of 100 rows takes 100 KiB, growing past it reserves 164 rows (the 64-row
  // minimum growth): the cap holds one request, not two.
  FullKvCache probe(&*g, 2, 2, 12, true, 0);
  EXPECT_EQ(probe.bytes_per_position(), 2 * 2 * 64 * 2 * 2);
  const int64_t cap = 250 * 1024;
  FullKvCache cache(&*g, 2, 2, 12, true, cap);
  auto touch = [&](int64_t request, int64_t l) {
    FullKvCache::Lease lease = cache.Acquire(request);
    for (int layer = 0; layer < 2; ++layer) {
      for (int head = 0; head < 2; ++head) ASSERT_TRUE(lease.Rows(layer, head, l).ok());
    }
  };
  touch(1, 100);
  EXPECT_EQ(cache.head_builds(), 4);
  EXPECT_GE(cache.bytes_of(1), 100 * 1024);
  touch(1, 101);  // grown by a row: no rebuild
  EXPECT_EQ(cache.head_builds(), 4);
  EXPECT_GE(cache.bytes_of(1), 165 * 1024);
  EXPECT_LE(cache.bytes_of(1), 168 * 1024);  // not doubled
  touch(2, 100);  // request 1 is dropped to make room
  EXPECT_EQ(cache.head_builds(), 8);
  EXPECT_EQ(cache.bytes_of(1), 0);
  EXPECT_LE(cache.bytes(), cap);
  touch(2, 101);
  EXPECT_EQ(cache.head_builds(), 8);
  touch(1, 102);  // rebuilt from the source, request 2 dropped
  EXPECT_EQ(cache.head_builds(), 12);
  EXPECT_EQ(cache.bytes_of(2), 0);
  EXPECT_LE(cache.bytes(), cap);
  // The rebuilt rows are exact.
  ExpectRowsExact(*g, cache, 1, 1, 1, 102, 12);
  // A request alone above the cap is dropped after its call.
  FullKvCache tiny(&*g, 2, 2, 12, true, 1);
  {
    FullKvCache::Lease lease = tiny.Acquire(5);
    ASSERT_TRUE(lease.Rows(0, 0, 10).ok());
  }
  EXPECT_EQ(tiny.bytes(), 0);
  ExpectRowsExact(*g, tiny, 5, 0, 0, 10, 12);
}

// ---------------------------------------------------------------- devices --

servesim::v1::DeviceSpec FullSpec(bool spatten, int64_t cap_bytes) {
  servesim::v1::DeviceSpec spec;
  servesim::v1::AttentionShape* m = nullptr;
  if (spatten) {
    *spec.mutable_spatten()->mutable_spatten() = *SpattenPreset("spatten");
    spec.mutable_spatten()->set_fidelity(servesim::v1::PRUNE_FIDELITY_FULL);
    spec.mutable_spatten()->set_full_cache_bytes(cap_bytes);
    m = spec.mutable_spatten()->mutable_model();
  } else {
    *spec.mutable_topick()->mutable_topick() = *TopickPreset("topick");
    spec.mutable_topick()->set_fidelity(servesim::v1::PRUNE_FIDELITY_FULL);
    spec.mutable_topick()->set_full_cache_bytes(cap_bytes);
    m = spec.mutable_topick()->mutable_model();
  }
  m->set_layers(3);
  m->set_heads(4);
  m->set_d_head(64);
  return spec;
}

struct Call {
  int64_t request, l;
};

// Decode costs of the calls, in the order given.
std::vector<Cost> Costs(const Device& dev, const std::vector<Call>& calls) {
  std::vector<Cost> out;
  for (const Call& c : calls) {
    const std::vector<AttentionSeq> seqs = {{1, c.l - 1, c.request}};
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = 4, op.kv_heads = 4, op.d_head = 64;
    op.seqs = seqs;
    Cost cost;
    EXPECT_TRUE(dev.Estimate({&op, 1}, {&cost, 1}).ok());
    out.push_back(cost);
  }
  return out;
}

void ExpectSameCosts(const std::vector<Cost>& a, const std::vector<Cost>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].time_s, b[i].time_s) << i;
    EXPECT_EQ(a[i].cycles, b[i].cycles) << i;
    EXPECT_EQ(a[i].dram_bytes, b[i].dram_bytes) << i;
    EXPECT_EQ(a[i].energy_pj(), b[i].energy_pj()) << i;
  }
}

// Three requests decoding in turns, each from its own start, one of them
// asked again at an earlier L (a hypothetical call: memo) and at a later L
// it skipped to.
std::vector<Call> Interleaved() {
  std::vector<Call> calls;
  for (int64_t s = 0; s < 6; ++s) {
    calls.push_back({11, 200 + s});
    calls.push_back({12, 331 + s});
    calls.push_back({13, 90 + s});
  }
  calls.push_back({11, 202});
  calls.push_back({12, 345});
  return calls;
}

// The same calls grouped by request (another order of requests), mapped
// back to the interleaved order for comparison.
std::vector<Cost> GroupedInInterleavedOrder(const Device& dev, const std::vector<Call>& calls) {
  std::vector<size_t> order(calls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return calls[a].request > calls[b].request; });
  std::vector<Call> grouped;
  for (size_t i : order) grouped.push_back(calls[i]);
  const std::vector<Cost> g = Costs(dev, grouped);
  std::vector<Cost> out(calls.size());
  for (size_t i = 0; i < order.size(); ++i) out[order[i]] = g[i];
  return out;
}

TEST(FullCacheDevicesTest, TopickCostsDoNotDependOnTheCacheOrTheOrderOfRequests) {
  const std::vector<Call> calls = Interleaved();
  auto big = TopickDevice::Create(FullSpec(false, 0));
  auto tiny = TopickDevice::Create(FullSpec(false, 1));  // drops every request after each call
  auto other = TopickDevice::Create(FullSpec(false, 0));
  ASSERT_TRUE(big.ok() && tiny.ok() && other.ok());
  const auto a = Costs(**big, calls);
  ExpectSameCosts(a, Costs(**tiny, calls));
  ExpectSameCosts(a, GroupedInInterleavedOrder(**other, calls));
  const auto* td = static_cast<const TopickDevice*>(big->get());
  ASSERT_NE(td->full_cache(), nullptr);
  EXPECT_EQ(td->full_cache()->bytes_per_position(), 3 * 4 * 64 * 2);  // K only
  EXPECT_EQ(static_cast<const TopickDevice*>(tiny->get())->full_cache()->bytes(), 0);
  // Against the uncached kernel at a step the cache reached by growth.
  auto g = AttentionDataGenerator::Create({});
  TopickCounts sum;
  for (int layer = 0; layer < 3; ++layer) {
    for (int head = 0; head < 4; ++head) {
      sum += td->RunKernel(*g->DecodeStep({12, layer, head}, 336))->counts;
    }
  }
  const double n = static_cast<double>(sum.tokens);
  const auto h = td->HeadCost(336, 64, sum.chunk_fetched[1] / n, sum.chunk_fetched[2] / n,
                              sum.v_fetched / n);
  EXPECT_EQ(a[16].dram_bytes, 4 * (h.k_bytes + h.v_bytes));  // calls[16] = {12, 336}
}

TEST(FullCacheDevicesTest, SpattenCostsDoNotDependOnTheCacheOrTheOrderOfRequests) {
  const std::vector<Call> calls = Interleaved();
  auto big = SpattenDevice::Create(FullSpec(true, 0));
  auto tiny = SpattenDevice::Create(FullSpec(true, 1));
  auto other = SpattenDevice::Create(FullSpec(true, 0));
  ASSERT_TRUE(big.ok() && tiny.ok() && other.ok());
  const auto a = Costs(**big, calls);
  ExpectSameCosts(a, Costs(**tiny, calls));
  ExpectSameCosts(a, GroupedInInterleavedOrder(**other, calls));
  const auto* sd = static_cast<const SpattenDevice*>(big->get());
  ASSERT_NE(sd->full_cache(), nullptr);
  EXPECT_EQ(sd->full_cache()->bytes_per_position(), 3 * 4 * 64 * 2 * 2);  // K and V
  // Against an uncached session (LayerCall + RunLayer) of request 12 from
  // its first L to the L it skipped to.
  auto g = AttentionDataGenerator::Create({});
  SpattenSession s(*sd, 3, 4);
  SpattenCounts last;
  for (int64_t l = 331; l <= 345; ++l) {
    SpattenCounts step;
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_TRUE(s.RunLayer(layer, *LayerCall(*g, 12, layer, 4, l), &step).ok());
    }
    last = step;
  }
  auto row = sd->Fractions(12, 345);
  ASSERT_TRUE(row.ok());
  const auto want = SpattenDevice::RowOf(last);
  for (int i = 0; i < 6; ++i) EXPECT_EQ((*row)[i], want[i]) << i;
}

}  // namespace
}  // namespace servesim::devices
