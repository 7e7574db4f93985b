// The live-metrics endpoint: the HTTP server and the Prometheus registry.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/http_server.h"
#include "services/live_metrics.h"

namespace servesim::services {
namespace {

// One request to 127.0.0.1:port; the whole response.
std::string Http(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  ::send(fd, request.data(), request.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}
std::string Get(int port, const std::string& path) {
  return Http(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"));
}

TEST(HttpServerTest, ServesMetricsAndFilesAndNothingElse) {
  const std::string dir = std::filesystem::temp_directory_path() / "servesim_http_test";
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/index.html") << "<html>dash</html>";
  std::ofstream(dir + "/sub/app.js") << "let x = 1;";
  int scrapes = 0;
  auto server = HttpServer::Start("127.0.0.1:0", dir, [&] {
    ++scrapes;
    return std::string("servesim_up 1\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  const std::string m = Get(port, "/metrics");
  EXPECT_TRUE(absl::StartsWith(m, "HTTP/1.1 200 OK\r\n")) << m;
  EXPECT_TRUE(absl::StrContains(m, "Content-Type: text/plain; version=0.0.4")) << m;
  EXPECT_TRUE(absl::EndsWith(m, "\r\n\r\nservesim_up 1\n")) << m;
  EXPECT_EQ(scrapes, 1);
  const std::string root = Get(port, "/?t=1");
  EXPECT_TRUE(absl::StartsWith(root, "HTTP/1.1 200 OK\r\n")) << root;
  EXPECT_TRUE(absl::StrContains(root, "Content-Type: text/html")) << root;
  EXPECT_TRUE(absl::EndsWith(root, "<html>dash</html>")) << root;
  const std::string js = Get(port, "/sub/app.js");
  EXPECT_TRUE(absl::StrContains(js, "Content-Type: text/javascript")) << js;
  EXPECT_TRUE(absl::EndsWith(js, "let x = 1;")) << js;
  // Outside the folder, missing, other methods, garbage.
  EXPECT_TRUE(absl::StartsWith(Get(port, "/../etc/passwd"), "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Get(port, "/sub/../../x"), "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Get(port, "/missing.css"), "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Http(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405"));
  EXPECT_TRUE(absl::StartsWith(Http(port, "POST /index.html HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
                               "HTTP/1.1 405"));
  EXPECT_TRUE(absl::StrContains(Http(port, "nonsense\r\n\r\n"), " 400 Bad Request"));
  // HEAD: the headers GET would send, no body; a HEAD of /metrics renders
  // nothing (no scrape counted).
  const std::string head = Http(port, "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::StrContains(head, "Content-Length: 17\r\n")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << head;
  const std::string head_metrics = Http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head_metrics, "HTTP/1.1 200 OK\r\n")) << head_metrics;
  EXPECT_TRUE(absl::EndsWith(head_metrics, "\r\n\r\n")) << head_metrics;
  // Every answer tells the dashboard not to cache.
  EXPECT_TRUE(absl::StrContains(root, "Cache-Control: no-store")) << root;
  EXPECT_TRUE(absl::StrContains(m, "Cache-Control: no-store")) << m;
  EXPECT_EQ(scrapes, 1);
}

TEST(HttpServerTest, ATokenGuardsMetricsAndLeavesThePageOpen) {
  const std::string dir = std::filesystem::temp_directory_path() / "servesim_http_token_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/index.html") << "<html>dash</html>";
  int scrapes = 0;
  auto server = HttpServer::Start(
      "127.0.0.1:0", dir,
      [&] {
        ++scrapes;
        return std::string("servesim_up 1\n");
      },
      "s3cret-token");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_TRUE((*server)->loopback());
  const std::string none = Get(port, "/metrics");
  EXPECT_TRUE(absl::StartsWith(none, "HTTP/1.1 401 Unauthorized\r\n")) << none;
  EXPECT_TRUE(absl::StrContains(none, "WWW-Authenticate: Bearer")) << none;
  for (const char* wrong : {"Bearer s3cret-tokeN", "Bearer s3cret-token2", "Bearer s3cret",
                            "s3cret-token", "Basic s3cret-token"}) {
    const std::string r = Http(port, absl::StrCat("GET /metrics HTTP/1.1\r\nHost: x\r\n"
                                                  "Authorization: ",
                                                  wrong, "\r\n\r\n"));
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 401")) << wrong << ": " << r;
  }
  EXPECT_EQ(scrapes, 0);
  const std::string ok = Http(port,
                              "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                              "s3cret-token\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "servesim_up 1\n")) << ok;
  EXPECT_EQ(scrapes, 1);
  // The page itself holds no data.
  EXPECT_TRUE(absl::StartsWith(Get(port, "/"), "HTTP/1.1 200 OK\r\n"));
}

TEST(HttpServerTest, BadAddressesNameTheFlag) {
  for (const char* bad : {"127.0.0.1:", "127.0.0.1:70000", "-1", "x", "host:port"}) {
    auto s = HttpServer::Start(bad, "", [] { return std::string(); });
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--metrics")) << s.status();
  }
  // A bare port (or ":PORT") is loopback.
  for (const char* port_only : {"0", ":0"}) {
    auto s = HttpServer::Start(port_only, "", [] { return std::string("x 1\n"); });
    ASSERT_TRUE(s.ok()) << port_only << ": " << s.status();
    EXPECT_EQ((*s)->host(), "127.0.0.1");
    EXPECT_TRUE(absl::EndsWith(Get((*s)->port(), "/metrics"), "x 1\n"));
  }
}

TEST(LiveMetricsTest, CountsWhatTheSimulationReports) {
  LiveMetricsConfig c;
  c.scenario = "t";
  c.replicas = 2;
  c.device_kind = "attacc";
  c.trace_s = 3600;
  LiveMetrics m(c);
  m.OnArrival(1);
  m.OnArrival(1);
  m.OnFirstToken(1, 0.25);
  m.OnToken(1, 0.04);
  m.OnToken(1, 0.06);
  m.OnFinish(1, 2.5);
  m.OnReject(0, scheduler::RejectReason::kTooLong);
  metrics::LiveIteration it;
  it.replica = 1;
  it.batch_size = 7;
  it.queue_length = 3;
  it.kv_blocks_used = 100;
  it.kv_blocks_total = 400;
  it.preemptions_total = 2;
  it.prefix_hit_tokens_total = 32;
  it.prefix_query_tokens_total = 100;
  it.num_kv_tiers = 2;
  it.kv_tier_names[0] = "host_dram";
  it.kv_tier_names[1] = "cluster_store";
  it.kv_tier_hit_tokens_total[0] = 16;
  it.xpu_busy_s = 0.03;
  it.device_busy_s = 0.02;
  it.xpu.dram_bytes = 1e9;
  it.xpu.compute_energy_pj = 5e12;  // 5 J
  it.device.tsv_bytes = 4096;
  m.OnIteration(it);
  it.preemptions_total = 3;  // one more since the last iteration
  it.prefix_hit_tokens_total = 48;
  it.prefix_query_tokens_total = 180;
  it.kv_tier_hit_tokens_total[0] = 32;  // running totals: counted once
  it.kv_tier_hit_tokens_total[1] = 64;
  m.OnIteration(it);
  m.OnKvTransfer(1, 3.2e8, 0.004);  // a disaggregated run's hand-off
  // Its links: a NIC and an uplink's two directions; two transfers landed.
  m.OnLinks({{"r0.nic", 2e11}, {"rack0.uplink.up", 4e11}, {"rack0.uplink.down", 4e11}});
  m.OnLinkBytes(0, 3.2e8);
  m.OnLinkBytes(1, 3.2e8);
  m.OnLinkBytes(0, 1e8);
  m.OnClock(120, 0.5);
  const std::string text = m.Render();
  for (const char* line : {
           "servesim_link_bytes_total{link=\"r0.nic\"} 420000000\n",
           "servesim_link_bytes_total{link=\"rack0.uplink.up\"} 320000000\n",
           "servesim_link_bytes_total{link=\"rack0.uplink.down\"} 0\n",
           "servesim_link_bandwidth_bytes_per_second{link=\"rack0.uplink.down\"} 400000000000\n",
           "servesim_kv_transfer_bytes_total{replica=\"1\"} 320000000\n",
           "servesim_kv_transfer_seconds_count{replica=\"1\"} 1\n",
           "servesim_kv_transfer_seconds_bucket{replica=\"1\",le=\"0.005\"} 1\n",
           "servesim_requests_arrived_total{replica=\"1\"} 2\n",
           "servesim_requests_arrived_total{replica=\"0\"} 0\n",
           "servesim_requests_finished_total{replica=\"1\"} 1\n",
           "servesim_requests_rejected_total{reason=\"too_long\",replica=\"0\"} 1\n",
           "servesim_requests_preempted_total{replica=\"1\"} 3\n",
           "servesim_prefix_cache_hit_tokens_total{replica=\"1\"} 48\n",
           "servesim_prefix_cache_query_tokens_total{replica=\"1\"} 180\n",
           "servesim_prefix_cache_hit_tokens_total{replica=\"0\"} 0\n",
           "servesim_kv_tier_hit_tokens_total{replica=\"1\",tier=\"host_dram\"} 32\n",
           "servesim_kv_tier_hit_tokens_total{replica=\"1\",tier=\"cluster_store\"} 64\n",
           "servesim_tokens_generated_total{replica=\"1\"} 3\n",
           "servesim_iterations_total{replica=\"1\"} 2\n",
           "servesim_batch_size{replica=\"1\"} 7\n",
           "servesim_queue_length{replica=\"1\"} 3\n",
           "servesim_kv_blocks_total{replica=\"1\"} 400\n",
           "servesim_tbt_seconds_count{replica=\"1\"} 2\n",
           "servesim_tbt_seconds_sum{replica=\"1\"} 0.1\n",
           "servesim_tbt_seconds_bucket{replica=\"1\",le=\"0.04\"} 1\n",
           "servesim_tbt_seconds_bucket{replica=\"1\",le=\"0.06\"} 2\n",
           "servesim_ttft_seconds_count{replica=\"1\"} 1\n",
           "servesim_e2e_seconds_sum{replica=\"1\"} 2.5\n",
           "servesim_device_busy_seconds_total{device=\"xpu\",kind=\"gpu\",replica=\"1\"} 0.06\n",
           "servesim_device_busy_seconds_total{device=\"attacc\",kind=\"attacc\",replica=\"1\"} "
           "0.04\n",
           "servesim_device_bytes_total{device=\"attacc\",kind=\"attacc\",level=\"tsv\",replica="
           "\"1\"} 8192\n",
           "servesim_energy_joules_total{device=\"xpu\",kind=\"gpu\",replica=\"1\"} 10\n",
           "servesim_simulated_seconds 120\n",
           "servesim_realtime_factor 240\n",
           "servesim_trace_seconds 3600\n",
           "servesim_run_done 0\n",
       }) {
    EXPECT_TRUE(absl::StrContains(text, line)) << "missing: " << line;
  }
  m.OnDone(130, 1);
  EXPECT_TRUE(absl::StrContains(m.Render(), "servesim_run_done 1\n"));
}

}  // namespace
}  // namespace servesim::services
