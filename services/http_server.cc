#include "services/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace servesim::services {
namespace {

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // the client went away; nothing to do
    }
    sent += static_cast<size_t>(n);
  }
}

void Respond(int fd, int code, const std::string& reason, const std::string& type,
             const std::string& body) {
  SendAll(fd, absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                           "\r\nContent-Length: ", body.size(),
                           "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n", body));
}

}  // namespace

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
                                                              MetricsFn metrics) {
  // "PORT" and ":PORT" mean loopback.
  const size_t colon = address.rfind(':');
  const std::string host =
      colon == std::string::npos || colon == 0 ? "127.0.0.1" : address.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? address : address.substr(colon + 1);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics: '", address,
                     "' is not [HOST:]PORT with a port in [0, 65535] (0: any free)"));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->host_ = host;
  s->web_dir_ = web_dir;
  s->metrics_ = std::move(metrics);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(s->host_.c_str(), std::to_string(port).c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics: cannot resolve '", s->host_, "': ", gai_strerror(rc)));
  }
  std::string why;
  for (addrinfo* a = res; a != nullptr && s->listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      s->listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics: cannot listen on ", address, ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = bound.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                 : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(s->wake_fd_, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("--metrics: pipe: ", std::strerror(errno)));
  }
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

HttpServer::~HttpServer() {
  stop_ = true;
  if (wake_fd_[1] >= 0) {
    const char b = 0;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_[1], &b, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpServer::Loop() {
  while (!stop_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (stop_ || (fds[1].revents & POLLIN)) return;
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      timeval tv{2, 0};  // a stalled client cannot hold the server
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      Serve(fd);
      ::close(fd);
    }
  }
}

void HttpServer::Serve(int fd) {
  std::string request;
  char buf[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
    Respond(fd, 400, "Bad Request", "text/plain", "bad request line\n");
    return;
  }
  if (parts[0] != "GET") {
    Respond(fd, 405, "Method Not Allowed", "text/plain", "only GET\n");
    return;
  }
  std::string path = parts[1].substr(0, parts[1].find_first_of("?#"));
  if (path == "/metrics") {
    Respond(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics_());
    return;
  }
  if (path == "/") path = "/index.html";
  if (web_dir_.empty() || path.find("..") != std::string::npos || path.find("//") != std::string::npos ||
      path[0] != '/') {
    Respond(fd, 404, "Not Found", "text/plain", "not found\n");
    return;
  }
  std::ifstream in(web_dir_ + path, std::ios::binary);
  if (!in) {
    Respond(fd, 404, "Not Found", "text/plain", absl::StrCat(path, ": not found\n"));
    return;
  }
  std::ostringstream body;
  body << in.rdbuf();
  Respond(fd, 200, "OK", ContentTypeFor(path), body.str());
}

}  // namespace servesim::services
