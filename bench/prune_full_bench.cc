// What the token-pruning devices' functional fidelity modes cost in wall
// time, at GPT-2-medium size (24 layers x 16 heads, d_head 64; the papers'
// model scale and the size examples/ runs in FULL mode):
//  - BM_TopickFullDecode / BM_SpattenFullDecode: one request decoding from
//    L = 1024 (SpAtten also 256 and 4096) to L + steps, one Estimate() per
//    step with one decode sequence (request_id fixed), as the serving loop
//    asks. Figures: first_step_ms (the first L: the request's first call,
//    which builds its state from nothing), step_ms (mean of the following steps, the steady
//    state of a decoding request), all_ms (mean over every call); the same
//    in thread CPU time (*_cpu_ms), steadier on a shared machine; the K/V
//    cache's bytes per position and what it holds for the request at the
//    end (L = 1024 + steps).
//  - BM_TopickCalibrate / BM_SpattenCalibrate: CALIBRATED start-up with the
//    default calibration (the device's own calibration_s()).
//  - BM_LadFullDecode/{64,128}: the same for LAD (lad_1.5) at GPT-2-medium
//    size (d_head 64) and at LLaMA-2-7B size (32 x 32 heads, d_head 128),
//    its per-request state (counters, modes, centres, caches A-F) kept
//    between steps; state_bytes is what the device holds at the end.
//    BM_LadCalibrate: CALIBRATED start-up at d_head 128 (LLaMA-2).
// Timed by hand (steady_clock) with one iteration: each step is a distinct
// call, memoised afterwards, so repeating a step would time the memo.
// Run: build/bench/servesim_bench --benchmark_filter='Full|Calibrate'
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "devices/lad/lad_device.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"

namespace {

using servesim::devices::AttentionSeq;
using servesim::devices::Cost;
using servesim::devices::Device;
using servesim::devices::Op;
using servesim::devices::OpKind;

constexpr int kLayers = 24, kHeads = 16, kDHead = 64;
constexpr int64_t kFirstL = 1024;
constexpr int64_t kRequest = 7;

// CPU seconds of this thread: the figures on a shared machine (wall time is
// reported too).
double ThreadCpuS() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

servesim::v1::DeviceSpec PruneSpec(bool spatten, servesim::v1::PruneFidelity fidelity) {
  servesim::v1::DeviceSpec spec;
  servesim::v1::AttentionShape* m = nullptr;
  if (spatten) {
    auto p = servesim::devices::SpattenPreset("spatten");
    if (!p.ok()) std::abort();
    *spec.mutable_spatten()->mutable_spatten() = *p;
    spec.mutable_spatten()->set_fidelity(fidelity);
    m = spec.mutable_spatten()->mutable_model();
  } else {
    auto p = servesim::devices::TopickPreset("topick");
    if (!p.ok()) std::abort();
    *spec.mutable_topick()->mutable_topick() = *p;
    spec.mutable_topick()->set_fidelity(fidelity);
    m = spec.mutable_topick()->mutable_model();
  }
  m->set_layers(kLayers);
  m->set_heads(kHeads);
  m->set_d_head(kDHead);
  return spec;
}

void FullDecode(benchmark::State& state, bool spatten) {
  const int64_t steps = state.range(0);
  const int64_t first_l = state.range(1);
  double first_s = 0, rest_s = 0, first_cpu_s = 0, rest_cpu_s = 0, checksum = 0;
  double per_position = 0, request_bytes = 0;
  for (auto _ : state) {
    auto dev = servesim::devices::CreateDevice(PruneSpec(spatten, servesim::v1::PRUNE_FIDELITY_FULL));
    if (!dev.ok()) std::abort();
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = kHeads, op.kv_heads = kHeads, op.d_head = kDHead;
    for (int64_t l = first_l; l <= first_l + steps; ++l) {
      const std::vector<AttentionSeq> seqs = {{1, l - 1, kRequest}};
      op.seqs = seqs;
      Cost c;
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ThreadCpuS();
      if (!(*dev)->Estimate({&op, 1}, {&c, 1}).ok()) std::abort();
      const double cpu = ThreadCpuS() - c0;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (l == first_l ? first_s : rest_s) += s;
      (l == first_l ? first_cpu_s : rest_cpu_s) += cpu;
      checksum += c.dram_bytes;
      benchmark::DoNotOptimize(c);
    }
    // The memory FULL mode holds for the request (its K/V cache).
    const servesim::devices::FullKvCache* cache =
        spatten ? static_cast<const servesim::devices::SpattenDevice*>(dev->get())->full_cache()
                : static_cast<const servesim::devices::TopickDevice*>(dev->get())->full_cache();
    if (cache != nullptr) {
      per_position = static_cast<double>(cache->bytes_per_position());
      request_bytes = static_cast<double>(cache->bytes_of(kRequest));
    }
  }
  state.counters["cache_bytes_per_position"] = per_position;
  state.counters["cache_bytes_of_request"] = request_bytes;
  state.counters["first_step_ms"] = first_s * 1e3;
  state.counters["step_ms"] = steps > 0 ? rest_s * 1e3 / static_cast<double>(steps) : 0.0;
  state.counters["first_step_cpu_ms"] = first_cpu_s * 1e3;
  state.counters["step_cpu_ms"] =
      steps > 0 ? rest_cpu_s * 1e3 / static_cast<double>(steps) : 0.0;
  state.counters["all_ms"] = (first_s + rest_s) * 1e3 / static_cast<double>(steps + 1);
  // The sum of the DRAM bytes of every step: equal before and after a change
  // that must not change results (printed in full below).
  state.counters["dram_bytes_sum"] = checksum;
  std::printf("%s FULL: dram_bytes_sum %.17g\n", spatten ? "spatten" : "topick", checksum);
}

void BM_TopickFullDecode(benchmark::State& state) { FullDecode(state, false); }
void BM_SpattenFullDecode(benchmark::State& state) { FullDecode(state, true); }
// Args: {steps, first L}. The L = 1024 runs are the reference figures; the
// SpAtten runs at other first L give a step's cost against L and a first
// step's against its prompt (what agents/remote_device.cc's placement
// weighs).
BENCHMARK(BM_TopickFullDecode)->Args({64, kFirstL})->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpattenFullDecode)
    ->Args({64, kFirstL})
    ->Args({64, 256})
    ->Args({64, 4096})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void BM_TopickCalibrate(benchmark::State& state) {
  double s = 0;
  for (auto _ : state) {
    auto d = servesim::devices::TopickDevice::Create(
        PruneSpec(false, servesim::v1::PRUNE_FIDELITY_CALIBRATED));
    if (!d.ok()) std::abort();
    s += static_cast<servesim::devices::TopickDevice*>(d->get())->calibration_s();
  }
  state.counters["calibration_s"] = s / static_cast<double>(state.iterations());
}
void BM_SpattenCalibrate(benchmark::State& state) {
  double s = 0;
  for (auto _ : state) {
    auto d = servesim::devices::SpattenDevice::Create(
        PruneSpec(true, servesim::v1::PRUNE_FIDELITY_CALIBRATED));
    if (!d.ok()) std::abort();
    s += static_cast<servesim::devices::SpattenDevice*>(d->get())->calibration_s();
  }
  state.counters["calibration_s"] = s / static_cast<double>(state.iterations());
}
BENCHMARK(BM_TopickCalibrate)->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpattenCalibrate)->Iterations(3)->Unit(benchmark::kMillisecond);

void BM_LadFullDecode(benchmark::State& state) {
  const int64_t d = state.range(0);
  const int layers = d == 64 ? kLayers : 32, heads = d == 64 ? kHeads : 32;
  const int64_t steps = 16;
  servesim::v1::DeviceSpec spec;
  auto p = servesim::devices::LadPreset("lad_1.5");
  if (!p.ok()) std::abort();
  *spec.mutable_lad()->mutable_lad() = *p;
  spec.mutable_lad()->set_fidelity(servesim::v1::PRUNE_FIDELITY_FULL);
  spec.mutable_lad()->mutable_model()->set_layers(layers);
  spec.mutable_lad()->mutable_model()->set_heads(heads);
  spec.mutable_lad()->mutable_model()->set_d_head(static_cast<int32_t>(d));
  double first_s = 0, rest_s = 0, rest_cpu_s = 0, bytes = 0;
  for (auto _ : state) {
    auto dev = servesim::devices::LadDevice::Create(spec);
    if (!dev.ok()) std::abort();
    Op op;
    op.kind = OpKind::kAttention;
    op.heads = heads, op.kv_heads = heads, op.d_head = d;
    for (int64_t l = kFirstL; l <= kFirstL + steps; ++l) {
      const std::vector<AttentionSeq> seqs = {{1, l - 1, kRequest}};
      op.seqs = seqs;
      Cost c;
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ThreadCpuS();
      if (!(*dev)->Estimate({&op, 1}, {&c, 1}).ok()) std::abort();
      const double cpu = ThreadCpuS() - c0;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (l == kFirstL ? first_s : rest_s) += s;
      if (l != kFirstL) rest_cpu_s += cpu;
      benchmark::DoNotOptimize(c);
    }
    bytes = static_cast<double>(
        static_cast<const servesim::devices::LadDevice*>(dev->get())->full_state_bytes());
  }
  state.counters["first_step_ms"] = first_s * 1e3;
  state.counters["step_ms"] = rest_s * 1e3 / static_cast<double>(steps);
  state.counters["step_cpu_ms"] = rest_cpu_s * 1e3 / static_cast<double>(steps);
  state.counters["state_bytes"] = bytes;
}
BENCHMARK(BM_LadFullDecode)->Arg(64)->Arg(128)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_LadCalibrate(benchmark::State& state) {
  servesim::v1::DeviceSpec spec;
  auto p = servesim::devices::LadPreset("lad_1.5");
  if (!p.ok()) std::abort();
  *spec.mutable_lad()->mutable_lad() = *p;
  spec.mutable_lad()->set_fidelity(servesim::v1::PRUNE_FIDELITY_CALIBRATED);
  spec.mutable_lad()->mutable_model()->set_d_head(128);
  double s = 0;
  for (auto _ : state) {
    auto d = servesim::devices::LadDevice::Create(spec);
    if (!d.ok()) std::abort();
    s += static_cast<servesim::devices::LadDevice*>(d->get())->calibration_s();
  }
  state.counters["calibration_s"] = s / static_cast<double>(state.iterations());
}
BENCHMARK(BM_LadCalibrate)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
