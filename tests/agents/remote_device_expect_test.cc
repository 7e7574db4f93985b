// RemoteDevice's hints against agents in this process: expected ops
// (Expect, ExpectLater) answered ahead and riding along, prepared ops
// (Prepare) asked at once, and the agent's answer to expected ops it cannot
// cost or must not answer ahead.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/registry.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
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
using test::CostsOf;
using test::DecodeSteps;
using test::ExpectSameBits;
using test::FastClient;
using test::GpuSpec;
using test::SampleOps;
using test::SmallTopick;
using test::SmallTopickOp;
using test::StartLocal;
using test::StartWithClient;

// Expected ops (Device::Expect) ride along with the next call that misses,
// or go at once when every op of a call hits; the steps they cover then
// make no round trip, and every cost is the in-process one, bit for bit.
// Hints stop the client's own lookahead. (Waits for each asynchronous call,
// so the counts do not depend on timing.)
TEST(AgentServiceTest, ExpectedOpsAreAnsweredAheadAndRideAlong) {
  for (const v1::DeviceSpec& spec : {GpuSpec(), AttAccSpec()}) {
    AgentAndClient t = StartWithClient(spec);
    ASSERT_TRUE(t.ok());
    const RemoteDevice* remote = t.remote.get();
    const devices::Device* local = t.local.get();
    EXPECT_EQ(remote->ExpectSteps(), RemoteDevice::kExpectSteps);
    // Step j of a batch whose third sequence leaves after step 2.
    DecodeSteps batch(/*gemm_and_elementwise=*/spec.has_gpu(), /*leaves_after=*/2);
    const SampleOps& s = batch.s;
    auto step_ops = [&](int j) { return batch.Ops(j); };
    auto check = [&](const std::vector<Op>& ops) { DecodeSteps::Check(local, remote, ops); };
    // Steps 1..4 expected before step 0 is asked: they ride along with it.
    std::vector<Op> ahead;
    for (int j = 1; j <= 4; ++j) {
      const std::vector<Op> ops = step_ops(j);
      ahead.insert(ahead.end(), ops.begin(), ops.end());
    }
    remote->Expect(ahead, {});
    check(step_ops(0));
    RemoteStats st = remote->Stats();
    EXPECT_EQ(st.estimate_rpcs, 1);
    // The other ops repeat step 0's and were asked with it.
    EXPECT_EQ(st.expected_ops, 2 * 4);
    for (int j = 1; j <= 4; ++j) check(step_ops(j));
    st = remote->Stats();
    EXPECT_EQ(st.estimate_rpcs, 1);
    EXPECT_EQ(st.predicted_ops, 0);  // no lookahead of its own
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()));
    // Steps 5 and 6 expected while every op hits: sent at once, async.
    std::vector<Op> more = step_ops(5);
    const std::vector<Op> six = step_ops(6);
    more.insert(more.end(), six.begin(), six.end());
    remote->Expect(more, {});
    check(step_ops(4));
    check(step_ops(5));
    check(step_ops(6));
    st = remote->Stats();
    EXPECT_EQ(st.estimate_rpcs, 2);
    EXPECT_EQ(st.prefetch_rpcs, 1);
    EXPECT_EQ(st.expected_ops, 2 * 6);
    EXPECT_EQ(st.prefetch_failures, 0);
    // A hint already answered is not sent again.
    remote->Expect(more, {});
    check(step_ops(6));
    EXPECT_EQ(remote->Stats().estimate_rpcs, 2);
    // A step past the hints asks the agent.
    check(step_ops(7));
    EXPECT_EQ(remote->Stats().estimate_rpcs, 3);
    // Step 8 told with its next 5 steps: one op each, the steps derived.
    const std::vector<Op> eight = step_ops(8);
    std::vector<int32_t> steps;
    for (const Op& op : eight) steps.push_back(op.kind == OpKind::kAttention ? 5 : 0);
    remote->Expect(eight, steps);
    check(step_ops(7));  // every op hits: the hint goes now
    for (int j = 8; j <= 13; ++j) check(step_ops(j));
    st = remote->Stats();
    EXPECT_EQ(st.estimate_rpcs, 4);
    EXPECT_EQ(st.prefetch_rpcs, 2);
    EXPECT_EQ(st.expected_ops, 2 * 6 + 2 * 6);
    EXPECT_EQ(st.prefetch_failures, 0);
  }
}

// Ops expected later (Device::ExpectLater: an arriving request's prefill)
// never make a round trip of their own: a call whose ops all hit sends
// nothing for them, and they go with the next call that goes anyway (one
// that misses, or Expect's hints made due); then they are answered from the
// memo, bit for bit the in-process costs.
TEST(AgentServiceTest, OpsExpectedLaterRideAlongAndMakeNoCallOfTheirOwn) {
  for (const v1::DeviceSpec& spec : {GpuSpec(), AttAccSpec()}) {
    AgentAndClient t = StartWithClient(spec);
    ASSERT_TRUE(t.ok());
    const RemoteDevice* remote = t.remote.get();
    const devices::Device* local = t.local.get();
    DecodeSteps batch(/*gemm_and_elementwise=*/spec.has_gpu(), /*leaves_after=*/-1);
    const SampleOps& s = batch.s;
    auto step_ops = [&](int j) { return batch.Ops(j); };
    auto check = [&](const std::vector<Op>& ops) { DecodeSteps::Check(local, remote, ops); };
    // Told before the first call, which misses: they go with it.
    remote->ExpectLater(step_ops(3));
    check(step_ops(0));
    check(step_ops(3));
    EXPECT_EQ(remote->Stats().estimate_rpcs, 1);
    // Told while every op hits: nothing goes until a hint is due.
    remote->ExpectLater(step_ops(5));
    check(step_ops(3));
    EXPECT_EQ(remote->Stats().estimate_rpcs, 1);
    remote->Expect(step_ops(1), {});
    check(step_ops(3));  // every op hits: the due hint goes, step 5 with it
    check(step_ops(1));
    check(step_ops(5));
    const RemoteStats st = remote->Stats();
    EXPECT_EQ(st.estimate_rpcs, 2);
    EXPECT_EQ(st.prefetch_rpcs, 1);
    EXPECT_EQ(st.predicted_ops, 0);  // told: no lookahead of its own
    EXPECT_EQ(st.ops_memo_misses, static_cast<int64_t>(s.ops.size()));  // step 0's
    EXPECT_EQ(st.prefetch_failures, 0);
  }
}

// Prepare sends the ops the memo lacks at once, asynchronously; the
// Estimate that follows takes them from that answer (no round trip of its
// own) with the in-process device's costs. Ops answered or in flight are
// not sent again, and a device that must not be asked ahead (FULL
// fidelity) prepares nothing.
TEST(AgentServiceTest, PreparedOpsAreAskedAtOnceAndAnswerTheNextEstimate) {
  const v1::DeviceSpec spec = AttAccSpec();
  AgentAndClient t = StartWithClient(spec);
  ASSERT_TRUE(t.ok());
  const RemoteDevice* remote = t.remote.get();
  const devices::Device* local = t.local.get();
  EXPECT_TRUE(remote->Remote());
  EXPECT_FALSE(local->Remote());
  SampleOps s(/*gemm_and_elementwise=*/false);
  auto estimate = [&](const std::vector<Op>& ops) {
    std::vector<Cost> want(ops.size()), got(ops.size());
    ASSERT_TRUE(local->Estimate(ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
  };
  // Unbound, it cannot be sent: the Estimate asks (and binds) itself.
  remote->Prepare(s.ops);
  EXPECT_EQ(remote->Stats().prepare_rpcs, 0);
  estimate(s.ops);
  EXPECT_EQ(remote->Stats().estimate_rpcs, 1);
  EXPECT_EQ(remote->ExpectSteps(), RemoteDevice::kExpectSteps);  // learns lookahead_ok
  // Bound: the next step's ops go now; the Estimate waits for them.
  std::vector<AttentionSeq> later = s.seqs;
  for (AttentionSeq& q : later) q.past_tokens += 100;
  std::vector<Op> next = s.ops;
  for (Op& op : next) {
    if (op.kind == OpKind::kAttention) op.seqs = later;
  }
  remote->Prepare(next);
  RemoteStats st = remote->Stats();
  EXPECT_EQ(st.prepare_rpcs, 1);
  EXPECT_EQ(st.prepared_ops, 2);  // the head groups' attention ops; the GEMM hits
  EXPECT_EQ(st.estimate_rpcs, 2);
  estimate(next);
  st = remote->Stats();
  EXPECT_EQ(st.estimate_rpcs, 2);  // the prepared call only
  EXPECT_EQ(st.prefetch_failures, 0);
  // Answered already: nothing sent.
  remote->Prepare(next);
  EXPECT_EQ(remote->Stats().prepare_rpcs, 1);
  // FULL fidelity: nothing prepared, the Estimate asks as before.
  const v1::DeviceSpec full = SmallTopick(v1::PRUNE_FIDELITY_FULL);
  auto topick = StartLocal(full);
  ASSERT_NE(topick, nullptr);
  auto full_remote = RemoteDevice::Create(full, {topick->address()}, FastClient(), "test device");
  ASSERT_TRUE(full_remote.ok());
  std::vector<AttentionSeq> seqs{{1, 100, 7}};
  const std::vector<Op> one = {SmallTopickOp(seqs)};
  std::vector<Cost> c(1);
  ASSERT_TRUE((*full_remote)->Estimate(one, absl::MakeSpan(c)).ok());
  EXPECT_EQ((*full_remote)->ExpectSteps(), 0);
  seqs[0].past_tokens = 101;
  const std::vector<Op> two = {SmallTopickOp(seqs)};
  (*full_remote)->Prepare(two);
  EXPECT_EQ((*full_remote)->Stats().prepare_rpcs, 0);
  ASSERT_TRUE((*full_remote)->Estimate(two, absl::MakeSpan(c)).ok());
  EXPECT_EQ((*full_remote)->Stats().estimate_rpcs, 2);
}

// The agent answers expected ops after the asked ones and stops at the first
// it cannot cost, without failing the call; devices that must not be asked
// ahead answer none, and their clients take no hints.
TEST(AgentServiceTest, ExpectedOpsStopAtTheFirstRefusedAndOnlyWhereAskingAheadIsSafe) {
  auto agent = StartLocal(AttAccSpec());
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  SampleOps s(/*gemm_and_elementwise=*/false);
  Op reduce;  // AttAcc does not accept all-reduces
  reduce.kind = OpKind::kAllReduce;
  reduce.stage = devices::Stage::kAllReduce;
  reduce.bytes = 1e6, reduce.participants = 8;
  std::vector<Op> ops = {s.ops[0], s.ops[1], reduce, s.ops[2]};
  auto ask = [&](int expected, v1::EstimateResponse* resp) {
    v1::EstimateRequest req;
    EncodeOps(ops, &req);
    req.set_expected(expected);
    grpc::ClientContext ctx;
    return stub->Estimate(&ctx, req, resp);
  };
  v1::EstimateResponse resp;
  auto local_device = [] { return devices::CreateDevice(AttAccSpec()); };
  // ops[1..3] expected: ops[1] answered, the all-reduce ends the answer.
  ASSERT_TRUE(ask(3, &resp).ok());
  EXPECT_EQ(resp.expected_answered(), 1);
  EXPECT_EQ(CostsOf(resp).size(), 2u);
  // Expected with steps: ops[1] and its next 3 steps, by blocks.
  {
    v1::EstimateRequest req;
    EncodeOps(absl::MakeConstSpan(ops).first(2), &req);
    req.set_expected(1);
    req.add_expected_steps(3);
    v1::EstimateResponse r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Estimate(&ctx, req, &r).ok());
    EXPECT_EQ(r.expected_answered(), 1);
    ASSERT_EQ(CostsOf(r).size(), size_t{1 + 1 + 3});
    std::vector<AttentionSeq> later = s.seqs;
    for (int j = 0; j <= 3; ++j) {
      Op op = s.ops[1];
      op.seqs = later;
      Cost c;
      ASSERT_TRUE((*local_device())->Estimate({&op, 1}, absl::MakeSpan(&c, 1)).ok());
      ExpectSameBits(c, CostsOf(r)[1 + j]);
      for (AttentionSeq& q : later) q.past_tokens += 1;
    }
    req.set_expected_steps(0, 257);
    grpc::ClientContext ctx2;
    grpc::Status st = stub->Estimate(&ctx2, req, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "expected_steps[0] = 257"))
        << st.error_message();
  }
  auto local = devices::CreateDevice(AttAccSpec());
  ASSERT_TRUE(local.ok());
  std::vector<Cost> want(2);
  ASSERT_TRUE((*local)->Estimate(absl::MakeConstSpan(ops).first(2), absl::MakeSpan(want)).ok());
  for (int i = 0; i < 2; ++i) ExpectSameBits(want[i], CostsOf(resp)[i]);
  // Asked, the all-reduce fails the call as before.
  EXPECT_EQ(ask(1, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  for (int bad : {-1, 5}) {
    grpc::Status st = ask(bad, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_TRUE(absl::StrContains(st.error_message(), "expected = ")) << st.error_message();
  }
  // FULL-fidelity ToPick: none answered, and its client wants no hints.
  const v1::DeviceSpec full = SmallTopick(v1::PRUNE_FIDELITY_FULL);
  auto topick = StartLocal(full);
  ASSERT_NE(topick, nullptr);
  std::vector<AttentionSeq> seqs{{1, 100, 7}};
  const Op op = SmallTopickOp(seqs);
  const Op two[2] = {op, op};
  v1::EstimateRequest req;
  EncodeOps(two, &req);
  req.set_expected(1);
  grpc::ClientContext ctx;
  auto topick_stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(topick->address(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(topick_stub->Estimate(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.expected_answered(), 0);
  EXPECT_EQ(CostsOf(resp).size(), 1u);
  auto remote = RemoteDevice::Create(full, {topick->address()}, FastClient(), "test device");
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ((*remote)->ExpectSteps(), 0);
}

}  // namespace
}  // namespace servesim::agents
