// Device agents: the DeviceAgent service and RemoteDevice in process (bad
// requests, token, TLS, memo and lookahead, sessions, fail-over).
#include "agents/agent_service.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
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
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "studies/sweep.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_AGENT_BINARY
#error "SERVESIM_AGENT_BINARY must name the servesim-agent executable"
#endif
#include "tests/agents/agent_test_util.h"

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
using test::AgentAndClient;
using test::AttAccSpec;
using test::Bits;
using test::CostsOf;
using test::ExpectSameBits;
using test::FastClient;
using test::FreshDir;
using test::GpuSpec;
using test::LocalAgent;
using test::MakeCerts;
using test::Ramp;
using test::SampleOps;
using test::StartLocal;
using test::StartWithClient;
using test_util::ReadFile;
using test_util::WriteFile;

// ------------------------------------------------- service, in process ----

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

// A one-layer, two-head ToPick of the given fidelity, and one decode
// attention op over its heads.
v1::DeviceSpec SmallTopick(v1::PruneFidelity fidelity) {
  v1::DeviceSpec spec;
  *spec.mutable_topick()->mutable_topick() = *devices::TopickPreset("topick");
  spec.mutable_topick()->set_fidelity(fidelity);
  auto* m = spec.mutable_topick()->mutable_model();
  m->set_layers(1), m->set_heads(2), m->set_d_head(64);
  return spec;
}

Op SmallTopickOp(absl::Span<const AttentionSeq> seqs) {
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = devices::Stage::kAttention;
  op.heads = 2, op.kv_heads = 2, op.d_head = 64;
  op.seqs = seqs;
  return op;
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

// Decode step j of SampleOps' batch (every past_tokens + j; the last
// sequence leaves after step `leaves_after`, -1: never), and a check of a
// remote device's costs for a step against the in-process device's, bit for
// bit (waiting for each asynchronous call, so counts do not depend on
// timing).
struct DecodeSteps {
  DecodeSteps(bool gemm_and_elementwise, int leaves_after)
      : s(gemm_and_elementwise), leaves_after(leaves_after) {}
  std::vector<Op> Ops(int j) {
    std::vector<AttentionSeq>& seqs = lists.emplace_back(s.seqs);
    if (leaves_after >= 0 && j > leaves_after) seqs.pop_back();
    for (AttentionSeq& q : seqs) q.past_tokens += j;
    std::vector<Op> ops = s.ops;
    for (Op& op : ops) {
      if (op.kind == OpKind::kAttention) op.seqs = seqs;
    }
    return ops;
  }
  static void Check(const devices::Device* local, const RemoteDevice* remote,
                    const std::vector<Op>& ops) {
    std::vector<Cost> want(ops.size()), got(ops.size());
    ASSERT_TRUE(local->Estimate(ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(ops, absl::MakeSpan(got)).ok());
    remote->WaitForPrefetches();
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
  }
  SampleOps s;
  int leaves_after;
  std::deque<std::vector<AttentionSeq>> lists;  // the ops' sequence lists
};

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
    ASSERT_EQ(CostsOf(resp).size(), size_t{3 + 2 * 2});
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
        ExpectSameBits(want[i], CostsOf(resp)[3 + 2 * (j - 1) + i]);
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

TEST(AgentServiceTest, MeasureRefusesBadStepsAndDevicesThatDoNotMeasure) {
  auto agent = StartLocal(AttAccSpec());
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  auto measure = [&](const v1::MeasureRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::MeasureResponse resp;
    return stub->Measure(&ctx, req, &resp);
  };
  v1::MeasureRequest req;
  v1::StepKey* k = req.add_steps();
  k->set_request_id(1);
  k->set_l(100);
  grpc::Status st = measure(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "attacc device: Measure"))
      << st.error_message();
  // Measuring ahead: whole steps only, and only where the device can.
  req.set_ahead(true);
  st = measure(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "attacc device: MeasureAhead needs spatten"))
      << st.error_message();
  req.set_parts(2);
  st = measure(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "ahead: measures whole steps"))
      << st.error_message();
  req.set_parts(0);
  req.set_ahead(false);
  k->set_request_id(-2);
  st = measure(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "steps[0] is (request_id -2"))
      << st.error_message();
  k->set_request_id(1);
  k->set_l(kMaxContextTokens + 1);
  EXPECT_EQ(measure(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  k->set_l(100);
  while (req.steps_size() <= kMaxMeasureSteps) *req.add_steps() = *k;
  st = measure(req);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "at most 65536")) << st.error_message();
  // Measurements sent to Estimate are checked before anything is costed.
  SampleOps s(false);
  v1::EstimateRequest est;
  EncodeOps(s.ops, &est);
  v1::StepMeasurement* m = est.add_measured();
  m->mutable_step()->set_request_id(1);
  m->mutable_step()->set_l(100);
  m->add_values(std::numeric_limits<double>::infinity());
  st = RawEstimate(agent->address(), est);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "measured[0].values[0] is not finite"))
      << st.error_message();
  m->set_values(0, 0.5);
  st = RawEstimate(agent->address(), est);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
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

TEST(AgentServiceTest, TlsWithServerAndClientCertificates) {
  const std::string dir = FreshDir();
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not found";
  ASSERT_TRUE(MakeCerts(dir));
  auto agent = StartLocal(GpuSpec(), {}, test::MutualTlsServer(dir));
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
  const absl::Status anon_st = (*anon)->Estimate(s.ops, absl::MakeSpan(c));
  EXPECT_EQ(anon_st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(anon_st.message(), "--agent-tls-cert and --agent-tls-key"))
      << anon_st;
  // The server's certificate does not chain to this CA.
  ClientOptions wrong_ca = o;
  wrong_ca.tls_ca_file = dir + "/other.crt";
  auto untrusted = RemoteDevice::Create(GpuSpec(), {agent->address()}, wrong_ca, "gpu");
  ASSERT_TRUE(untrusted.ok());
  const absl::Status untrusted_st = (*untrusted)->Estimate(s.ops, absl::MakeSpan(c));
  EXPECT_EQ(untrusted_st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(untrusted_st.message(), "does not chain to --agent-tls-ca"))
      << untrusted_st;
  // Plain text to a TLS agent.
  auto plain = RemoteDevice::Create(GpuSpec(), {agent->address()}, FastClient(), "gpu");
  ASSERT_TRUE(plain.ok());
  const absl::Status plain_st = (*plain)->Estimate(s.ops, absl::MakeSpan(c));
  EXPECT_EQ(plain_st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(plain_st.message(), "probably serves TLS (give --agent-tls-ca)"))
      << plain_st;
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

// The rest of the health protocol: a name the agent does not serve is
// NOT_FOUND to Check and SERVICE_UNKNOWN to Watch; a Watch hears SERVING,
// then NOT_SERVING when the agent shuts down, and ends.
TEST(AgentServiceTest, HealthServiceAnswersUnknownNamesAndWatchesUntilShutdown) {
  auto agent = StartLocal(GpuSpec());
  ASSERT_NE(agent, nullptr);
  auto channel = grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  req.set_service("servesim.v1.Nothing");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub->Watch(&ctx, req);
    ASSERT_TRUE(reader->Read(&resp));
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN);
    EXPECT_FALSE(reader->Read(&resp));
    EXPECT_TRUE(reader->Finish().ok());
  }
  req.set_service("servesim.v1.DeviceAgent");
  grpc::ClientContext ctx;
  auto reader = stub->Watch(&ctx, req);
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  agent->running.health->Shutdown();
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_TRUE(reader->Finish().ok());
  grpc::ClientContext after;
  req.set_service("");
  ASSERT_TRUE(stub->Check(&after, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
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

// ------------------------------------------------- sessions and kernels ----

std::unique_ptr<v1::DeviceAgent::Stub> TlsStub(const std::string& address, const std::string& dir,
                                               const std::string& client) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(dir + "/ca.crt");
  ssl.pem_cert_chain = ReadFile(dir + "/" + client + ".crt");
  ssl.pem_private_key = ReadFile(dir + "/" + client + ".key");
  return v1::DeviceAgent::NewStub(grpc::CreateChannel(address, grpc::SslCredentials(ssl)));
}

grpc::StatusCode Open(v1::DeviceAgent::Stub* stub, std::string* id) {
  grpc::ClientContext ctx;
  v1::OpenSessionRequest req;
  req.set_kv_heads(1);
  req.set_d_head(8);
  req.set_type(v1::ELEMENT_TYPE_FP16);
  v1::OpenSessionResponse resp;
  const grpc::Status st = stub->OpenSession(&ctx, req, &resp);
  *id = resp.session_id();
  return st.error_code();
}

grpc::Status Append(v1::DeviceAgent::Stub* stub, const std::string& id, int64_t expected) {
  grpc::ClientContext ctx;
  v1::AppendKvRequest req;
  req.set_session_id(id);
  EncodeTensor(Ramp(devices::ElementType::kFp16, {1, 2, 8}, 0.1f), req.mutable_k());
  EncodeTensor(Ramp(devices::ElementType::kFp16, {1, 2, 8}, 0.2f), req.mutable_v());
  req.set_expected_kv_len(expected);
  v1::AppendKvResponse resp;
  return stub->AppendKv(&ctx, req, &resp);
}

grpc::Status Close(v1::DeviceAgent::Stub* stub, const std::string& id) {
  grpc::ClientContext ctx;
  v1::CloseSessionRequest req;
  req.set_session_id(id);
  v1::CloseSessionResponse resp;
  return stub->CloseSession(&ctx, req, &resp);
}

TEST(AgentServiceTest, SessionIdsAreRandomAndBelongToTheCallerThatOpenedThem) {
  const std::string dir = FreshDir();
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not found";
  ASSERT_TRUE(MakeCerts(dir));
  auto agent = StartLocal(GpuSpec(), {}, test::MutualTlsServer(dir));
  ASSERT_NE(agent, nullptr);
  auto alice = TlsStub(agent->address(), dir, "client");
  auto bob = TlsStub(agent->address(), dir, "client2");
  std::string a1, a2;
  ASSERT_EQ(Open(alice.get(), &a1), grpc::StatusCode::OK);
  ASSERT_EQ(Open(alice.get(), &a2), grpc::StatusCode::OK);
  // 128 random bits, in hex: nothing to count up from.
  for (const std::string& id : {a1, a2}) {
    EXPECT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
  EXPECT_NE(a1, a2);
  // Another client (another certificate) can neither use nor close them.
  EXPECT_EQ(Append(bob.get(), a1, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Close(bob.get(), a1).error_code(), grpc::StatusCode::NOT_FOUND);
  const grpc::Status mine = Append(alice.get(), a1, 0);
  EXPECT_TRUE(mine.ok()) << mine.error_message();
  EXPECT_TRUE(Close(alice.get(), a1).ok());
  EXPECT_EQ(Close(alice.get(), a1).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(AgentServiceTest, SessionQuotaPerCallerAndIdleSessionsExpire) {
  AgentServiceOptions opts;
  opts.max_sessions_per_client = 2;
  opts.session_idle_s = 0.5;
  auto agent = StartLocal(GpuSpec(), opts);
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  std::string s1, s2, s3;
  ASSERT_EQ(Open(stub.get(), &s1), grpc::StatusCode::OK);
  ASSERT_EQ(Open(stub.get(), &s2), grpc::StatusCode::OK);
  EXPECT_EQ(Open(stub.get(), &s3), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Close(stub.get(), s1).ok());
  EXPECT_EQ(Open(stub.get(), &s3), grpc::StatusCode::OK);
  // Unused for more than 0.5 s (swept at most once a second): gone, and
  // the caller's quota with them.
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  const grpc::Status expired = Append(stub.get(), s2, 0);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(absl::StrContains(expired.error_message(), "idle")) << expired.error_message();
  std::string s4, s5;
  EXPECT_EQ(Open(stub.get(), &s4), grpc::StatusCode::OK);
  EXPECT_EQ(Open(stub.get(), &s5), grpc::StatusCode::OK);
  EXPECT_TRUE(Close(stub.get(), s4).ok());
  EXPECT_TRUE(Close(stub.get(), s5).ok());
  // A RemoteSession whose session expired rebuilds it from its history.
  auto remote = RemoteDevice::Create(GpuSpec(), {agent->address()}, FastClient(), "gpu");
  ASSERT_TRUE(remote.ok());
  using devices::ElementType;
  auto session = (*remote)->OpenSession(1, 1, 8, ElementType::kFp16);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)
                  ->AppendKv(Ramp(ElementType::kFp16, {1, 4, 8}, 0.3f),
                             Ramp(ElementType::kFp16, {1, 4, 8}, 0.4f))
                  .ok());
  const auto q = Ramp(ElementType::kFp16, {2, 1, 8}, 0.5f);
  auto first = (*session)->Step(q);
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  auto again = (*session)->Step(q);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->out.bytes, first->out.bytes);
  EXPECT_EQ((*remote)->Stats().session_rebuilds, 1);
}

// EstimateStream answers each request as Estimate does, in order, bit for
// bit; a request Estimate refuses ends the stream with that status.
TEST(AgentServiceTest, EstimateStreamAnswersAsEstimateInOrder) {
  auto agent = StartLocal(AttAccSpec());
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  std::vector<v1::EstimateRequest> reqs(3);
  for (int i = 0; i < 3; ++i) {
    SampleOps s(false);
    s.seqs[1].past_tokens += 100 * i;
    EncodeOps(s.ops, &reqs[i]);
    reqs[i].set_lookahead(i);  // and lookahead steps too
  }
  grpc::ClientContext ctx;
  auto rw = stub->EstimateStream(&ctx);
  for (const v1::EstimateRequest& r : reqs) ASSERT_TRUE(rw->Write(r));
  for (const v1::EstimateRequest& r : reqs) {
    v1::EstimateResponse streamed, unary;
    ASSERT_TRUE(rw->Read(&streamed));
    grpc::ClientContext one;
    ASSERT_TRUE(stub->Estimate(&one, r, &unary).ok());
    EXPECT_EQ(streamed.SerializeAsString(), unary.SerializeAsString());
    EXPECT_GT(streamed.cost_table().fields_size(), 0);
  }
  // A negative length: INVALID_ARGUMENT, as Estimate says, and the end.
  v1::EstimateRequest bad = reqs[0];
  bad.mutable_seq_lists(0)->set_past_tokens(1, -1);
  ASSERT_TRUE(rw->Write(bad));
  v1::EstimateResponse none;
  EXPECT_FALSE(rw->Read(&none));
  const grpc::Status st = rw->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "past_tokens = -1")) << st.error_message();
}

// Streams served by several stream threads (each taking the streams its
// queue was given): four streams open at once, their requests interleaved,
// are each answered in order as Estimate answers; an agent asked for no
// stream thread, or more than 64, does not start.
TEST(AgentServiceTest, EstimateStreamsOnSeveralStreamThreadsAnswerEachInOrder) {
  AgentServerOptions server;
  server.stream_threads = 3;
  auto agent = StartLocal(AttAccSpec(), {}, server);
  ASSERT_NE(agent, nullptr);
  EXPECT_EQ(agent->running.stream_threads.size(), 3u);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  constexpr int kStreams = 4, kAsks = 5;
  std::vector<v1::EstimateRequest> reqs(kStreams * kAsks);
  std::vector<v1::EstimateResponse> want(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    SampleOps s(false);
    s.seqs[0].past_tokens += 37 * static_cast<int64_t>(i);
    EncodeOps(s.ops, &reqs[i]);
    reqs[i].set_lookahead(static_cast<int>(i % 3));
    grpc::ClientContext one;
    ASSERT_TRUE(stub->Estimate(&one, reqs[i], &want[i]).ok());
  }
  std::vector<grpc::ClientContext> ctx(kStreams);
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::EstimateRequest, v1::EstimateResponse>>>
      rw;
  for (int k = 0; k < kStreams; ++k) {
    ctx[k].set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    rw.push_back(stub->EstimateStream(&ctx[k]));
  }
  for (int a = 0; a < kAsks; ++a) {
    for (int k = 0; k < kStreams; ++k) ASSERT_TRUE(rw[k]->Write(reqs[k * kAsks + a]));
  }
  for (int k = 0; k < kStreams; ++k) {
    for (int a = 0; a < kAsks; ++a) {
      v1::EstimateResponse got;
      ASSERT_TRUE(rw[k]->Read(&got)) << k << " " << a;
      EXPECT_EQ(got.SerializeAsString(), want[k * kAsks + a].SerializeAsString()) << k << " " << a;
    }
    rw[k]->WritesDone();
    EXPECT_TRUE(rw[k]->Finish().ok());
  }
  for (int threads : {0, 65}) {
    AgentServiceOptions opts;
    opts.spec = AttAccSpec();
    auto svc = AgentService::Create(opts);
    ASSERT_TRUE(svc.ok());
    AgentServerOptions bad;
    bad.stream_threads = threads;
    auto refused = StartAgentServer(svc->get(), bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "stream threads; expected"))
        << refused.status();
  }
}

// A caller gets a few streams, and one that brings nothing is ended; the
// agent then serves streams and calls as before.
TEST(AgentServiceTest, EstimateStreamsAreCappedPerCallerAndEndWhenIdle) {
  AgentServiceOptions opts;
  opts.estimate_streams_per_client = 2;
  opts.estimate_stream_idle_s = 0.5;
  auto agent = StartLocal(GpuSpec(), opts);
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  v1::EstimateRequest req;
  EncodeOps(SampleOps(true).ops, &req);
  auto ask = [&](grpc::ClientReaderWriter<v1::EstimateRequest, v1::EstimateResponse>* rw) {
    v1::EstimateResponse resp;
    return rw->Write(req) && rw->Read(&resp) && resp.cost_table().fields_size() > 0;
  };
  grpc::ClientContext c1, c2, c3;
  // A deadline, so that a stream never ended fails the test, not hangs it.
  for (grpc::ClientContext* c : {&c1, &c2}) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }
  auto s1 = stub->EstimateStream(&c1);
  auto s2 = stub->EstimateStream(&c2);
  EXPECT_TRUE(ask(s1.get()));
  EXPECT_TRUE(ask(s2.get()));
  auto s3 = stub->EstimateStream(&c3);
  v1::EstimateResponse none;
  s3->Write(req);
  EXPECT_FALSE(s3->Read(&none));
  const grpc::Status third = s3->Finish();
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(third.error_message(), "--estimate-streams-per-client"))
      << third.error_message();
  // Nothing asked for more than 0.5 s: both are ended.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(s1->Read(&none));
  EXPECT_EQ(s1->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_FALSE(s2->Read(&none));
  EXPECT_EQ(s2->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The caller's share is free again, and plain calls were never held up.
  grpc::ClientContext c4, c5;
  auto s4 = stub->EstimateStream(&c4);
  EXPECT_TRUE(ask(s4.get()));
  v1::EstimateResponse unary;
  EXPECT_TRUE(stub->Estimate(&c5, req, &unary).ok());
  s4->WritesDone();
  EXPECT_TRUE(s4->Finish().ok());
}

// A client whose stream is refused asks with plain calls instead: the
// answers are the same.
TEST(AgentServiceTest, AClientRefusedAStreamPrefetchesWithCalls) {
  AgentServiceOptions opts;
  opts.estimate_streams_per_client = 1;
  AgentAndClient t = StartWithClient(AttAccSpec(), nullptr, opts);
  ASSERT_TRUE(t.ok());
  // This test's own stream takes the caller's only one.
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(t.agent->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext held;
  auto mine = stub->EstimateStream(&held);
  v1::EstimateRequest req;
  EncodeOps(SampleOps(false).ops, &req);
  v1::EstimateResponse first;
  ASSERT_TRUE(mine->Write(req) && mine->Read(&first));
  DecodeSteps steps(/*gemm_and_elementwise=*/false, /*leaves_after=*/-1);
  std::vector<Cost> want, got;
  for (int k = 0; k < 40; ++k) {
    const std::vector<Op> ops = steps.Ops(k);
    want.assign(ops.size(), Cost{});
    got.assign(ops.size(), Cost{});
    ASSERT_TRUE(t.local->Estimate(ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(t.remote->Estimate(ops, absl::MakeSpan(got)).ok()) << k;
    for (size_t i = 0; i < ops.size(); ++i) ExpectSameBits(want[i], got[i]);
    t.remote->WaitForPrefetches();
  }
  const RemoteStats st = t.remote->Stats();
  EXPECT_GT(st.prefetch_rpcs, 1);       // extensions went on, as calls
  EXPECT_EQ(st.prefetch_failures, 1);   // the one the refused stream held
  mine->WritesDone();
  EXPECT_TRUE(mine->Finish().ok());
}

// An agent whose streams take requests and never answer (hung, or too
// slow): the client cancels the stream once an answer is later than its call
// deadline, the prefetch fails, and the endpoint is asked with plain calls
// from then on (the stream never answered).
// An agent whose Describe and Estimate are a real one's (its plain
// Estimates counted), its streams the subclass's own.
class DelegatingAgent : public v1::DeviceAgent::Service {
 public:
  explicit DelegatingAgent(AgentService* real) : real_(real) {}
  grpc::Status Describe(grpc::ServerContext* ctx, const v1::DescribeRequest* req,
                        v1::DescribeResponse* resp) override {
    return real_->Describe(ctx, req, resp);
  }
  grpc::Status Estimate(grpc::ServerContext* ctx, const v1::EstimateRequest* req,
                        v1::EstimateResponse* resp) override {
    ++unary;
    return real_->Estimate(ctx, req, resp);
  }
  std::atomic<int> unary{0};

 protected:
  AgentService* real_;
};

// `service` served on a free loopback port (null server if it could not).
struct Served {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};
Served ServeOnLoopback(grpc::Service* service) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  Served served;
  served.server = builder.BuildAndStart();
  served.address = absl::StrCat("127.0.0.1:", port);
  return served;
}

// A real AttAcc agent service behind a stand-in `Agent` (a
// DelegatingAgent) served on loopback, a client of it with `client`'s
// options, and the device in process. Members are destroyed client first,
// then the server, then the services it served.
template <typename Agent>
struct StandIn {
  std::unique_ptr<AgentService> real;
  std::unique_ptr<Agent> agent;
  Served served;
  std::unique_ptr<RemoteDevice> remote;
  std::unique_ptr<devices::Device> local;
};
template <typename Agent>
void StartStandIn(const ClientOptions& client, StandIn<Agent>* t) {
  AgentServiceOptions opts;
  opts.spec = AttAccSpec();
  auto real = AgentService::Create(opts);
  ASSERT_TRUE(real.ok()) << real.status();
  t->real = std::move(*real);
  t->agent = std::make_unique<Agent>(t->real.get());
  t->served = ServeOnLoopback(t->agent.get());
  ASSERT_NE(t->served.server, nullptr);
  auto remote =
      RemoteDevice::Create(AttAccSpec(), {t->served.address}, client, "attention device (attacc)");
  ASSERT_TRUE(remote.ok()) << remote.status();
  t->remote = std::move(*remote);
  auto local = devices::CreateDevice(AttAccSpec());
  ASSERT_TRUE(local.ok());
  t->local = std::move(*local);
}

class MuteStreamAgent final : public DelegatingAgent {
 public:
  using DelegatingAgent::DelegatingAgent;
  grpc::Status EstimateStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::EstimateResponse, v1::EstimateRequest>* rw) override {
    v1::EstimateRequest req;
    while (rw->Read(&req)) ++taken;
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  std::atomic<int> taken{0};
};

TEST(AgentServiceTest, AStreamThatNeverAnswersIsCancelledAtTheDeadline) {
  ClientOptions client = FastClient();
  client.deadline_s = 0.5;
  StandIn<MuteStreamAgent> t;
  ASSERT_NO_FATAL_FAILURE(StartStandIn(client, &t));
  DecodeSteps steps(/*gemm_and_elementwise=*/false, /*leaves_after=*/-1);
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < 40; ++k) DecodeSteps::Check(t.local.get(), t.remote.get(), steps.Ops(k));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10.0);
  EXPECT_EQ(t.agent->taken.load(), 1);  // the first prefetch, then none on a stream
  const RemoteStats st = t.remote->Stats();
  EXPECT_EQ(st.prefetch_failures, 1);
  EXPECT_GT(st.prefetch_rpcs, 1);
  t.remote.reset();
  t.served.server->Shutdown();
}

// An agent that answers its streams as its calls, counting each.
class CountingStreamAgent final : public DelegatingAgent {
 public:
  using DelegatingAgent::DelegatingAgent;
  grpc::Status EstimateStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::EstimateResponse, v1::EstimateRequest>* rw) override {
    v1::EstimateRequest req;
    while (rw->Read(&req)) {
      ++streamed;
      v1::EstimateResponse resp;
      if (grpc::Status st = real_->Estimate(ctx, &req, &resp); !st.ok()) return st;
      if (!rw->Write(resp)) break;
    }
    return grpc::Status::OK;
  }
  std::atomic<int> streamed{0};
};

// A device with one endpoint asks its blocking Estimates on the estimate
// stream too, once the endpoint is bound (the first call binds it, plainly).
TEST(AgentServiceTest, BlockingEstimatesGoOnTheStream) {
  ClientOptions client = FastClient();
  client.lookahead_max = 0;  // no asks ahead: every call below is a blocking one
  StandIn<CountingStreamAgent> t;
  ASSERT_NO_FATAL_FAILURE(StartStandIn(client, &t));
  SampleOps s(/*gemm_and_elementwise=*/false);
  for (int k = 0; k < 5; ++k) {
    s.seqs[1].past_tokens = 2047 + 100 * k;  // a new batch each time: a miss
    std::vector<Cost> want(s.ops.size()), got(s.ops.size());
    ASSERT_TRUE(t.local->Estimate(s.ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(t.remote->Estimate(s.ops, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
  }
  EXPECT_EQ(t.agent->unary.load(), 1);
  EXPECT_EQ(t.agent->streamed.load(), 4);
  const RemoteStats st = t.remote->Stats();
  EXPECT_EQ(st.estimate_rpcs, 5);
  EXPECT_EQ(st.prefetch_rpcs, 0);
  t.remote.reset();
  t.served.server->Shutdown();
}

// An Execute of 32 heads x 1,024 queries over 2,048 keys of 128: 8.6e9
// multiply-accumulates, seconds of one core for the exact kernel.
v1::ExecuteRequest LongExecute() {
  using devices::ElementType;
  v1::ExecuteRequest req;
  EncodeTensor(Ramp(ElementType::kFp16, {32, 1024, 128}, 0.001f), req.mutable_q());
  EncodeTensor(Ramp(ElementType::kFp16, {32, 2048, 128}, 0.002f), req.mutable_k());
  EncodeTensor(Ramp(ElementType::kFp16, {32, 2048, 128}, 0.003f), req.mutable_v());
  return req;
}

// Waits up to 20 s for the agent to count `n` stopped kernels.
bool StoppedKernels(const LocalAgent& agent, int64_t n) {
  for (int i = 0; i < 2000 && agent.service->interrupted_calls() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return agent.service->interrupted_calls() == n;
}

TEST(AgentServiceTest, KernelsStopWhenTheCallerGivesUpOrTheBudgetIsSpent) {
  AgentServiceOptions opts;
  opts.call_budget_s = 0.3;
  auto budgeted = StartLocal(GpuSpec(), opts);
  ASSERT_NE(budgeted, nullptr);
  const v1::ExecuteRequest req = LongExecute();
  {
    auto stub = v1::DeviceAgent::NewStub(
        grpc::CreateChannel(budgeted->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::ExecuteResponse resp;
    const grpc::Status st = stub->Execute(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "--call-budget-s")) << st.error_message();
    EXPECT_EQ(budgeted->service->interrupted_calls(), 1);
  }
  auto agent = StartLocal(GpuSpec());
  ASSERT_NE(agent, nullptr);
  auto stub = v1::DeviceAgent::NewStub(
      grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials()));
  {
    // The client's deadline passes: the kernel stops too. (The deadline
    // leaves the agent time to receive and decode the 33 MB request under a
    // loaded, sanitized build: a call whose deadline passes before its
    // handler starts never reaches a kernel. The kernel alone takes far
    // longer.)
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ExecuteResponse resp;
    EXPECT_EQ(stub->Execute(&ctx, req, &resp).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_TRUE(StoppedKernels(*agent, 1));
  }
  {
    // The client cancels, once its call has reached the agent.
    grpc::ClientContext ctx;
    v1::ExecuteResponse resp;
    const int64_t calls = agent->service->calls();
    std::thread cancel([&ctx, &agent, calls] {
      for (int i = 0; i < 2000 && agent->service->calls() == calls; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ctx.TryCancel();
    });
    EXPECT_EQ(stub->Execute(&ctx, req, &resp).error_code(), grpc::StatusCode::CANCELLED);
    cancel.join();
    EXPECT_TRUE(StoppedKernels(*agent, 2));
  }
}

}  // namespace
}  // namespace servesim::agents
