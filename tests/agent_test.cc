// Device agents (issue 4): the protocol's conversions, the DeviceAgent
// service and RemoteDevice in process (bad requests, token, TLS, memo,
// sessions, fail-over), and end to end with real servesim-agent processes
// (byte-identical outputs, an agent killed mid-run).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/attacc/attacc_device.h"
#include "devices/attention_data.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/topick/topick_device.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "cluster/sweep.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_AGENT_BINARY
#error "SERVESIM_AGENT_BINARY must name the servesim-agent executable"
#endif

namespace servesim::agents {
namespace {

namespace fs = std::filesystem;
namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;

// ------------------------------------------------------------ helpers ----

using test_util::ReadFile;
using test_util::WriteFile;
std::string FreshDir() { return test_util::FreshDir("agent"); }

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

void ExpectSameBits(const Cost& a, const Cost& b) {
  for (double Cost::*f : {&Cost::time_s, &Cost::flops, &Cost::dram_bytes, &Cost::link_bytes,
                          &Cost::compute_energy_pj, &Cost::dram_energy_pj, &Cost::link_energy_pj,
                          &Cost::bg_bus_bytes, &Cost::tsv_bytes, &Cost::external_bytes,
                          &Cost::cycles, &Cost::score_s, &Cost::softmax_s, &Cost::context_s}) {
    EXPECT_EQ(Bits(a.*f), Bits(b.*f));
  }
}

v1::DeviceSpec GpuSpec() {
  v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  *g->mutable_xpu() = *devices::XpuPreset("a100-80gb");
  *g->mutable_interconnect() = *devices::LinkPreset("nvlink3");
  g->set_dtype(v1::DTYPE_FP16);
  return spec;
}

v1::DeviceSpec AttAccSpec() {
  v1::DeviceSpec spec;
  *spec.mutable_attacc()->mutable_attacc() = *devices::AttAccPreset("attacc_bank");
  spec.mutable_attacc()->set_dtype(v1::DTYPE_FP16);
  return spec;
}

// One decode iteration's ops (GPT-3-like shapes), attention in two head
// groups over the same sequences.
struct SampleOps {
  std::vector<AttentionSeq> seqs{{1, 100, 7}, {1, 2047, 8}, {1, 5, -1}};
  std::vector<int32_t> stacks;
  std::vector<Op> ops;
  explicit SampleOps(bool gemm_and_elementwise = true) {
    for (int g = 0; g < 2; ++g) {
      Op a;
      a.kind = OpKind::kAttention;
      a.stage = devices::Stage::kAttention;
      a.heads = 96, a.kv_heads = 96, a.d_head = 128;
      a.seqs = seqs;
      a.head_begin = 48 * g, a.head_end = 48 * (g + 1);
      ops.push_back(a);
    }
    Op gemm;
    gemm.kind = OpKind::kGemm;
    gemm.stage = devices::Stage::kFf1;
    gemm.m = 3, gemm.n = 12288, gemm.k = 1536;
    ops.push_back(gemm);
    if (gemm_and_elementwise) {
      Op e;
      e.kind = OpKind::kElementwise;
      e.stage = devices::Stage::kNorm;
      e.elements = 3 * 12288, e.bytes_per_element = 4, e.flops_per_element = 5;
      ops.push_back(e);
      Op r;
      r.kind = OpKind::kAllReduce;
      r.stage = devices::Stage::kAllReduce;
      r.bytes = 1e6, r.participants = 8;
      ops.push_back(r);
    }
  }
};

// An agent in this process, on a free loopback port.
struct LocalAgent {
  std::unique_ptr<AgentService> service;
  RunningAgent running;
  std::string address() const { return absl::StrCat("127.0.0.1:", running.port); }
  ~LocalAgent() {
    if (running.server) running.server->Shutdown();
  }
};

std::unique_ptr<LocalAgent> StartLocal(v1::DeviceSpec spec, AgentServiceOptions opts = {},
                                       AgentServerOptions server = {}) {
  auto a = std::make_unique<LocalAgent>();
  opts.spec = std::move(spec);
  auto svc = AgentService::Create(opts);
  EXPECT_TRUE(svc.ok()) << svc.status();
  if (!svc.ok()) return nullptr;
  a->service = std::move(*svc);
  auto running = StartAgentServer(a->service.get(), server);
  EXPECT_TRUE(running.ok()) << running.status();
  if (!running.ok()) return nullptr;
  a->running = std::move(*running);
  return a;
}

ClientOptions FastClient() {
  ClientOptions o;
  o.deadline_s = 5;
  o.attempts_per_endpoint = 2;
  o.backoff_initial_s = 0.01;
  return o;
}

devices::Tensor Ramp(devices::ElementType type, std::vector<int64_t> shape, float scale) {
  devices::Tensor t = devices::Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) t.Set(i, std::sin(scale * float(i + 1)));
  return t;
}

// --------------------------------------------------------- conversions ----

TEST(AgentConvertTest, OpsRoundTripAndShareSequenceLists) {
  SampleOps s;
  s.stacks = {0, 1, 2, 3, 4, 5};
  s.ops[0].kv_heads = 2, s.ops[1].kv_heads = 2;
  s.ops[0].kv_head_stack = s.stacks;
  s.ops[1].kv_head_stack = s.stacks;
  v1::EstimateRequest req;
  EncodeOps(s.ops, &req);
  EXPECT_EQ(req.seq_lists_size(), 1);  // both head groups name one list
  EXPECT_EQ(req.stack_lists_size(), 1);
  // Through the wire format, too.
  v1::EstimateRequest wire;
  ASSERT_TRUE(wire.ParseFromString(req.SerializeAsString()));
  DecodedOps d;
  ASSERT_TRUE(DecodeOps(wire, &d).ok());
  ASSERT_EQ(d.ops.size(), s.ops.size());
  EXPECT_EQ(d.ops[0].seqs.data(), d.ops[1].seqs.data());
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Op &a = s.ops[i], &b = d.ops[i];
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.stage, b.stage);
    EXPECT_EQ(std::tie(a.m, a.n, a.k, a.heads, a.kv_heads, a.d_head, a.head_begin, a.head_end,
                       a.elements, a.participants),
              std::tie(b.m, b.n, b.k, b.heads, b.kv_heads, b.d_head, b.head_begin, b.head_end,
                       b.elements, b.participants));
    EXPECT_EQ(Bits(a.bytes_per_element), Bits(b.bytes_per_element));
    EXPECT_EQ(Bits(a.flops_per_element), Bits(b.flops_per_element));
    EXPECT_EQ(Bits(a.bytes), Bits(b.bytes));
    ASSERT_EQ(a.seqs.size(), b.seqs.size());
    for (size_t j = 0; j < a.seqs.size(); ++j) {
      EXPECT_EQ(a.seqs[j].new_tokens, b.seqs[j].new_tokens);
      EXPECT_EQ(a.seqs[j].past_tokens, b.seqs[j].past_tokens);
      EXPECT_EQ(a.seqs[j].request_id, b.seqs[j].request_id);
    }
    EXPECT_EQ(std::vector<int32_t>(a.kv_head_stack.begin(), a.kv_head_stack.end()),
              std::vector<int32_t>(b.kv_head_stack.begin(), b.kv_head_stack.end()));
  }
}

TEST(AgentConvertTest, CostsAreBitExact) {
  Cost c;
  double v = 1.0 / 3.0;
  for (double Cost::*f : {&Cost::time_s, &Cost::flops, &Cost::dram_bytes, &Cost::link_bytes,
                          &Cost::compute_energy_pj, &Cost::dram_energy_pj, &Cost::link_energy_pj,
                          &Cost::bg_bus_bytes, &Cost::tsv_bytes, &Cost::external_bytes,
                          &Cost::cycles, &Cost::score_s, &Cost::softmax_s, &Cost::context_s}) {
    c.*f = v;
    v = v * 7.1e13 + 4.9e-324;  // spans magnitudes, with a subnormal step
  }
  c.cycles = -0.0;
  c.score_s = 4.9e-324;
  v1::Cost wire;
  EncodeCost(c, &wire);
  v1::Cost parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  ExpectSameBits(c, DecodeCost(parsed));
}

TEST(AgentConvertTest, TensorsAndDescriptionsRoundTrip) {
  for (auto type : {devices::ElementType::kFp16, devices::ElementType::kFp32}) {
    const devices::Tensor t = Ramp(type, {2, 3, 4}, 0.3f);
    v1::Tensor wire;
    EncodeTensor(t, &wire);
    auto back = DecodeTensor(wire, 1 << 20, "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, t.shape);
    EXPECT_EQ(back->bytes, t.bytes);
    EXPECT_EQ(back->type, t.type);
  }
  auto dev = devices::CreateDevice(AttAccSpec());
  ASSERT_TRUE(dev.ok());
  const devices::DeviceDescription d = (*dev)->Describe();
  v1::DescribeResponse wire;
  EncodeDescription(d, &wire);
  auto back = DecodeDescription(wire);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->kind, d.kind);
  EXPECT_EQ(back->preset, d.preset);
  EXPECT_EQ(back->accepts, d.accepts);
  EXPECT_EQ(Bits(back->memory_bytes), Bits(d.memory_bytes));
  ASSERT_EQ(back->parameters.size(), d.parameters.size());
  for (size_t i = 0; i < d.parameters.size(); ++i) {
    EXPECT_EQ(back->parameters[i].first, d.parameters[i].first);
    EXPECT_EQ(Bits(back->parameters[i].second), Bits(d.parameters[i].second));
  }
}

TEST(AgentConvertTest, InconsistentRequestsAreRejected) {
  DecodedOps d;
  v1::EstimateRequest req;
  req.add_ops()->set_kind(static_cast<v1::OpKind>(9));
  EXPECT_EQ(DecodeOps(req, &d).code(), absl::StatusCode::kUnimplemented);
  req.Clear();
  auto* l = req.add_seq_lists();
  l->add_new_tokens(1);
  l->add_past_tokens(-4);
  l->add_request_id(1);
  auto st = DecodeOps(req, &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "past_tokens = -4")) << st;
  l->set_past_tokens(0, 4);
  l->add_new_tokens(1);  // columns of different lengths
  EXPECT_EQ(DecodeOps(req, &d).code(), absl::StatusCode::kInvalidArgument);
  req.Clear();
  auto* op = req.add_ops();
  op->set_kind(v1::OP_KIND_ATTENTION);
  op->set_seq_list(3);
  st = DecodeOps(req, &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "ops[0].seq_list = 3")) << st;
  v1::Tensor t;
  t.set_type(v1::ELEMENT_TYPE_FP32);
  t.add_shape(2);
  t.set_data(std::string(7, '\0'));
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kInvalidArgument);
  t.set_shape(0, -1);
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kInvalidArgument);
  t.set_shape(0, int64_t{1} << 40);
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kResourceExhausted);
}

// ------------------------------------------------- service, in process ----

TEST(AgentServiceTest, RemoteEstimatesAreBitIdenticalAndMemoised) {
  for (const v1::DeviceSpec& spec : {GpuSpec(), AttAccSpec()}) {
    // The agent's own device is another preset: the client binds its spec.
    v1::DeviceSpec own = spec;
    if (own.has_gpu()) *own.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("h100-sxm-80gb");
    auto agent = StartLocal(own);
    ASSERT_NE(agent, nullptr);
    auto remote = RemoteDevice::Create(spec, {agent->address()}, FastClient(), "test device");
    ASSERT_TRUE(remote.ok()) << remote.status();
    auto local = devices::CreateDevice(spec);
    ASSERT_TRUE(local.ok());
    SampleOps s(/*gemm_and_elementwise=*/spec.has_gpu());
    std::vector<Cost> want(s.ops.size()), got(s.ops.size());
    ASSERT_TRUE((*local)->Estimate(s.ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    // Again: every op from the memo, no call.
    std::fill(got.begin(), got.end(), Cost{});
    ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    RemoteStats st = (*remote)->Stats();
    EXPECT_EQ(st.estimate_calls, 2);
    EXPECT_EQ(st.estimate_rpcs, 1);
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()));
    EXPECT_EQ(st.ops_memo_hits, static_cast<int64_t>(s.ops.size()));
    // One sequence longer: only the attention ops miss.
    s.seqs[1].past_tokens += 1;
    ASSERT_TRUE((*local)->Estimate(s.ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    st = (*remote)->Stats();
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()) + 2);
    // Describe is the bound device's.
    const devices::DeviceDescription d = (*remote)->Describe();
    const devices::DeviceDescription l = (*local)->Describe();
    EXPECT_EQ(d.parameters, l.parameters);
    EXPECT_EQ(d.kind, l.kind);
  }
}

// A run of decode iterations over an unchanged batch: every cost is the
// in-process one, bit for bit. The first call asks 8 steps ahead; a call
// within 6 steps of the prediction's end extends it by 16 asynchronously,
// so only the first call waits for the agent. A changed batch makes one
// blocking call and a new prediction. (The test waits for each extension,
// so the counts do not depend on timing.)
TEST(AgentServiceTest, LookaheadAnswersUnchangedBatchesAhead) {
  for (const v1::DeviceSpec& spec : {GpuSpec(), AttAccSpec()}) {
    auto agent = StartLocal(spec);
    ASSERT_NE(agent, nullptr);
    auto remote = RemoteDevice::Create(spec, {agent->address()}, FastClient(), "test device");
    ASSERT_TRUE(remote.ok()) << remote.status();
    auto local = devices::CreateDevice(spec);
    ASSERT_TRUE(local.ok());
    SampleOps s(/*gemm_and_elementwise=*/spec.has_gpu());
    std::vector<Cost> want(s.ops.size()), got(s.ops.size());
    auto step = [&] {
      ASSERT_TRUE((*local)->Estimate(s.ops, absl::MakeSpan(want)).ok());
      ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(got)).ok());
      (*remote)->WaitForPrefetches();
      for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
      for (AttentionSeq& q : s.seqs) q.past_tokens += 1;
    };
    // Calls 3 and 19 (steps 2 and 18) extend the horizon to 24 and 40.
    for (int i = 0; i < 30; ++i) step();
    RemoteStats st = (*remote)->Stats();
    EXPECT_EQ(st.estimate_calls, 30);
    EXPECT_EQ(st.estimate_rpcs, 3);
    EXPECT_EQ(st.prefetch_rpcs, 2);
    EXPECT_EQ(st.prefetch_failures, 0);
    // Two attention ops per step are predictable.
    EXPECT_EQ(st.predicted_ops, 2 * 40);
    // A sequence leaves: one blocking call, then an extension at step 2.
    s.seqs.pop_back();
    for (Op& op : s.ops) {
      if (op.kind == OpKind::kAttention) op.seqs = s.seqs;
    }
    for (int i = 0; i < 10; ++i) step();
    st = (*remote)->Stats();
    EXPECT_EQ(st.estimate_rpcs - st.prefetch_rpcs, 2);
    EXPECT_EQ(st.prefetch_rpcs, 3);
    EXPECT_EQ(st.predicted_ops, 2 * (40 + 24));
    // Off: one round trip per call.
    ClientOptions off = FastClient();
    off.lookahead_max = 0;
    auto plain = RemoteDevice::Create(spec, {agent->address()}, off, "test device");
    ASSERT_TRUE(plain.ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE((*plain)->Estimate(s.ops, absl::MakeSpan(got)).ok());
      for (AttentionSeq& q : s.seqs) q.past_tokens += 1;
    }
    EXPECT_EQ((*plain)->Stats().estimate_rpcs, 4);
    EXPECT_EQ((*plain)->Stats().predicted_ops, 0);
  }
}

// A FULL-fidelity device reports the mean of what it was asked, so asking
// it ahead would change its outputs: it says so (lookahead_ok false) and the
// agent answers no lookahead steps; ANALYTIC answers them.
TEST(AgentServiceTest, LookaheadOnlyWhereAnsweringAheadChangesNothing) {
  for (auto fidelity : {v1::PRUNE_FIDELITY_FULL, v1::PRUNE_FIDELITY_ANALYTIC}) {
    v1::DeviceSpec spec;
    *spec.mutable_topick()->mutable_topick() = *devices::TopickPreset("topick");
    spec.mutable_topick()->set_fidelity(fidelity);
    auto* m = spec.mutable_topick()->mutable_model();
    m->set_layers(1), m->set_heads(2), m->set_d_head(64);
    auto agent = StartLocal(spec);
    ASSERT_NE(agent, nullptr);
    std::vector<AttentionSeq> seqs{{1, 100, 7}};
    Op op;
    op.kind = OpKind::kAttention;
    op.stage = devices::Stage::kAttention;
    op.heads = 2, op.kv_heads = 2, op.d_head = 64;
    op.seqs = seqs;
    v1::EstimateRequest req;
    EncodeOps({&op, 1}, &req);
    req.set_lookahead(4);
    v1::EstimateResponse resp;
    grpc::ClientContext ctx;
    auto stub = v1::DeviceAgent::NewStub(
        grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stub->Estimate(&ctx, req, &resp).ok());
    const bool full = fidelity == v1::PRUNE_FIDELITY_FULL;
    EXPECT_EQ(resp.lookahead_answered(), full ? 0 : 4);
    EXPECT_EQ(resp.costs_size(), full ? 1 : 5);
    auto local = devices::CreateDevice(spec);
    ASSERT_TRUE(local.ok());
    EXPECT_EQ((*local)->Describe().lookahead_ok, !full);
  }
}

grpc::Status RawEstimate(const std::string& address, const v1::EstimateRequest& req,
                         const std::string& token = "") {
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::EstimateResponse resp;
  return stub->Estimate(&ctx, req, &resp);
}

TEST(AgentServiceTest, BadRequestsGetTheirStatusCodes) {
  AgentServiceOptions opts;
  opts.max_tensor_bytes = 4096;
  auto agent = StartLocal(AttAccSpec(), opts);
  ASSERT_NE(agent, nullptr);
  const std::string addr = agent->address();
  // Unknown op kind, and a kind the device does not implement.
  v1::EstimateRequest req;
  req.add_ops()->set_kind(static_cast<v1::OpKind>(42));
  grpc::Status st = RawEstimate(addr, req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  req.mutable_ops(0)->set_kind(v1::OP_KIND_ELEMENTWISE);
  st = RawEstimate(addr, req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "attacc")) << st.error_message();
  // Negative lengths.
  SampleOps s(false);
  req.Clear();
  EncodeOps(s.ops, &req);
  req.mutable_seq_lists(0)->set_past_tokens(1, -1);
  st = RawEstimate(addr, req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "past_tokens = -1")) << st.error_message();
  req.mutable_seq_lists(0)->set_past_tokens(1, 10);
  req.mutable_ops(0)->set_m(-3);
  EXPECT_EQ(RawEstimate(addr, req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The device's own check: heads not a multiple of kv_heads.
  req.mutable_ops(0)->set_m(0);
  req.mutable_ops(0)->set_kv_heads(7);
  EXPECT_EQ(RawEstimate(addr, req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Lookahead out of range, then in range: the ops' costs, then two steps
  // of the two attention ops, each the cost of the shifted op.
  req.mutable_ops(0)->set_kv_heads(96);
  req.set_lookahead(-1);
  st = RawEstimate(addr, req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "lookahead = -1; expected 0..256"))
      << st.error_message();
  req.set_lookahead(257);
  EXPECT_EQ(RawEstimate(addr, req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    v1::EstimateRequest la;
    EncodeOps(s.ops, &la);
    la.set_lookahead(2);
    v1::EstimateResponse resp;
    grpc::ClientContext ctx;
    auto stub = v1::DeviceAgent::NewStub(
        grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stub->Estimate(&ctx, la, &resp).ok());
    EXPECT_EQ(resp.lookahead_answered(), 2);
    ASSERT_EQ(resp.costs_size(), 3 + 2 * 2);
    auto dev = devices::CreateDevice(AttAccSpec());
    ASSERT_TRUE(dev.ok());
    for (int j = 1; j <= 2; ++j) {
      std::vector<AttentionSeq> later = s.seqs;
      for (AttentionSeq& q : later) q.past_tokens += j;
      std::vector<Op> ops(s.ops.begin(), s.ops.begin() + 2);
      for (Op& op : ops) op.seqs = later;
      std::vector<Cost> want(2);
      ASSERT_TRUE((*dev)->Estimate(ops, absl::MakeSpan(want)).ok());
      for (int i = 0; i < 2; ++i) {
        ExpectSameBits(want[i], DecodeCost(resp.costs(3 + 2 * (j - 1) + i)));
      }
    }
  }
  req.set_lookahead(0);
  // Unknown device key.
  req.set_device_key("0123456789abcdef");
  EXPECT_EQ(RawEstimate(addr, req).error_code(), grpc::StatusCode::NOT_FOUND);
  // A spec of another kind.
  auto stub = v1::DeviceAgent::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    v1::DescribeRequest d;
    *d.mutable_spec() = GpuSpec();
    v1::DescribeResponse r;
    st = stub->Describe(&ctx, d, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "hosts 'attacc'")) << st.error_message();
  }
  // Execute: shape mismatch, data size mismatch, tensor over the limit.
  auto execute = [&](const devices::Tensor& q, const devices::Tensor& k, const devices::Tensor& v) {
    grpc::ClientContext ctx;
    v1::ExecuteRequest e;
    EncodeTensor(q, e.mutable_q());
    EncodeTensor(k, e.mutable_k());
    EncodeTensor(v, e.mutable_v());
    v1::ExecuteResponse r;
    return stub->Execute(&ctx, e, &r);
  };
  using devices::ElementType;
  const auto q = Ramp(ElementType::kFp16, {2, 1, 8}, 0.1f);
  const auto k = Ramp(ElementType::kFp16, {2, 4, 8}, 0.2f);
  const auto v = Ramp(ElementType::kFp16, {2, 4, 8}, 0.3f);
  EXPECT_EQ(execute(q, k, Ramp(ElementType::kFp16, {2, 4, 6}, 0.3f)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  auto big = Ramp(ElementType::kFp32, {2, 64, 16}, 0.2f);  // 8 KiB > 4 KiB
  st = execute(q, big, big);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "--max-tensor-bytes")) << st.error_message();
  {
    grpc::ClientContext ctx;
    v1::ExecuteRequest e;
    EncodeTensor(q, e.mutable_q());
    EncodeTensor(k, e.mutable_k());
    EncodeTensor(v, e.mutable_v());
    e.mutable_v()->mutable_data()->pop_back();
    v1::ExecuteResponse r;
    EXPECT_EQ(stub->Execute(&ctx, e, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Sessions: unknown id, bad shapes, lost appends.
  {
    grpc::ClientContext ctx;
    v1::StepRequest sr;
    sr.set_session_id("nope");
    v1::StepResponse r;
    EXPECT_EQ(stub->Step(&ctx, sr, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest o;
    o.set_kv_heads(0);
    o.set_d_head(8);
    o.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse r;
    EXPECT_EQ(stub->OpenSession(&ctx, o, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // The agent is still serving after all that.
  req.Clear();
  EncodeOps(s.ops, &req);
  EXPECT_TRUE(RawEstimate(addr, req).ok());
}

TEST(AgentServiceTest, BearerTokenIsCheckedOnEveryCall) {
  AgentServiceOptions opts;
  opts.token = "s3cret";
  auto agent = StartLocal(GpuSpec(), opts);
  ASSERT_NE(agent, nullptr);
  v1::EstimateRequest req;
  SampleOps s;
  EncodeOps(s.ops, &req);
  EXPECT_EQ(RawEstimate(agent->address(), req).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(RawEstimate(agent->address(), req, "wrong").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(RawEstimate(agent->address(), req, "s3cret").ok());
  ClientOptions o = FastClient();
  o.token = "wrong";
  auto bad = RemoteDevice::Create(GpuSpec(), {agent->address()}, o, "gpu under test");
  ASSERT_TRUE(bad.ok());
  std::vector<Cost> c(s.ops.size());
  absl::Status st = (*bad)->Estimate(s.ops, absl::MakeSpan(c));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "gpu under test")) << st;
  o.token = "s3cret";
  auto good = RemoteDevice::Create(GpuSpec(), {agent->address()}, o, "gpu");
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)->Estimate(s.ops, absl::MakeSpan(c)).ok());
}

// Throw-away CA, server and client certificates (openssl from Debian).
bool MakeCerts(const std::string& dir) {
  const std::string cmd = absl::StrCat(
      "cd ", dir, " && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
      "-subj /CN=servesim-test-ca 2>/dev/null && ",
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "-subj /CN=localhost 2>/dev/null && ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out "
      "server.crt -days 1 -extfile san.ext 2>/dev/null && ",
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "-subj /CN=servesim-client 2>/dev/null && ",
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out "
      "client.crt -days 1 2>/dev/null && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 1 "
      "-subj /CN=other-ca 2>/dev/null");
  return std::system(cmd.c_str()) == 0;
}

TEST(AgentServiceTest, TlsWithServerAndClientCertificates) {
  const std::string dir = FreshDir();
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not found";
  ASSERT_TRUE(MakeCerts(dir));
  AgentServerOptions server;
  server.tls_cert_file = dir + "/server.crt";
  server.tls_key_file = dir + "/server.key";
  server.tls_client_ca_file = dir + "/ca.crt";
  auto agent = StartLocal(GpuSpec(), {}, server);
  ASSERT_NE(agent, nullptr);
  SampleOps s;
  std::vector<Cost> c(s.ops.size());
  ClientOptions o = FastClient();
  o.attempts_per_endpoint = 1;
  o.tls_ca_file = dir + "/ca.crt";
  o.tls_cert_file = dir + "/client.crt";
  o.tls_key_file = dir + "/client.key";
  auto good = RemoteDevice::Create(GpuSpec(), {agent->address()}, o, "gpu");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Estimate(s.ops, absl::MakeSpan(c)).ok());
  // No client certificate: the handshake fails.
  ClientOptions no_cert = o;
  no_cert.tls_cert_file.clear();
  no_cert.tls_key_file.clear();
  auto anon = RemoteDevice::Create(GpuSpec(), {agent->address()}, no_cert, "gpu");
  ASSERT_TRUE(anon.ok());
  EXPECT_FALSE((*anon)->Estimate(s.ops, absl::MakeSpan(c)).ok());
  // The server's certificate does not chain to this CA.
  ClientOptions wrong_ca = o;
  wrong_ca.tls_ca_file = dir + "/other.crt";
  auto untrusted = RemoteDevice::Create(GpuSpec(), {agent->address()}, wrong_ca, "gpu");
  ASSERT_TRUE(untrusted.ok());
  EXPECT_FALSE((*untrusted)->Estimate(s.ops, absl::MakeSpan(c)).ok());
  // Plain text to a TLS agent.
  auto plain = RemoteDevice::Create(GpuSpec(), {agent->address()}, FastClient(), "gpu");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->Estimate(s.ops, absl::MakeSpan(c)).ok());
  // Missing files are named.
  ClientOptions missing = o;
  missing.tls_ca_file = dir + "/nope.crt";
  auto m = RemoteDevice::Create(GpuSpec(), {agent->address()}, missing, "gpu");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "nope.crt")) << m.status();
}

TEST(AgentServiceTest, HealthServiceReportsServing) {
  auto agent = StartLocal(GpuSpec());
  ASSERT_NE(agent, nullptr);
  auto channel = grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  for (const std::string service : {"", "servesim.v1.DeviceAgent"}) {
    // grpc.health.v1.HealthCheckRequest{service}: field 1, length-delimited.
    std::string bytes;
    if (!service.empty()) bytes = absl::StrCat("\x0a", std::string(1, char(service.size())), service);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    grpc::ClientContext ctx;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                   [&](grpc::Status st) { done.set_value(st); });
    ASSERT_TRUE(done.get_future().get().ok());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(resp.Dump(&slices).ok());
    std::string out;
    for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
    EXPECT_EQ(out, std::string("\x08\x01", 2)) << "status SERVING for '" << service << "'";
  }
}

TEST(AgentServiceTest, SessionsMatchExecuteAndSurviveAnAgentRestart) {
  auto agent = StartLocal(GpuSpec());
  ASSERT_NE(agent, nullptr);
  const int port = agent->running.port;
  auto remote = RemoteDevice::Create(GpuSpec(), {agent->address()}, FastClient(), "gpu");
  ASSERT_TRUE(remote.ok());
  auto local = devices::CreateDevice(GpuSpec());
  ASSERT_TRUE(local.ok());
  using devices::ElementType;
  const auto k1 = Ramp(ElementType::kFp16, {2, 5, 8}, 0.2f), v1t = Ramp(ElementType::kFp16, {2, 5, 8}, 0.3f);
  const auto k2 = Ramp(ElementType::kFp16, {2, 3, 8}, 0.4f), v2t = Ramp(ElementType::kFp16, {2, 3, 8}, 0.5f);
  const auto q = Ramp(ElementType::kFp16, {4, 1, 8}, 0.7f);
  // In process, over the concatenated KV.
  devices::AttentionCall call;
  call.q = q;
  call.k = devices::Tensor::Zeros(ElementType::kFp16, {2, 8, 8});
  call.v = devices::Tensor::Zeros(ElementType::kFp16, {2, 8, 8});
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t p = 0; p < 8; ++p) {
      for (int64_t d = 0; d < 8; ++d) {
        const auto& ks = p < 5 ? k1 : k2;
        const auto& vs = p < 5 ? v1t : v2t;
        const int64_t n = p < 5 ? 5 : 3, pp = p < 5 ? p : p - 5;
        call.k.Set((h * 8 + p) * 8 + d, ks.At((h * n + pp) * 8 + d));
        call.v.Set((h * 8 + p) * 8 + d, vs.At((h * n + pp) * 8 + d));
      }
    }
  }
  auto want = (*local)->Execute(call);
  ASSERT_TRUE(want.ok()) << want.status();
  auto executed = (*remote)->Execute(call);
  ASSERT_TRUE(executed.ok()) << executed.status();
  EXPECT_EQ(executed->out.bytes, want->out.bytes);

  auto session = (*remote)->OpenSession(7, 2, 8, ElementType::kFp16);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->AppendKv(k1, v1t).ok());
  ASSERT_TRUE((*session)->AppendKv(k2, v2t).ok());
  auto got = (*session)->Step(q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->out.bytes, want->out.bytes);
  EXPECT_EQ(got->stats.kv_positions, want->stats.kv_positions);
  // The agent restarts on the same port: its sessions are gone.
  agent.reset();
  AgentServerOptions same_port;
  same_port.listen = absl::StrCat("127.0.0.1:", port);
  agent = StartLocal(GpuSpec(), {}, same_port);
  ASSERT_NE(agent, nullptr);
  got = (*session)->Step(q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->out.bytes, want->out.bytes);
  EXPECT_EQ((*remote)->Stats().session_rebuilds, 1);
  EXPECT_GE((*remote)->Stats().rebinds + (*remote)->Stats().retries, 1);
}

TEST(AgentServiceTest, LadSessionsKeepTheirStateAcrossSteps) {
  // LAD's kernel keeps its per-head state (counters, modes, centres,
  // caches A-F) in the agent between a session's steps: a session that
  // appends one K/V row and steps, 20 times, answers what an in-process LAD
  // device gives for the same session, bit for bit; the history matters (a
  // stateless call answers differently at some step).
  v1::DeviceSpec spec;
  *spec.mutable_lad()->mutable_lad() = *devices::LadPreset("lad_1.5");
  spec.mutable_lad()->set_fidelity(v1::PRUNE_FIDELITY_ANALYTIC);
  auto agent = StartLocal(spec);
  ASSERT_NE(agent, nullptr);
  auto remote = RemoteDevice::Create(spec, {agent->address()}, FastClient(), "lad");
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = devices::CreateDevice(spec);
  ASSERT_TRUE(local.ok());
  devices::AttentionDataParams p;
  p.d_head = 32;
  auto gen = devices::AttentionDataGenerator::Create(p);
  ASSERT_TRUE(gen.ok());
  using devices::ElementType;
  auto session = (*remote)->OpenSession(3, 1, 32, ElementType::kFp32);
  ASSERT_TRUE(session.ok()) << session.status();
  const int64_t l0 = 60;
  int differs = 0;
  for (int64_t l = l0; l < l0 + 20; ++l) {
    auto call = gen->DecodeStep({0, 0, 0}, l);
    ASSERT_TRUE(call.ok());
    // The rows the session does not hold yet.
    const int64_t from = l == l0 ? 0 : l - 1;
    devices::Tensor k = devices::Tensor::Zeros(ElementType::kFp32, {1, l - from, 32});
    devices::Tensor v = devices::Tensor::Zeros(ElementType::kFp32, {1, l - from, 32});
    for (int64_t i = 0; i < (l - from) * 32; ++i) {
      k.Set(i, call->k.At(from * 32 + i));
      v.Set(i, call->v.At(from * 32 + i));
    }
    ASSERT_TRUE((*session)->AppendKv(k, v).ok());
    auto got = (*session)->Step(call->q);
    ASSERT_TRUE(got.ok()) << got.status();
    auto stateless = (*local)->Execute(*call);
    call->session = 1;
    auto want = (*local)->Execute(*call);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(stateless.ok());
    EXPECT_EQ(got->out.bytes, want->out.bytes) << l;
    differs += stateless->out.bytes != want->out.bytes ? 1 : 0;
  }
  EXPECT_GT(differs, 0);
}

TEST(AgentServiceTest, FailsOverAndNamesTheEndpointsWhenNoneIsLeft) {
  auto a = StartLocal(GpuSpec());
  auto b = StartLocal(GpuSpec());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string addr_a = a->address(), addr_b = b->address();
  auto remote = RemoteDevice::Create(GpuSpec(), {addr_a, addr_b}, FastClient(), "xPU device (gpu)");
  ASSERT_TRUE(remote.ok());
  auto local = devices::CreateDevice(GpuSpec());
  SampleOps s;
  std::vector<Cost> want(s.ops.size()), got(s.ops.size());
  for (int i = 0; i < 4; ++i) {  // round-robin: both agents answer
    s.seqs[0].past_tokens = 100 + i;
    ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(got)).ok());
  }
  EXPECT_GE(a->service->calls(), 2);
  EXPECT_GE(b->service->calls(), 2);
  a.reset();  // agent A goes away
  for (int i = 0; i < 4; ++i) {
    s.seqs[0].past_tokens = 200 + i;
    ASSERT_TRUE((*local)->Estimate(s.ops, absl::MakeSpan(want)).ok());
    absl::Status st = (*remote)->Estimate(s.ops, absl::MakeSpan(got));
    ASSERT_TRUE(st.ok()) << st;
    for (size_t j = 0; j < want.size(); ++j) ExpectSameBits(want[j], got[j]);
  }
  EXPECT_GE((*remote)->Stats().failovers, 1);
  b.reset();
  s.seqs[0].past_tokens = 300;
  absl::Status st = (*remote)->Estimate(s.ops, absl::MakeSpan(got));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(st.message(), "xPU device (gpu)")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), addr_a)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), addr_b)) << st;
}

// ---------------------------------------------------- real processes ----

using servesim::cluster::ShellQuote;

struct Proc {
  pid_t pid = -1;
  std::string address;  // agents: where they listen
  std::string log;
};

// Starts servesim-agent on a free loopback port; waits for its address.
Proc StartAgent(const std::string& dir, const std::string& kind,
                const std::vector<std::string>& extra = {}) {
  static int n = 0;
  Proc p;
  p.log = absl::StrCat(dir, "/agent", n++, ".log");
  // Created here, before the child runs: a loaded machine may poll it
  // before the child gets to open it.
  ::close(::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  p.pid = fork();
  if (p.pid == 0) {
    const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    dup2(fd, 1);
    std::vector<std::string> args = {SERVESIM_AGENT_BINARY, "--device", kind, "--listen",
                                     "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 300 && p.address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string log = ReadFile(p.log);
    const size_t at = log.find(" on ");
    const size_t end = log.find('\n', at == std::string::npos ? 0 : at);
    if (at != std::string::npos && end != std::string::npos) {
      p.address = log.substr(at + 4, std::min(end, log.find(' ', at + 4)) - at - 4);
    }
  }
  EXPECT_FALSE(p.address.empty()) << ReadFile(p.log);
  return p;
}

int Stop(Proc& p, int sig) {
  if (p.pid <= 0) return -1;
  kill(p.pid, sig);
  int status = 0;
  waitpid(p.pid, &status, 0);
  p.pid = -1;
  return status;
}

struct Agents {
  std::vector<Proc> procs;
  ~Agents() {
    for (Proc& p : procs) Stop(p, SIGKILL);
  }
  std::string List(size_t from, size_t to) const {
    std::vector<std::string> a;
    for (size_t i = from; i < to; ++i) a.push_back(procs[i].address);
    return absl::StrJoin(a, ",");
  }
};

struct Result {
  int code = -1;
  std::string out;
};

Result RunServesim(const std::vector<std::string>& args) {
  std::string cmd = ShellQuote(SERVESIM_BINARY);
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", ShellQuote(a));
  absl::StrAppend(&cmd, " 2>&1");
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void ExpectSameOutputs(const std::string& a, const std::string& b) {
  for (const char* f : {"summary.json", "requests.csv", "iterations.csv"}) {
    const std::string fa = ReadFile(a + "/" + f);
    EXPECT_FALSE(fa.empty()) << a << "/" << f;
    EXPECT_TRUE(fa == ReadFile(b + "/" + f)) << f << " differs: " << a << " vs " << b;
  }
}

std::string SmallGpuScenario(const std::string& dir, const std::string& cluster_extra = "",
                             const std::string& name = "gpu.pbtxt") {
  const std::string path = dir + "/" + name;
  WriteFile(path, absl::StrCat(
                      "name: \"agents\"\n"
                      "model { preset: \"llama2-7b\" }\n"
                      "cluster { replicas: 2 xpu { preset: \"a100-80gb\" } ",
                      cluster_extra, " }\n"
                      "workload {\n  poisson { rate_rps: 20 }\n  num_requests: 200\n"
                      "  lengths { sampled_from: \"",
                      SERVESIM_SOURCE_DIR,
                      "/examples/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv\" }\n}\n"
                      "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL }\n"));
  return path;
}

constexpr char kAttAccExample[] =
    SERVESIM_SOURCE_DIR "/examples/attacc/gpt3_175b_dgx_attacc_azure_conv.pbtxt";

TEST(AgentEndToEndTest, GpuOutputsAreByteIdenticalWithOneAndTwoAgents) {
  const std::string dir = FreshDir();
  const std::string sc = SmallGpuScenario(dir);
  Agents ag;
  for (int i = 0; i < 2; ++i) ag.procs.push_back(StartAgent(dir, "gpu"));
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/one", "--agent", "gpu=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/two", "--agent", "gpu=" + ag.List(0, 2)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  ExpectSameOutputs(dir + "/in", dir + "/two");
  const std::string info = ReadFile(dir + "/two/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "\"device\": \"xPU device (gpu)\"")) << info;
  EXPECT_TRUE(absl::StrContains(info, "\"memo_hits\": ")) << info;
  EXPECT_FALSE(absl::StrContains(info, "\"memo_hits\": 0,")) << info;
  EXPECT_FALSE(absl::StrContains(ReadFile(dir + "/in/run_info.json"), "agents"));
  // The scenario can name the endpoints itself.
  SmallGpuScenario(dir, absl::StrCat("xpu_endpoints: \"", ag.procs[1].address, "\""),
                   "named.pbtxt");
  const Result named = RunServesim({"run", dir + "/named.pbtxt", "--quiet", "--out", dir + "/named"});
  ASSERT_EQ(named.code, 0) << named.out;
  ExpectSameOutputs(dir + "/in", dir + "/named");
  // Flags name what is wrong.
  Result bad = RunServesim({"run", sc, "--agent", "tpu=127.0.0.1:1"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "unknown device kind 'tpu'")) << bad.out;
  bad = RunServesim({"run", sc, "--agent", "gpu=localhost"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "HOST:PORT")) << bad.out;
  bad = RunServesim({"run", sc, "--agent", "attacc=127.0.0.1:5"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(absl::StrContains(bad.out, "the scenario has no attacc device")) << bad.out;
}

TEST(AgentEndToEndTest, AttAccOutputsAreByteIdenticalWithOneAndTwoAgentsPerKind) {
  const std::string dir = FreshDir();
  Agents ag;
  for (const char* kind : {"gpu", "gpu", "attacc", "attacc"}) ag.procs.push_back(StartAgent(dir, kind));
  const std::vector<std::string> base = {"run", kAttAccExample, "--quiet", "--set",
                                         "workload.window_end_s=300"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunServesim(a);
  };
  const Result in = with({"--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one = with({"--out", dir + "/one", "--agent", "attacc=" + ag.List(2, 3)});
  ASSERT_EQ(one.code, 0) << one.out;
  const Result two = with({"--out", dir + "/two", "--agent", "gpu=" + ag.List(0, 2), "--agent",
                           "attacc=" + ag.List(2, 4)});
  ASSERT_EQ(two.code, 0) << two.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  ExpectSameOutputs(dir + "/in", dir + "/two");
  const std::string info = ReadFile(dir + "/two/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (attacc)")) << info;
}

TEST(AgentEndToEndTest, CtaPoolOutputsAreByteIdenticalOnAnAgent) {
  // GPT-2 medium + one CTA unit in FULL fidelity: the agent binds the
  // scenario's spec and re-hashes each request's tokens itself.
  const std::string dir = FreshDir();
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "cta"));
  const std::string scenario = dir + "/s.pbtxt";
  WriteFile(scenario,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool {\n"
            "  cta { fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 256 } } units: 1 } }\n"
            "workload { saturated { num_requests: 3 input_tokens: 120 output_tokens: 8 } }\n");
  const Result in = RunServesim({"run", scenario, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one = RunServesim(
      {"run", scenario, "--quiet", "--out", dir + "/one", "--agent", "cta=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  const std::string info = ReadFile(dir + "/one/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (cta)")) << info;
}

TEST(AgentEndToEndTest, LadFullPoolKeepsItsStateInTheAgent) {
  // A FULL-fidelity LAD pool of 2 units on one agent: the per-request LAD
  // state (counters, modes, centres, caches A-F of every head) lives in the
  // agent's bound device between decode steps, and the outputs are the
  // in-process run's byte for byte.
  const std::string dir = FreshDir();
  const std::string sc = dir + "/lad.pbtxt";
  WriteFile(sc,
            "model { preset: \"gpt2-medium\" }\n"
            "cluster { xpu { preset: \"a100-80gb\" } attention_pool { units: 2 lad {\n"
            "  fidelity: PRUNE_FIDELITY_FULL calibration { lengths: 128 lengths: 256 instances: 2 }\n"
            "} } }\n"
            "workload { saturated { num_requests: 3 input_tokens: 150 output_tokens: 12 } }\n");
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "lad"));
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const Result one =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/one", "--agent", "lad=" + ag.List(0, 1)});
  ASSERT_EQ(one.code, 0) << one.out;
  ExpectSameOutputs(dir + "/in", dir + "/one");
  const std::string info = ReadFile(dir + "/one/run_info.json");
  EXPECT_TRUE(absl::StrContains(info, "attention device (lad)")) << info;
  EXPECT_TRUE(absl::StrContains(ReadFile(dir + "/one/summary.json"), "\"active_fraction\": "));
}

double SimulatedSeconds(const std::string& summary) {
  const std::string key = "\"simulated_time_s\": ";
  const size_t at = summary.find(key);
  double v = 0;
  if (at != std::string::npos) {
    (void)absl::SimpleAtod(summary.substr(at + key.size(), summary.find_first_of(",\n", at + key.size()) - at - key.size()), &v);
  }
  return v;
}

TEST(AgentEndToEndTest, KilledAgentFailsOverOrStopsWithPartialResults) {
  const std::string dir = FreshDir();
  const std::string sc = SmallGpuScenario(dir);
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  const double simulated = SimulatedSeconds(ReadFile(dir + "/in/summary.json"));
  ASSERT_GT(simulated, 0);
  // Paced to take ~3 wall seconds (pacing never changes results); the agent
  // is killed after 1 s.
  const std::string pace = absl::StrCat(simulated / 3.0);
  {
    Agents ag;
    ag.procs.push_back(StartAgent(dir, "gpu"));
    ag.procs.push_back(StartAgent(dir, "gpu"));
    auto run = std::async(std::launch::async, [&] {
      return RunServesim({"run", sc, "--quiet", "--out", dir + "/failover", "--pace", pace,
                          "--agent", "gpu=" + ag.List(0, 2)});
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    Stop(ag.procs[0], SIGKILL);
    const Result r = run.get();
    ASSERT_EQ(r.code, 0) << r.out;
    ExpectSameOutputs(dir + "/in", dir + "/failover");
    const std::string info = ReadFile(dir + "/failover/run_info.json");
    EXPECT_FALSE(absl::StrContains(info, "\"failovers\": 0,")) << info;
  }
  {
    Agents ag;
    ag.procs.push_back(StartAgent(dir, "gpu"));
    const std::string addr = ag.procs[0].address;
    auto run = std::async(std::launch::async, [&] {
      return RunServesim({"run", sc, "--quiet", "--out", dir + "/lost", "--pace", pace,
                          "--agent", "gpu=" + addr, "--agent-deadline", "2"});
    });
    std::this_thread::sleep_for(std::chrono::seconds(1));
    Stop(ag.procs[0], SIGKILL);
    const Result r = run.get();
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "xPU device (gpu)")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, addr)) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "no agent endpoint left")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "partial results")) << r.out;
    const std::string summary = ReadFile(dir + "/lost/summary.json");
    EXPECT_TRUE(absl::StartsWith(summary, "{\n  \"partial\": true,")) << summary;
    const double stopped_at = SimulatedSeconds(summary);
    EXPECT_GT(stopped_at, 0);
    EXPECT_LT(stopped_at, simulated);
    const std::string info = ReadFile(dir + "/lost/run_info.json");
    EXPECT_TRUE(absl::StrContains(info, "\"partial\": true")) << info;
    EXPECT_TRUE(absl::StrContains(info, addr)) << info;
    EXPECT_FALSE(absl::StrContains(ReadFile(dir + "/in/summary.json"), "partial"));
  }
}

TEST(AgentEndToEndTest, AgentTokenTlsAndGracefulShutdown) {
  const std::string dir = FreshDir();
  const std::string sc = SmallGpuScenario(dir);
  const Result in = RunServesim({"run", sc, "--quiet", "--out", dir + "/in"});
  ASSERT_EQ(in.code, 0) << in.out;
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not found";
  ASSERT_TRUE(MakeCerts(dir));
  WriteFile(dir + "/token", "tok-123\n");
  WriteFile(dir + "/wrong", "tok-999\n");
  Agents ag;
  ag.procs.push_back(StartAgent(dir, "gpu", {"--tls-cert", dir + "/server.crt", "--tls-key",
                                              dir + "/server.key", "--tls-client-ca",
                                              dir + "/ca.crt", "--token-file", dir + "/token"}));
  const std::vector<std::string> tls = {"--agent-tls-ca", dir + "/ca.crt", "--agent-tls-cert",
                                        dir + "/client.crt", "--agent-tls-key",
                                        dir + "/client.key"};
  std::vector<std::string> args = {"run", sc, "--quiet", "--out", dir + "/tls", "--agent",
                                   "gpu=" + ag.procs[0].address, "--agent-token-file",
                                   dir + "/token"};
  args.insert(args.end(), tls.begin(), tls.end());
  const Result ok = RunServesim(args);
  ASSERT_EQ(ok.code, 0) << ok.out;
  ExpectSameOutputs(dir + "/in", dir + "/tls");
  args[8] = dir + "/wrong";
  args[4] = dir + "/wrong_out";
  const Result wrong = RunServesim(args);
  EXPECT_EQ(wrong.code, 1);
  EXPECT_TRUE(absl::StrContains(wrong.out, "wrong bearer token")) << wrong.out;
  // SIGTERM: a clean stop.
  const int status = Stop(ag.procs[0], SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(absl::StrContains(ReadFile(ag.procs[0].log), "stopped after")) << ReadFile(ag.procs[0].log);
}

TEST(AgentEndToEndTest, AgentCommandLineErrors) {
  auto run = [](const std::string& args) {
    Result r;
    FILE* pipe = popen((ShellQuote(SERVESIM_AGENT_BINARY) + " " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
    const int status = pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--tls-client-ca")) << r.out;
  r = run("--preset a100-80gb");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.out, "--device KIND is required")) << r.out;
  r = run("--device tpu");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(absl::StrContains(r.out, "unknown kind")) << r.out;
  r = run("--device gpu --preset nope");
  EXPECT_EQ(r.code, 1);
  r = run("--device gpu --listen 127.0.0.1:99999");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(absl::StrContains(r.out, "[0, 65535]")) << r.out;
  r = run("--device gpu --max-message-bytes 5");
  EXPECT_EQ(r.code, 2);
}

// ------------------------------------------------------------- limits ----
// What one request may ask of an agent (agents/convert.h kMax*, and
// AgentServiceOptions): each limit exactly at and one past its value,
// called on the service directly, as gRPC would after decoding.

std::unique_ptr<AgentService> DirectService(AgentServiceOptions opts = {}) {
  opts.spec = GpuSpec();
  auto svc = AgentService::Create(opts);
  EXPECT_TRUE(svc.ok()) << svc.status();
  return svc.ok() ? std::move(*svc) : nullptr;
}

// One decode attention op over `seqs` sequences of `past` cached tokens.
v1::EstimateRequest DecodeAttention(int64_t seqs, int64_t past) {
  v1::EstimateRequest req;
  v1::SeqList* l = req.add_seq_lists();
  for (int64_t s = 0; s < seqs; ++s) {
    l->add_new_tokens(1);
    l->add_past_tokens(past);
    l->add_request_id(s);
  }
  v1::Op* op = req.add_ops();
  op->set_kind(v1::OP_KIND_ATTENTION);
  op->set_stage(v1::STAGE_ATTENTION);
  op->set_heads(12);
  op->set_kv_heads(12);
  op->set_d_head(128);
  op->set_seq_list(0);
  op->set_head_end(-1);
  op->set_stack_list(-1);
  return req;
}

grpc::Status DirectEstimate(AgentService* svc, const v1::EstimateRequest& req,
                            v1::EstimateResponse* resp) {
  grpc::ServerContext ctx;
  return svc->Estimate(&ctx, &req, resp);
}

TEST(AgentLimitsTest, ContextLengthIsCheckedAtItsLimit) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  v1::EstimateResponse resp;
  // new_tokens 1 + past_tokens 4,194,303 = kMaxContextTokens: accepted.
  grpc::Status st = DirectEstimate(svc.get(), DecodeAttention(1, (1 << 22) - 1), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.costs_size(), 1);
  st = DirectEstimate(svc.get(), DecodeAttention(1, 1 << 22), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "seq_lists[0] sequence 0: new_tokens = 1, past_tokens = 4194304; expected "
            "new_tokens >= 1, past_tokens >= 0 and new_tokens + past_tokens <= 4194304");
  // A new_tokens near INT64_MAX would have overflowed the GPU model's
  // query-block loop.
  v1::EstimateRequest huge = DecodeAttention(1, 0);
  huge.mutable_seq_lists(0)->set_new_tokens(0, int64_t{1} << 62);
  st = DirectEstimate(svc.get(), huge, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentLimitsTest, SequencesNamedByAllOpsAreBounded) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  // 4,096 ops naming one list of 1,024 sequences: 2^22 = kMaxOpSequences.
  v1::EstimateRequest req = DecodeAttention(1024, 100);
  for (int i = 1; i < 4096; ++i) *req.add_ops() = req.ops(0);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.costs_size(), 4096);
  *req.add_ops() = req.ops(0);
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(st.error_message(),
                               "ops[4096]: the attention ops up to this one name 4195328 "
                               "sequences with 4195328 new tokens in all; expected at most "
                               "4194304 sequences"))
      << st.error_message();
}

TEST(AgentLimitsTest, LookaheadStopsAtTheSequenceBudget) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  // 2^16 decode sequences: 2^22 / 2^16 = 64 steps fit; 256 were asked.
  v1::EstimateRequest req = DecodeAttention(1 << 16, 10);
  req.set_lookahead(256);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.lookahead_answered(), 64);
  EXPECT_EQ(resp.costs_size(), 1 + 64);
  // A small batch gets every step it asks for.
  req = DecodeAttention(4, 10);
  req.set_lookahead(256);
  st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.lookahead_answered(), 256);
}

TEST(AgentLimitsTest, NonFiniteAndHugeOpFiguresAreRefused) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  v1::EstimateRequest req;
  v1::Op* e = req.add_ops();
  e->set_kind(v1::OP_KIND_ELEMENTWISE);
  e->set_elements(1000);
  e->set_bytes_per_element(std::nan(""));
  e->set_seq_list(-1);
  e->set_stack_list(-1);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(),
                                "expected bytes_per_element and flops_per_element 0..1e+06"))
      << st.error_message();
  e->set_bytes_per_element(1e6);  // at the limit
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  v1::Op* g = req.add_ops();
  g->set_kind(v1::OP_KIND_GEMM);
  g->set_m((int64_t{1} << 40) + 1);
  g->set_n(1);
  g->set_k(1);
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(st.error_message(), "ops[1]: m = 1099511627777")) << st.error_message();
}

TEST(AgentLimitsTest, ExecuteWorkAndEmptyTensorExtentsAreBounded) {
  AgentServiceOptions opts;
  opts.max_tensor_bytes = 4096;
  opts.max_execute_macs = 1000;
  auto svc = DirectService(opts);
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  auto execute = [&](std::vector<int64_t> q_shape, int64_t kv_len) {
    v1::ExecuteRequest req;
    EncodeTensor(Ramp(ElementType::kFp16, q_shape, 0.1f), req.mutable_q());
    EncodeTensor(Ramp(ElementType::kFp16, {2, kv_len, 8}, 0.2f), req.mutable_k());
    EncodeTensor(Ramp(ElementType::kFp16, {2, kv_len, 8}, 0.3f), req.mutable_v());
    grpc::ServerContext ctx;
    v1::ExecuteResponse resp;
    return svc->Execute(&ctx, &req, &resp);
  };
  // 2 heads x 1 query x 62 positions x 8 = 992 MACs: run; 64 positions: 1,024.
  grpc::Status st = execute({2, 1, 8}, 62);
  EXPECT_TRUE(st.ok()) << st.error_message();
  st = execute({2, 1, 8}, 64);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "q, k: heads x q_len x kv_len x d_head = 1024 multiply-accumulates; this agent "
            "runs at most 1000 per call");
  // An empty q of shape [2^40, 0, 8] holds no bytes, but kernels would loop
  // over its 2^40 heads.
  v1::ExecuteRequest req;
  req.mutable_q()->set_type(v1::ELEMENT_TYPE_FP16);
  for (int64_t d : {int64_t{1} << 40, int64_t{0}, int64_t{8}}) req.mutable_q()->add_shape(d);
  EncodeTensor(Ramp(ElementType::kFp16, {2, 4, 8}, 0.2f), req.mutable_k());
  EncodeTensor(Ramp(ElementType::kFp16, {2, 4, 8}, 0.3f), req.mutable_v());
  grpc::ServerContext ctx;
  v1::ExecuteResponse resp;
  st = svc->Execute(&ctx, &req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StartsWith(st.error_message(), "q: 17592186044416 bytes by its shape"))
      << st.error_message();
}

// All sessions' K and V together are held to max_kv_bytes: an append that
// would pass it is refused with the figures, and closing a session gives its
// bytes back.
TEST(AgentLimitsTest, SessionShapeIsAModelShape) {
  auto svc = DirectService(AgentServiceOptions{});
  ASSERT_NE(svc, nullptr);
  auto open = [&](int64_t kv_heads, int64_t d_head) {
    grpc::ServerContext ctx;
    v1::OpenSessionRequest o;
    o.set_kv_heads(kv_heads);
    o.set_d_head(d_head);
    o.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse r;
    return svc->OpenSession(&ctx, &o, &r);
  };
  EXPECT_TRUE(open(4096, 4096).ok());
  // 2^40 KV heads once made the session's per-head lists throw on resize.
  const grpc::Status huge = open(int64_t{1} << 40, 8);
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(huge.error_message(),
            "kv_heads = 1099511627776, d_head = 8; expected both in [1, 4096]");
  EXPECT_EQ(open(2, 4097).error_message(), "kv_heads = 2, d_head = 4097; expected both in [1, 4096]");
  EXPECT_EQ(open(0, 8).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentLimitsTest, SessionsShareOneKvBudget) {
  AgentServiceOptions opts;
  opts.max_tensor_bytes = 4096;
  opts.max_kv_bytes = 3000;
  auto svc = DirectService(opts);
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  auto open = [&]() {
    grpc::ServerContext ctx;
    v1::OpenSessionRequest o;
    o.set_kv_heads(2);
    o.set_d_head(8);
    o.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse r;
    EXPECT_TRUE(svc->OpenSession(&ctx, &o, &r).ok());
    return r.session_id();
  };
  // 2 KV heads x 32 positions x 8 fp16 = 1,024 bytes of K, as many of V.
  auto append = [&](const std::string& id, int64_t expected_len) {
    grpc::ServerContext ctx;
    v1::AppendKvRequest a;
    a.set_session_id(id);
    a.set_expected_kv_len(expected_len);
    EncodeTensor(Ramp(ElementType::kFp16, {2, 32, 8}, 0.2f), a.mutable_k());
    EncodeTensor(Ramp(ElementType::kFp16, {2, 32, 8}, 0.3f), a.mutable_v());
    v1::AppendKvResponse r;
    return svc->AppendKv(&ctx, &a, &r);
  };
  const std::string first = open(), second = open();
  ASSERT_TRUE(append(first, 0).ok());
  grpc::Status st = append(second, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "this agent's sessions hold 2048 bytes of K and V; 2048 more would pass its budget "
            "of 3000 bytes (servesim-agent --max-kv-bytes); close sessions first");
  // The refused append left the second session empty, and the first's own
  // next append is refused the same way (4,096 > 3,000).
  EXPECT_EQ(append(first, 32).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  {
    grpc::ServerContext ctx;
    v1::CloseSessionRequest c;
    c.set_session_id(first);
    v1::CloseSessionResponse r;
    ASSERT_TRUE(svc->CloseSession(&ctx, &c, &r).ok());
  }
  st = append(second, 0);
  EXPECT_TRUE(st.ok()) << st.error_message();
  AgentServiceOptions bad;
  bad.spec = GpuSpec();
  bad.max_kv_bytes = 0;
  EXPECT_EQ(AgentService::Create(bad).status().message(), "max_kv_bytes = 0; expected >= 1");
}

TEST(AgentLimitsTest, NonFiniteTensorElementsAreRefused) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    for (ElementType type : {ElementType::kFp16, ElementType::kFp32}) {
      auto k = Ramp(type, {2, 4, 8}, 0.2f);
      k.Set(3, bad);
      v1::ExecuteRequest req;
      EncodeTensor(Ramp(type, {2, 1, 8}, 0.1f), req.mutable_q());
      EncodeTensor(k, req.mutable_k());
      EncodeTensor(Ramp(type, {2, 4, 8}, 0.3f), req.mutable_v());
      grpc::ServerContext ctx;
      v1::ExecuteResponse resp;
      const grpc::Status st = svc->Execute(&ctx, &req, &resp);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(st.error_message(), "k.data: element 3 is NaN or infinite; expected finite values");
    }
  }
}

TEST(AgentLimitsTest, PresetSpecsAreTheAgentsDefaults) {
  for (const char* kind : {"gpu", "attacc", "topick", "spatten", "lad", "cta"}) {
    auto spec = AgentPresetSpec(kind, "");
    ASSERT_TRUE(spec.ok()) << kind << ": " << spec.status();
    EXPECT_EQ(SpecKindName(*spec), kind);
    EXPECT_TRUE(devices::CreateDevice(*spec).ok()) << kind;
  }
  auto bad = AgentPresetSpec("tpu", "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--device tpu: unknown kind; registered: "))
      << bad.status();
}

}  // namespace
}  // namespace servesim::agents
