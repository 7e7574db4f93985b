// What one Estimate round trip to a device agent costs on loopback: an
// in-process agent (real gRPC over 127.0.0.1 TCP) and a RemoteDevice with
// its lookahead off, each call a memo miss (a GEMM whose m grows by one),
// against the same op costed in process. Run:
//   build/bench/servesim_bench --benchmark_filter=Estimate
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/remote_device.h"
#include "devices/presets.h"
#include "devices/registry.h"

namespace {

namespace v1 = servesim::v1;

v1::DeviceSpec Gpu() {
  v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  *g->mutable_xpu() = *servesim::devices::XpuPreset("a100-80gb");
  *g->mutable_interconnect() = *servesim::devices::LinkPreset("nvlink3");
  g->set_dtype(v1::DTYPE_FP16);
  return spec;
}

servesim::devices::Op Gemm(int64_t m) {
  servesim::devices::Op op;
  op.kind = servesim::devices::OpKind::kGemm;
  op.stage = servesim::devices::Stage::kFf1;
  op.m = m, op.n = 12288, op.k = 1536;
  return op;
}

void BM_EstimateInProcess(benchmark::State& state) {
  auto dev = servesim::devices::CreateDevice(Gpu());
  if (!dev.ok()) std::abort();
  servesim::devices::Cost cost;
  int64_t m = 1;
  for (auto _ : state) {
    servesim::devices::Op op = Gemm(m++);
    if (!(*dev)->Estimate({&op, 1}, {&cost, 1}).ok()) std::abort();
    benchmark::DoNotOptimize(cost);
  }
}
BENCHMARK(BM_EstimateInProcess);

void BM_EstimateLoopbackAgent(benchmark::State& state) {
  servesim::agents::AgentServiceOptions opts;
  opts.spec = Gpu();
  auto svc = servesim::agents::AgentService::Create(opts);
  if (!svc.ok()) std::abort();
  auto running = servesim::agents::StartAgentServer(svc->get(), {});
  if (!running.ok()) std::abort();
  servesim::agents::ClientOptions client;
  client.lookahead_max = 0;
  auto remote = servesim::agents::RemoteDevice::Create(
      Gpu(), {"127.0.0.1:" + std::to_string(running->port)}, client, "bench device");
  if (!remote.ok()) std::abort();
  servesim::devices::Cost cost;
  int64_t m = 1;
  for (auto _ : state) {
    servesim::devices::Op op = Gemm(m++);
    if (!(*remote)->Estimate({&op, 1}, {&cost, 1}).ok()) std::abort();
    benchmark::DoNotOptimize(cost);
  }
  running->server->Shutdown();
}
BENCHMARK(BM_EstimateLoopbackAgent)->UseRealTime();

}  // namespace
