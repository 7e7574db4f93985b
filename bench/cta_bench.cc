// What CTA's fidelity modes cost in wall time at GPT-2-medium size (24
// layers, d_model 1024; 16 heads of 64), as bench/prune_full_bench.cc
// measures the token-pruning devices:
//  - BM_CtaFullDecode: one request decoding from L = 1024 to 1024 + steps,
//    one Estimate() per step (request_id fixed). first_step_ms builds the
//    request's token projections from nothing (24 x 1024 tokens hashed);
//    step_ms is the steady state (one new token per layer hashed, then every
//    layer's L residuals re-hashed); request_bytes is what FULL keeps.
//  - BM_CtaCalibrate: CALIBRATED start-up with the default calibration.
// Run: build/bench/servesim_bench --benchmark_filter='Cta'
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "devices/cta/cta_device.h"

namespace {

using servesim::devices::AttentionSeq;
using servesim::devices::Cost;
using servesim::devices::CtaDevice;
using servesim::devices::Op;
using servesim::devices::OpKind;

servesim::v1::DeviceSpec CtaSpec(servesim::v1::PruneFidelity fidelity) {
  servesim::v1::DeviceSpec spec;
  auto p = servesim::devices::CtaPreset("cta_0");
  if (!p.ok()) std::abort();
  *spec.mutable_cta()->mutable_cta() = *p;
  spec.mutable_cta()->set_fidelity(fidelity);
  auto* m = spec.mutable_cta()->mutable_model();
  m->set_layers(24);
  m->set_heads(16);
  m->set_d_head(64);
  return spec;
}

void BM_CtaFullDecode(benchmark::State& state) {
  const int64_t steps = state.range(0);
  constexpr int64_t kFirstL = 1024, kRequest = 7;
  double first_s = 0, rest_s = 0, bytes = 0;
  for (auto _ : state) {
    auto made = CtaDevice::Create(CtaSpec(servesim::v1::PRUNE_FIDELITY_FULL));
    if (!made.ok()) std::abort();
    const auto* dev = static_cast<const CtaDevice*>(made->get());
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = 16, op.kv_heads = 16, op.d_head = 64;
    for (int64_t l = kFirstL; l <= kFirstL + steps; ++l) {
      const std::vector<AttentionSeq> seqs = {{1, l - 1, kRequest}};
      op.seqs = seqs;
      Cost c;
      const auto t0 = std::chrono::steady_clock::now();
      if (!dev->Estimate({&op, 1}, {&c, 1}).ok()) std::abort();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (l == kFirstL ? first_s : rest_s) += s;
      benchmark::DoNotOptimize(c);
    }
    bytes = static_cast<double>(dev->full_bytes());
  }
  state.counters["first_step_ms"] = first_s * 1e3;
  state.counters["step_ms"] = steps > 0 ? rest_s * 1e3 / static_cast<double>(steps) : 0.0;
  state.counters["request_bytes"] = bytes;
}
BENCHMARK(BM_CtaFullDecode)->Arg(64)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_CtaCalibrate(benchmark::State& state) {
  double s = 0;
  for (auto _ : state) {
    auto d = CtaDevice::Create(CtaSpec(servesim::v1::PRUNE_FIDELITY_CALIBRATED));
    if (!d.ok()) std::abort();
    s += static_cast<CtaDevice*>(d->get())->calibration_s();
  }
  state.counters["calibration_s"] = s / static_cast<double>(state.iterations());
}
BENCHMARK(BM_CtaCalibrate)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
