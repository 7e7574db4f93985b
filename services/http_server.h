// A small HTTP/1.1 server for the live dashboard: GET /metrics (a callback
// renders the Prometheus text format) and static files from one folder.
//
// One background thread accepts connections and answers each GET, then
// closes it (Connection: close): a dashboard polling twice a second and a
// Prometheus scrape are the whole load. Paths are confined to the folder
// (no "..", no absolute paths); anything else is 404, other methods 405.
#ifndef SERVESIM_SERVICES_HTTP_SERVER_H_
#define SERVESIM_SERVICES_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace servesim::services {

class HttpServer {
 public:
  using MetricsFn = std::function<std::string()>;

  // Listens on `address` ("HOST:PORT", or "PORT" / ":PORT" for loopback;
  // port 0 picks a free one) and serves
  // `metrics` at /metrics and the files of `web_dir` elsewhere ("/" is
  // index.html). INVALID_ARGUMENT for a malformed address, UNAVAILABLE when
  // it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           const std::string& web_dir,
                                                           MetricsFn metrics);
  ~HttpServer();  // stops the thread and closes the socket

  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  HttpServer() = default;
  void Loop();
  void Serve(int fd);

  std::string host_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe that interrupts poll() on stop
  std::string web_dir_;
  MetricsFn metrics_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The content type servesim sends for a file name.
std::string ContentTypeFor(const std::string& path);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_HTTP_SERVER_H_
