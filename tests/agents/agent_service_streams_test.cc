// Estimate streams: answered as Estimate answers, in order, on one or
// several stream threads; capped per caller and ended when idle; a client
// refused a stream, or whose stream never answers, asks with plain calls;
// a device with one endpoint asks its blocking Estimates on the stream.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
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
using devices::Cost;
using devices::Op;
using test::AgentAndClient;
using test::AttAccSpec;
using test::DecodeSteps;
using test::ExpectSameBits;
using test::FastClient;
using test::GpuSpec;
using test::SampleOps;
using test::StartLocal;
using test::StartWithClient;

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
  EXPECT_GT(st.prefetch_rpcs, 1);      // extensions went on, as calls
  EXPECT_EQ(st.prefetch_failures, 1);  // the one the refused stream held
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

}  // namespace
}  // namespace servesim::agents
