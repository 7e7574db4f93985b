// What the AttAcc device's attention schedule costs per decode iteration,
// against the batch size: GPT-3 175B (96 heads, d_head 128) on the
// attacc_bank preset (40 stacks), 8 head groups (head-level pipelining),
// KV heads placed as the scheduler places them (StackPlacement: least
// reserved stack first) and kept for the run, every sequence one token
// longer each iteration (so every iteration asks a new schedule, as a
// serving run does). Lengths are spread over 128..4,223 tokens.
// Run: build/bench/servesim_bench --benchmark_filter=AttAcc
#include <benchmark/benchmark.h>

#include <vector>

#include "devices/attacc/attacc_device.h"
#include "devices/registry.h"
#include "scheduler/placement.h"

namespace {

using servesim::devices::AttentionSeq;
using servesim::devices::Cost;
using servesim::devices::Op;

void BM_AttAccDecodeIteration(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  constexpr int kHeads = 96, kGroups = 8, kStacks = 40;
  servesim::v1::DeviceSpec spec;
  auto preset = servesim::devices::AttAccPreset("attacc_bank");
  if (!preset.ok()) std::abort();
  *spec.mutable_attacc()->mutable_attacc() = *preset;
  spec.mutable_attacc()->set_dtype(servesim::v1::DTYPE_FP16);
  auto device = servesim::devices::CreateDevice(spec);
  if (!device.ok()) std::abort();
  servesim::scheduler::StackPlacement placement(kStacks, int64_t{1} << 40, kHeads);
  std::vector<AttentionSeq> seqs(n);
  std::vector<int32_t> stacks;
  for (int i = 0; i < n; ++i) {
    // A spread of lengths without structure (an LCG), as a mixed batch has.
    const int64_t past = 128 + (static_cast<int64_t>(i) * 2654435761u) % 4096;
    seqs[i] = {1, past, i};
    if (!placement.Place(i, past + 2048)) std::abort();
    const auto st = placement.StacksOf(i);
    stacks.insert(stacks.end(), st.begin(), st.end());
  }
  std::vector<Op> ops(kGroups);
  for (int g = 0; g < kGroups; ++g) {
    ops[g].kind = servesim::devices::OpKind::kAttention;
    ops[g].heads = ops[g].kv_heads = kHeads;
    ops[g].d_head = 128;
    ops[g].seqs = seqs;
    ops[g].kv_head_stack = stacks;
    ops[g].head_begin = kHeads * g / kGroups;
    ops[g].head_end = kHeads * (g + 1) / kGroups;
  }
  std::vector<Cost> costs(kGroups);
  for (auto _ : state) {
    for (AttentionSeq& s : seqs) ++s.past_tokens;
    if (!(*device)->Estimate(ops, absl::MakeSpan(costs)).ok()) std::abort();
    benchmark::DoNotOptimize(costs.data());
  }
  // items_per_second: sequences costed per second (each in 12 heads of
  // each of the 8 ops).
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_AttAccDecodeIteration)->RangeMultiplier(2)->Range(8, 512);

}  // namespace
