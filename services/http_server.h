// The live dashboard's HTTP server: GET /metrics (a callback renders the
// Prometheus text format) and static files from one folder, on civetweb
// (the embedded server prometheus-cpp itself is built on; Debian's
// libcivetweb).
//
// civetweb confines paths to the folder, answers HEAD as it answers GET,
// picks index.html for "/", and refuses other methods with 405. Responses
// carry `Cache-Control: no-store` so a dashboard polling twice a second
// always sees the current figures. Eight worker threads: a dashboard and a
// Prometheus scrape are the usual load. A request's headers must arrive
// within 2 s, and a client holds at most 6 connections, all clients 64
// (the oldest idle one gives way to a new one: http_guard.h), so idle or
// trickling connections cannot keep /metrics from answering.
#ifndef SERVESIM_SERVICES_HTTP_SERVER_H_
#define SERVESIM_SERVICES_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace servesim::services {

class HttpServer {
 public:
  using MetricsFn = std::function<std::string()>;

  // Listens on `address` ("HOST:PORT", or "PORT" / ":PORT" for loopback;
  // port 0 picks a free one) and serves `metrics` at /metrics and the files
  // of `web_dir` elsewhere ("/" is index.html). INVALID_ARGUMENT for a
  // malformed address, UNAVAILABLE when it cannot listen.
  // With a `token`, /metrics answers only requests that carry it
  // (`Authorization: Bearer TOKEN`; 401 otherwise); the page's files, which
  // hold no data, stay open, and the page sends the token it finds in its
  // address (#token=TOKEN).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           const std::string& web_dir,
                                                           MetricsFn metrics,
                                                           const std::string& token = "");
  ~HttpServer();  // stops the server (waits for requests in progress)
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  // Whether it listens on a loopback address only (127.0.0.0/8, ::1).
  bool loopback() const;

 private:
  HttpServer() = default;
  static int HandleMetrics(mg_connection* conn, void* self);

  std::string host_;
  std::string numeric_host_;  // the address listened on, for Stop's wake-up
  bool v6_ = false;
  int port_ = 0;
  MetricsFn metrics_;
  std::string token_;
  mg_context* ctx_ = nullptr;
};

// The content type servesim sends for a file name.
std::string ContentTypeFor(const std::string& path);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_HTTP_SERVER_H_
