// RemoteDevice against agents in this process: its memo and lookahead
// (bit-identical costs, fewer round trips), runs of steps, lists and shapes
// told apart, binding every endpoint at once, refusing an agent of another
// protocol, fail-over.
#include "agents/remote_device.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/agents/agent_test_util.h"

namespace servesim::agents {
namespace {

namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;
using test::AgentAndClient;
using test::AttAccSpec;
using test::Bits;
using test::CostsOf;
using test::ExpectSameBits;
using test::FastClient;
using test::GpuSpec;
using test::LocalAgent;
using test::SampleOps;
using test::SmallTopick;
using test::SmallTopickOp;
using test::StartLocal;
using test::StartWithClient;

TEST(AgentServiceTest, RemoteEstimatesAreBitIdenticalAndMemoised) {
  for (const v1::DeviceSpec& spec : {GpuSpec(), AttAccSpec()}) {
    // The agent's own device is another preset: the client binds its spec.
    v1::DeviceSpec own = spec;
    if (own.has_gpu()) *own.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("h100-sxm-80gb");
    AgentAndClient t = StartWithClient(spec, &own);
    ASSERT_TRUE(t.ok());
    const RemoteDevice* remote = t.remote.get();
    const devices::Device* local = t.local.get();
    SampleOps s(/*gemm_and_elementwise=*/spec.has_gpu());
    std::vector<Cost> want(s.ops.size()), got(s.ops.size());
    ASSERT_TRUE(local->Estimate(s.ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    // Again: every op from the memo, no call.
    std::fill(got.begin(), got.end(), Cost{});
    ASSERT_TRUE(remote->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    RemoteStats st = remote->Stats();
    EXPECT_EQ(st.estimate_calls, 2);
    EXPECT_EQ(st.estimate_rpcs, 1);
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()));
    EXPECT_EQ(st.ops_memo_hits, static_cast<int64_t>(s.ops.size()));
    // One sequence longer: only the attention ops miss.
    s.seqs[1].past_tokens += 1;
    ASSERT_TRUE(local->Estimate(s.ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
    st = remote->Stats();
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()) + 2);
    // Describe is the bound device's.
    const devices::DeviceDescription d = remote->Describe();
    const devices::DeviceDescription l = local->Describe();
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
    AgentAndClient t = StartWithClient(spec);
    ASSERT_TRUE(t.ok());
    const LocalAgent* agent = t.agent.get();
    const RemoteDevice* remote = t.remote.get();
    const devices::Device* local = t.local.get();
    SampleOps s(/*gemm_and_elementwise=*/spec.has_gpu());
    std::vector<Cost> want(s.ops.size()), got(s.ops.size());
    auto step = [&] {
      ASSERT_TRUE(local->Estimate(s.ops, absl::MakeSpan(want)).ok());
      ASSERT_TRUE(remote->Estimate(s.ops, absl::MakeSpan(got)).ok());
      remote->WaitForPrefetches();
      for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
      for (AttentionSeq& q : s.seqs) q.past_tokens += 1;
    };
    // Calls 3 and 19 (steps 2 and 18) extend the horizon to 24 and 40.
    for (int i = 0; i < 30; ++i) step();
    RemoteStats st = remote->Stats();
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
    st = remote->Stats();
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
    const v1::DeviceSpec spec = SmallTopick(fidelity);
    auto agent = StartLocal(spec);
    ASSERT_NE(agent, nullptr);
    std::vector<AttentionSeq> seqs{{1, 100, 7}};
    const Op op = SmallTopickOp(seqs);
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
    EXPECT_EQ(CostsOf(resp).size(), full ? 1u : 5u);
    auto local = devices::CreateDevice(spec);
    ASSERT_TRUE(local.ok());
    EXPECT_EQ((*local)->Describe().lookahead_ok, !full);
  }
}

// An expected op's further steps are kept as one run (its sequence list
// relative to its first sequence, and the first's length): each of its
// steps is answered with no round trip, and nothing else is: not a step
// past it, not the same lengths for another request, not a batch whose
// sequences did not all move together.
// The client finds recent lists and shapes by comparing them with an op's
// own: ops whose stack lists, sequence lists or shapes agree in length, ends
// and the fields that pick a slot but differ inside are still told apart.
TEST(AgentServiceTest, ListsAndShapesThatDifferOnlyInsideAreToldApart) {
  AgentAndClient t = StartWithClient(AttAccSpec());
  ASSERT_TRUE(t.ok());
  Op base;
  base.kind = OpKind::kAttention;
  base.stage = devices::Stage::kAttention;
  base.heads = 96, base.kv_heads = 96, base.d_head = 128;
  base.head_begin = 0, base.head_end = 96;
  const std::vector<AttentionSeq> seq_list = {{1, 100, 7}, {1, 2047, 8}, {1, 5, 9}};
  std::vector<AttentionSeq> shorter = seq_list;  // the middle sequence shorter
  shorter[1].past_tokens = 1000;
  std::vector<int32_t> stack_list;  // (sequence, KV head) -> stack
  for (int i = 0; i < 3 * 96; ++i) stack_list.push_back(i % 40);
  std::vector<int32_t> crowded = stack_list;  // stack 0 holds the long sequence
  for (int i = 96; i < 2 * 96; ++i) crowded[i] = 0;
  base.seqs = seq_list;
  base.kv_head_stack = stack_list;
  Op stacks = base;
  stacks.kv_head_stack = crowded;
  Op seqs = base;
  seqs.seqs = shorter;
  Op shape = base;  // smaller heads
  shape.d_head = 64;
  std::vector<Cost> first(1);
  ASSERT_TRUE(t.local->Estimate({base}, absl::MakeSpan(first)).ok());
  for (int round = 0; round < 2; ++round) {
    for (const auto& [name, op] : {std::pair<const char*, const Op*>{"base", &base},
                                   {"stacks", &stacks},
                                   {"seqs", &seqs},
                                   {"shape", &shape}}) {
      SCOPED_TRACE(name);
      std::vector<Cost> want(1), got(1);
      ASSERT_TRUE(t.local->Estimate({*op}, absl::MakeSpan(want)).ok());
      ASSERT_TRUE(t.remote->Estimate({*op}, absl::MakeSpan(got)).ok());
      ExpectSameBits(want[0], got[0]);
      if (op != &base) {  // else the case would prove nothing
        EXPECT_TRUE(Bits(want[0].time_s) != Bits(first[0].time_s) ||
                    Bits(want[0].tsv_bytes) != Bits(first[0].tsv_bytes) ||
                    Bits(want[0].cycles) != Bits(first[0].cycles));
      }
    }
  }
  // Each asked once; the second round came from the memo.
  EXPECT_EQ(t.remote->Stats().ops_memo_misses, 4);
}

TEST(AgentServiceTest, ARunAnswersItsStepsAndOnlyThem) {
  AgentAndClient t = StartWithClient(AttAccSpec());
  ASSERT_TRUE(t.ok());
  const RemoteDevice* remote = t.remote.get();
  SampleOps s(/*gemm_and_elementwise=*/false);
  std::deque<std::vector<AttentionSeq>> lists;
  auto shifted = [&](const std::vector<AttentionSeq>& seqs) {
    std::vector<Op> ops = s.ops;
    for (Op& op : ops) {
      if (op.kind == OpKind::kAttention) op.seqs = lists.emplace_back(seqs);
    }
    return ops;
  };
  auto step_ops = [&](int j) {
    std::vector<AttentionSeq> seqs = s.seqs;
    for (AttentionSeq& q : seqs) q.past_tokens += j;
    return shifted(seqs);
  };
  auto check = [&](const std::vector<Op>& ops) {
    std::vector<Cost> want(ops.size()), got(ops.size());
    ASSERT_TRUE(t.local->Estimate(ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(ops, absl::MakeSpan(got)).ok());
    remote->WaitForPrefetches();
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
  };
  // Step 1 expected with its next 6 steps; step 0 asks and carries them.
  const std::vector<Op> one = step_ops(1);
  std::vector<int32_t> steps;
  for (const Op& op : one) steps.push_back(op.kind == OpKind::kAttention ? 6 : 0);
  remote->Expect(one, steps);
  check(step_ops(0));
  EXPECT_EQ(remote->Stats().estimate_rpcs, 1);
  for (int j = 1; j <= 7; ++j) check(step_ops(j));
  RemoteStats st = remote->Stats();
  EXPECT_EQ(st.estimate_rpcs, 1);
  // Step 1's attention ops and their next 6 steps (its GEMM is step 0's,
  // asked anyway).
  EXPECT_EQ(st.expected_ops, 2 + 2 * 6);
  EXPECT_EQ(st.expected_hits, 2 * 7);
  check(step_ops(8));  // past the run
  EXPECT_EQ(remote->Stats().estimate_rpcs, 2);
  std::vector<AttentionSeq> other = s.seqs;  // step 3's lengths, another request
  for (AttentionSeq& q : other) q.past_tokens += 3;
  other[1].request_id = 9;
  check(shifted(other));
  EXPECT_EQ(remote->Stats().estimate_rpcs, 3);
  std::vector<AttentionSeq> apart = s.seqs;  // step 3, but the first sequence at step 4
  for (AttentionSeq& q : apart) q.past_tokens += 3;
  apart[0].past_tokens += 1;
  check(shifted(apart));
  EXPECT_EQ(remote->Stats().estimate_rpcs, 4);
}

// A device with several endpoints binds them all at its first call, at
// once: binding may build and calibrate the device on each agent, which
// would otherwise start on the second only when it is first asked.
TEST(AgentServiceTest, EveryEndpointIsBoundAtTheFirstCall) {
  const v1::DeviceSpec spec = GpuSpec();
  auto a = StartLocal(spec);
  auto b = StartLocal(spec);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  {
    auto remote =
        RemoteDevice::Create(spec, {a->address(), b->address()}, FastClient(), "test device");
    ASSERT_TRUE(remote.ok());
    SampleOps s;
    std::vector<Cost> c(s.ops.size());
    ASSERT_TRUE((*remote)->Estimate(s.ops, absl::MakeSpan(c)).ok());
    (*remote)->WaitForBinds();  // the destructor would cancel one still in flight
  }
  // The call went to the first (bound, described, asked); the second was
  // bound though it was never asked.
  EXPECT_GE(a->service->calls(), 2);
  EXPECT_EQ(b->service->calls(), 1);
}

// An agent of protocol 1, which sent each cost as a message of its own: a
// client of protocol 2 would read its answers as no costs at all.
class Protocol1Agent final : public v1::DeviceAgent::Service {
 public:
  grpc::Status Describe(grpc::ServerContext*, const v1::DescribeRequest*,
                        v1::DescribeResponse* resp) override {
    ++describes;
    resp->set_kind("gpu");
    resp->set_model_version("servesim 0.1.0; servesim.v1.DeviceAgent/1");
    return grpc::Status::OK;
  }
  std::atomic<int> describes{0};
};

TEST(AgentServiceTest, AnAgentOfAnotherProtocolIsRefusedByNameWithoutRetries) {
  EXPECT_STREQ(kAgentProtocolVersion, "servesim.v1.DeviceAgent/4");
  Protocol1Agent old;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&old);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto remote = RemoteDevice::Create(GpuSpec(), {address}, FastClient(), "xPU device (gpu)");
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::string want =
      absl::StrCat("xPU device (gpu): agent ", address,
                   ": Describe: the agent speaks \"servesim 0.1.0; servesim.v1.DeviceAgent/1\" "
                   "and this client servesim.v1.DeviceAgent/4: run servesim-agent of the same "
                   "servesim version");
  const auto described = (*remote)->DescribeOrError();
  EXPECT_EQ(described.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(described.status().message(), want);
  SampleOps s;
  std::vector<Cost> costs(s.ops.size());
  const absl::Status estimated = (*remote)->Estimate(s.ops, absl::MakeSpan(costs));
  EXPECT_EQ(estimated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(estimated.message(), "servesim.v1.DeviceAgent/1")) << estimated;
  EXPECT_EQ((*remote)->Stats().retries, 0);
  EXPECT_EQ(old.describes.load(), 2);  // one bind per call, neither retried
  server->Shutdown();
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

}  // namespace
}  // namespace servesim::agents
