#include "services/http_server.h"

#include <civetweb.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/http_guard.h"

namespace servesim::services {
namespace {

// civetweb's error lines while starting, for the error message.
std::mutex g_start_mu;
std::string* g_start_log = nullptr;

int LogMessage(const mg_connection*, const char* message) {
  if (g_start_log != nullptr && message != nullptr) {
    if (!g_start_log->empty()) g_start_log->append("; ");
    g_start_log->append(message);
  }
  return 1;  // handled: civetweb prints nothing itself
}

// civetweb's extra_mime_types: what ContentTypeFor says, for the dashboard's
// file types.
std::string MimeTypes() {
  std::string out;
  for (const char* ext : {".html", ".js", ".mjs", ".css", ".json", ".svg", ".png"}) {
    absl::StrAppend(&out, out.empty() ? "" : ",", ext, "=", ContentTypeFor(ext));
  }
  return out;
}

}  // namespace

bool HttpServer::loopback() const {
  return absl::StartsWith(numeric_host_, "127.") || numeric_host_ == "::1";
}

std::string ContentTypeFor(const std::string& path) {
  if (absl::EndsWith(path, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(path, ".js") || absl::EndsWith(path, ".mjs")) {
    return "text/javascript; charset=utf-8";
  }
  if (absl::EndsWith(path, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(path, ".json")) return "application/json";
  if (absl::EndsWith(path, ".svg")) return "image/svg+xml";
  if (absl::EndsWith(path, ".png")) return "image/png";
  return "text/plain; charset=utf-8";
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              const std::string& web_dir,
                                                              MetricsFn metrics,
                                                              const std::string& token) {
  // "PORT" and ":PORT" mean loopback.
  const size_t colon = address.rfind(':');
  std::string host =
      colon == std::string::npos || colon == 0 ? "127.0.0.1" : address.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? address : address.substr(colon + 1);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics: '", address,
                     "' is not [HOST:]PORT with a port in [0, 65535] (0: any free)"));
  }
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  // civetweb listens on numeric addresses: resolve a name first.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  char numeric[NI_MAXHOST] = {};
  const bool v6 = res->ai_family == AF_INET6;
  const int rc = ::getnameinfo(res->ai_addr, res->ai_addrlen, numeric, sizeof(numeric), nullptr, 0,
                               NI_NUMERICHOST);
  ::freeaddrinfo(res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  const std::string listen =
      v6 ? absl::StrCat("[", numeric, "]:", port) : absl::StrCat(numeric, ":", port);

  std::unique_ptr<HttpServer> s(new HttpServer());
  s->host_ = host;
  s->numeric_host_ = numeric;
  s->v6_ = v6;
  s->metrics_ = std::move(metrics);
  s->token_ = token;
  mg_init_library(0);
  const std::string mime = MimeTypes();
  std::vector<const char*> options = {
      "listening_ports",
      listen.c_str(),
      "num_threads",
      "8",
      // Accepting never waits for a worker (the queue holds more than the
      // connection limits allow), so the limits see every new connection
      // and idle ones give way at once (http_guard.h); bursts wait in the
      // kernel's queue rather than being dropped.
      "connection_queue",
      "256",
      "listen_backlog",
      "1024",
      "request_timeout_ms",
      "2000",  // a stalled client cannot hold a worker
      "enable_keep_alive",
      "no",
      "enable_directory_listing",
      "no",
      "static_file_cache_control",
      "no-store",
      "extra_mime_types",
      mime.c_str(),
  };
  if (!web_dir.empty()) {
    options.push_back("document_root");
    options.push_back(web_dir.c_str());
  }
  options.push_back(nullptr);
  mg_callbacks callbacks{};
  callbacks.log_message = LogMessage;
  // The connection limits (http_guard.h) learn when a request has been
  // read and when a connection closes.
  callbacks.begin_request = [](mg_connection* conn) {
    if (const mg_request_info* r = mg_get_request_info(conn); r != nullptr) {
      http_guard::BeginRequest(r->remote_addr, r->remote_port);
    }
    return 0;  // civetweb goes on with the request
  };
  callbacks.connection_close = [](const mg_connection* conn) {
    if (const mg_request_info* r = mg_get_request_info(conn); r != nullptr) {
      http_guard::Closed(r->remote_addr, r->remote_port);
    }
  };
  http_guard::Enable(http_guard::Limits{});
  std::string start_log;
  {
    std::lock_guard<std::mutex> lock(g_start_mu);
    g_start_log = &start_log;
    s->ctx_ = mg_start(&callbacks, s.get(), options.data());
    g_start_log = nullptr;
  }
  if (s->ctx_ == nullptr) {
    http_guard::Disable();
    return absl::UnavailableError(absl::StrCat("--metrics: cannot listen on ", address, ": ",
                                               start_log.empty() ? "unknown error" : start_log));
  }
  mg_set_request_handler(s->ctx_, "/metrics$", &HttpServer::HandleMetrics, s.get());
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(s->ctx_, 4, ports) < 1 || ports[0].port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics: cannot listen on ", address, ": no port bound"));
  }
  s->port_ = ports[0].port;
  return s;
}

HttpServer::~HttpServer() {
  if (ctx_ == nullptr) return;
  http_guard::Disable();
  // civetweb's listening thread polls in 2 s quanta and sees mg_stop's flag
  // only when it wakes: a connection wakes it at once.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    for (int i = 0; i < 100 && !stopped.load(); ++i) {
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = v6_ ? AF_INET6 : AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
      if (::getaddrinfo(numeric_host_.c_str(), std::to_string(port_).c_str(), &hints, &res) == 0) {
        const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0) {
          (void)::connect(fd, res->ai_addr, res->ai_addrlen);
          ::close(fd);
        }
        ::freeaddrinfo(res);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  mg_stop(ctx_);
  stopped = true;
  waker.join();
}

int HttpServer::HandleMetrics(mg_connection* conn, void* self) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (const std::string& token = static_cast<HttpServer*>(self)->token_; !token.empty()) {
    // Compared in time independent of where a wrong token differs.
    const char* got = mg_get_header(conn, "Authorization");
    const std::string want = "Bearer " + token;
    const std::string have = got != nullptr ? got : "";
    unsigned diff = have.size() != want.size() ? 1u : 0u;
    for (size_t i = 0; i < want.size(); ++i) {
      diff |= static_cast<unsigned>(want[i] ^ (i < have.size() ? have[i] : 0));
    }
    if (diff != 0) {
      mg_printf(conn,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: "
                "text/plain\r\nContent-Length: 42\r\nConnection: close\r\n\r\n"
                "/metrics wants Authorization: Bearer TOKEN");
      return 401;
    }
  }
  const std::string method =
      req != nullptr && req->request_method != nullptr ? req->request_method : "";
  if (method != "GET" && method != "HEAD") {
    mg_printf(conn,
              "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Type: "
              "text/plain\r\nContent-Length: 14\r\nConnection: close\r\n\r\nonly GET, HEAD");
    return 405;
  }
  // HEAD: the same headers, no body, and no scrape counted.
  const std::string body = method == "GET" ? static_cast<HttpServer*>(self)->metrics_() : "";
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n");
  if (method == "GET") {
    mg_printf(conn, "Content-Length: %zu\r\n\r\n", body.size());
    mg_write(conn, body.data(), body.size());
  } else {
    mg_printf(conn, "\r\n");
  }
  return 200;
}

}  // namespace servesim::services
