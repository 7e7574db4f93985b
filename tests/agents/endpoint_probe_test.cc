// What listens at an agent's address (agents/endpoint_probe.h), and the
// hint a failed connection carries: nothing, a plaintext agent, a TLS agent,
// a web server, each told apart, from either kind of client.
#include "agents/endpoint_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/http_server.h"
#include "tests/agents/agent_test_util.h"

namespace servesim::agents {
namespace {

using test::FastClient;
using test::FreshDir;
using test::GpuSpec;
using test::MakeCerts;
using test::MutualTlsServer;
using test::StartLocal;

// A loopback port nothing listens on: bound, then closed.
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(EndpointProbeTest, TellsNothingPlaintextTlsAndHttpApart) {
  EXPECT_EQ(ProbeEndpoint(absl::StrCat("127.0.0.1:", ClosedPort()), 1.0), Listener::kNothing);
  auto plain = StartLocal(GpuSpec());
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(ProbeEndpoint(plain->address(), 1.0), Listener::kPlaintext);
  EXPECT_EQ(ProbeEndpoint("dns:///" + plain->address(), 1.0), Listener::kPlaintext);
  auto web = services::HttpServer::Start("127.0.0.1:0", "", [] { return std::string("x 1\n"); });
  ASSERT_TRUE(web.ok()) << web.status();
  EXPECT_EQ(ProbeEndpoint(absl::StrCat("127.0.0.1:", (*web)->port()), 1.0), Listener::kHttp1);
  EXPECT_EQ(ProbeEndpoint("unix:/tmp/x", 1.0), Listener::kUnknown);

  const std::string dir = FreshDir();
  if (!MakeCerts(dir)) GTEST_SKIP() << "openssl not found";
  auto tls = StartLocal(GpuSpec(), {}, MutualTlsServer(dir));
  ASSERT_NE(tls, nullptr);
  EXPECT_EQ(ProbeEndpoint(tls->address(), 1.0), Listener::kTls);
}

TEST(EndpointProbeTest, AFailedConnectionsHintNamesWhatListens) {
  const std::string dir = FreshDir();
  if (!MakeCerts(dir)) GTEST_SKIP() << "openssl not found";
  auto hint = [](const std::string& address, ClientOptions o) {
    auto remote = RemoteDevice::Create(GpuSpec(), {address}, o, "test device");
    if (remote.ok()) {
      devices::Op op;
      op.kind = devices::OpKind::kGemm;
      op.m = op.n = op.k = 64;
      devices::Cost cost;
      const absl::Status st = (*remote)->Estimate({&op, 1}, {&cost, 1});
      return st.ok() ? std::string("answered") : std::string(st.message());
    }
    return std::string(remote.status().message());
  };
  auto plain = StartLocal(GpuSpec());
  auto tls = StartLocal(GpuSpec(), {}, MutualTlsServer(dir));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(tls, nullptr);
  ClientOptions plaintext = FastClient();
  ClientOptions with_ca = FastClient();
  with_ca.tls_ca_file = dir + "/ca.crt";
  // A plaintext client to a TLS agent.
  std::string m = hint(tls->address(), plaintext);
  EXPECT_TRUE(absl::StrContains(m, "The agent serves TLS: give --agent-tls-ca")) << m;
  // A TLS client to a plaintext agent.
  m = hint(plain->address(), with_ca);
  EXPECT_TRUE(absl::StrContains(m, "The agent serves plaintext, not TLS")) << m;
  // A TLS client without the client certificate the agent requires.
  m = hint(tls->address(), with_ca);
  EXPECT_TRUE(absl::StrContains(m, "The agent serves TLS but the handshake failed")) << m;
  // The wrong CA.
  ClientOptions other = with_ca;
  other.tls_ca_file = dir + "/other.crt";
  other.tls_cert_file = dir + "/client.crt";
  other.tls_key_file = dir + "/client.key";
  m = hint(tls->address(), other);
  EXPECT_TRUE(absl::StrContains(m, "The agent serves TLS but the handshake failed")) << m;
  // An HTTP port, and nothing at all.
  auto web = services::HttpServer::Start("127.0.0.1:0", "", [] { return std::string("x 1\n"); });
  ASSERT_TRUE(web.ok()) << web.status();
  m = hint(absl::StrCat("127.0.0.1:", (*web)->port()), plaintext);
  EXPECT_TRUE(absl::StrContains(m, "Something answers HTTP/1 there")) << m;
  m = hint(absl::StrCat("127.0.0.1:", ClosedPort()), plaintext);
  EXPECT_TRUE(absl::StrContains(m, "Nothing accepts connections there")) << m;
}

}  // namespace
}  // namespace servesim::agents
