// Sessions on an agent in this process: they match Execute and survive an
// agent restart (RemoteSession rebuilds them), LAD keeps its state across
// steps, ids are random and belong to the caller that opened them, a
// caller's quota, and idle sessions expire.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/lad/lad_device.h"
#include "devices/registry.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/agents/agent_test_util.h"

namespace servesim::agents {
namespace {

namespace v1 = servesim::v1;
using test::FastClient;
using test::FreshDir;
using test::GpuSpec;
using test::MakeCerts;
using test::Ramp;
using test::StartLocal;
using test_util::ReadFile;

TEST(AgentServiceTest, SessionsMatchExecuteAndSurviveAnAgentRestart) {
  auto agent = StartLocal(GpuSpec());
  ASSERT_NE(agent, nullptr);
  const int port = agent->running.port;
  auto remote = RemoteDevice::Create(GpuSpec(), {agent->address()}, FastClient(), "gpu");
  ASSERT_TRUE(remote.ok());
  auto local = devices::CreateDevice(GpuSpec());
  ASSERT_TRUE(local.ok());
  using devices::ElementType;
  const auto k1 = Ramp(ElementType::kFp16, {2, 5, 8}, 0.2f),
             v1t = Ramp(ElementType::kFp16, {2, 5, 8}, 0.3f);
  const auto k2 = Ramp(ElementType::kFp16, {2, 3, 8}, 0.4f),
             v2t = Ramp(ElementType::kFp16, {2, 3, 8}, 0.5f);
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

}  // namespace
}  // namespace servesim::agents
