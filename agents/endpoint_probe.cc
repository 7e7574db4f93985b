#include "agents/endpoint_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace servesim::agents {
namespace {

// A connected socket, closed at scope end; -1 refused, -2 anything else.
class Socket {
 public:
  Socket(const std::string& host, const std::string& port, int timeout_ms) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) return;
    fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      ::freeaddrinfo(res);
      fd_ = -2;
      return;
    }
    const int rc = ::connect(fd_, res->ai_addr, res->ai_addrlen);
    const int connect_errno = errno;
    ::freeaddrinfo(res);
    if (rc != 0 && connect_errno != EINPROGRESS) {
      refused_ = connect_errno == ECONNREFUSED || connect_errno == ENETUNREACH ||
                 connect_errno == EHOSTUNREACH;
      Close();
      return;
    }
    if (rc != 0) {
      pollfd p{fd_, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, timeout_ms) != 1 ||
          ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        refused_ = err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH;
        Close();
        return;
      }
    }
    connected_ = true;
  }
  ~Socket() { Close(); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  bool connected() const { return connected_; }
  bool refused() const { return refused_; }

  bool Send(const std::vector<uint8_t>& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EAGAIN) {
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, 200) != 1) return false;
        continue;
      }
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Up to 64 bytes within `timeout_ms`; empty with *closed set when the
  // other end closed first.
  std::string Receive(int timeout_ms, bool* closed) {
    *closed = false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return "";
    char buf[64];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      return "";
    }
    return std::string(buf, static_cast<size_t>(n));
  }

 private:
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  bool connected_ = false;
  bool refused_ = false;
};

void Put16(std::vector<uint8_t>& v, size_t at, size_t n) {
  v[at] = static_cast<uint8_t>(n >> 8);
  v[at + 1] = static_cast<uint8_t>(n);
}

// A TLS 1.2 ClientHello (RFC 5246 7.4.1.2) any TLS server answers, with a
// ServerHello or an alert: two AES-GCM suites, the x25519 and P-256 groups
// and common signature schemes.
std::vector<uint8_t> ClientHello() {
  std::vector<uint8_t> body = {0x03, 0x03};  // client_version TLS 1.2
  for (int i = 0; i < 32; ++i) body.push_back(static_cast<uint8_t>(i * 7 + 1));  // random
  body.push_back(0x00);                                                          // session id
  for (uint8_t b : {0x00, 0x06, 0xc0, 0x2f, 0xc0, 0x2b, 0x00, 0x9c}) body.push_back(b);
  body.push_back(0x01);  // compression methods: null
  body.push_back(0x00);
  const std::vector<uint8_t> ext = {
      0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17,              // supported_groups
      0x00, 0x0b, 0x00, 0x02, 0x01, 0x00,                                      // ec_point_formats
      0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x08, 0x04, 0x04, 0x03, 0x04, 0x01,  // sig algs
  };
  body.push_back(static_cast<uint8_t>(ext.size() >> 8));
  body.push_back(static_cast<uint8_t>(ext.size()));
  body.insert(body.end(), ext.begin(), ext.end());
  std::vector<uint8_t> out = {0x16, 0x03, 0x01, 0, 0, 0x01, 0, 0, 0};
  Put16(out, 3, body.size() + 4);
  out[6] = static_cast<uint8_t>(body.size() >> 16);
  Put16(out, 7, body.size());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

bool IsHttp2Settings(const std::string& b) {
  return b.size() >= 9 && static_cast<uint8_t>(b[3]) == 0x04;  // frame type SETTINGS
}

}  // namespace

Listener ProbeEndpoint(const std::string& address, double timeout_s) {
  std::string a(absl::StripPrefix(address, "dns:///"));
  if (absl::StrContains(a, "://") || absl::StartsWith(a, "unix:")) return Listener::kUnknown;
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return Listener::kUnknown;
  std::string host = a.substr(0, colon);
  const std::string port = a.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  const int ms = static_cast<int>(timeout_s * 1000);
  bool closed = false;
  {
    Socket s(host, port, ms);
    if (!s.connected()) return s.refused() ? Listener::kNothing : Listener::kUnknown;
    // An HTTP/2 server speaks first.
    const std::string first = s.Receive(ms / 2, &closed);
    if (IsHttp2Settings(first)) return Listener::kPlaintext;
    if (!closed && first.empty() && s.Send(ClientHello())) {
      const std::string reply = s.Receive(ms, &closed);
      if (!reply.empty()) {
        const auto type = static_cast<uint8_t>(reply[0]);
        if (type == 0x15 || type == 0x16) return Listener::kTls;
        if (absl::StartsWith(reply, "HTTP/")) return Listener::kHttp1;
        if (IsHttp2Settings(reply)) return Listener::kPlaintext;
        return Listener::kUnknown;
      }
    }
  }
  // Closed without a word: ask as a web browser would.
  Socket s(host, port, ms);
  if (!s.connected()) return Listener::kUnknown;
  const std::string get = "GET / HTTP/1.0\r\n\r\n";
  if (!s.Send(std::vector<uint8_t>(get.begin(), get.end()))) return Listener::kUnknown;
  const std::string reply = s.Receive(ms, &closed);
  if (absl::StartsWith(reply, "HTTP/")) return Listener::kHttp1;
  if (IsHttp2Settings(reply)) return Listener::kPlaintext;
  return Listener::kUnknown;
}

}  // namespace servesim::agents
