// What one simulated iteration costs in wall time: scheduling a batch and
// costing it. Run: build/bench/servesim_bench
#include <benchmark/benchmark.h>

#include "scenario/scenario.h"
#include "devices/gpu/profile.h"
#include "devices/registry.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace {

servesim::scenario::ResolvedScenario Gpt3Dgx() {
  auto sc = servesim::scenario::ParseScenarioText(R"pb(
    model { preset: "gpt3-175b" }
    cluster { xpu { preset: "a100-hbm3" } tensor_parallel: 8 }
    workload { saturated { num_requests: 1 input_tokens: 1 output_tokens: 1 } }
  )pb", "bench");
  if (!sc.ok() || !servesim::scenario::Normalize(&*sc).ok()) std::abort();
  auto r = servesim::scenario::Resolve(*sc);
  if (!r.ok()) std::abort();
  return *r;
}

// Costing a decode iteration of `batch` requests with distinct KV lengths.
void BM_PlanDecode(benchmark::State& state) {
  const auto sc = Gpt3Dgx();
  auto device = servesim::devices::CreateDevice(sc.xpu_device);
  servesim::scheduler::IterationPlanner planner(sc.model, 8, device->get());
  servesim::scheduler::Batch batch;
  for (int i = 0; i < state.range(0); ++i) {
    batch.entries.push_back({i, 1, 1000 + 13 * i, false, true, {}});
  }
  batch.decode_tokens = batch.emitting = state.range(0);
  for (auto _ : state) {
    auto cost = planner.Plan(batch);
    benchmark::DoNotOptimize(cost);
  }
}
BENCHMARK(BM_PlanDecode)->Arg(1)->Arg(64)->Arg(256);

// Schedule + Complete of a steady decode batch.
void BM_ScheduleDecode(benchmark::State& state) {
  servesim::scheduler::BatchingConfig cfg;
  cfg.kv_capacity_blocks = 1 << 22;
  cfg.max_context_tokens = 1 << 30;
  servesim::scheduler::ReplicaScheduler s(cfg);
  for (int i = 0; i < state.range(0); ++i) {
    s.Add({i, 0, 500, 1 << 29, {}}, 0, nullptr);
  }
  double now = 0;
  for (auto _ : state) {
    const auto& b = s.Schedule(now);
    benchmark::DoNotOptimize(b.entries.data());
    now += 0.05;
    s.Complete(now, nullptr);
  }
}
BENCHMARK(BM_ScheduleDecode)->Arg(64)->Arg(256);

}  // namespace

// Loading the shipped profile bundle (RTX PRO 6000, Llama-3.1-8B, TP1:
// 19,364 attention rows, 1,368 dense and 80 per-sequence rows, the skew
// fit), uncached, from the repository root (bench/replay.sh runs it there).
void BM_GpuProfileLoad(benchmark::State& state) {
  const std::string dir = "examples/vllm/profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1";
  for (auto _ : state) {
    auto p = servesim::devices::GpuProfile::Load(dir);
    if (!p.ok()) {
      state.SkipWithError(std::string(p.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(p->get());
  }
}
BENCHMARK(BM_GpuProfileLoad)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
