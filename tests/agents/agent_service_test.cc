// The DeviceAgent service in this process: bad requests and their status
// codes, Measure, the bearer token, TLS, the health service, and kernels
// that stop when their caller gives up or the budget is spent.
#include "agents/agent_service.h"

#include <chrono>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agents/agent_server.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/registry.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/agents/agent_test_util.h"

namespace servesim::agents {
namespace {

namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;
using test::AttAccSpec;
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

grpc::Status RawEstimate(const std::string& address, const v1::EstimateRequest& req,
                         const std::string& token = "") {
  auto stub =
      v1::DeviceAgent::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
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
    auto stub =
        v1::DeviceAgent::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
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
  auto stub =
      v1::DeviceAgent::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
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
  EXPECT_TRUE(absl::StrContains(plain_st.message(), "The agent serves TLS: give --agent-tls-ca"))
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
    if (!service.empty())
      bytes = absl::StrCat("\x0a", std::string(1, char(service.size())), service);
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
