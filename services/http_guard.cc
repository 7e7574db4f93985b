#include "services/http_guard.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace servesim::services::http_guard {
namespace {

struct Connection {
  int fd = -1;
  std::string client;  // the address alone
  uint64_t order = 0;  // accept order: smaller is older
  bool busy = false;   // a whole request was read
};

struct State {
  std::mutex mu;
  bool enabled = false;
  Limits limits;
  uint64_t next_order = 0;
  // By "address|port"; the per-client counts by address.
  absl::flat_hash_map<std::string, Connection> open;
  absl::flat_hash_map<std::string, int> per_client;
  int64_t evicted = 0, refused = 0;
};

State& S() {
  static State* s = new State;
  return *s;
}

std::string Key(const std::string& address, int port) { return absl::StrCat(address, "|", port); }

// Whether a whole request header is waiting on `fd`, unread: such a
// connection is about to be served and does not give way.
bool RequestWaiting(int fd) {
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 &&
         absl::string_view(buf, static_cast<size_t>(n)).find("\r\n\r\n") != absl::string_view::npos;
}

// The oldest idle connection (of `client`, or of anyone when empty): one
// whose request has not been read and is not waiting whole. open.end() if
// none. Under mu.
absl::flat_hash_map<std::string, Connection>::iterator OldestIdle(State& s,
                                                                  const std::string& client) {
  auto best = s.open.end();
  for (auto it = s.open.begin(); it != s.open.end(); ++it) {
    if (it->second.busy || (!client.empty() && it->second.client != client) ||
        RequestWaiting(it->second.fd)) {
      continue;
    }
    if (best == s.open.end() || it->second.order < best->second.order) best = it;
  }
  return best;
}

// Shuts down an idle connection and forgets it (its Closed finds nothing).
// Under mu: the connection's Closed waits for mu, so its descriptor is
// still the connection's here.
void Evict(State& s, absl::flat_hash_map<std::string, Connection>::iterator it) {
  ::shutdown(it->second.fd, SHUT_RDWR);
  if (--s.per_client[it->second.client] == 0) s.per_client.erase(it->second.client);
  s.open.erase(it);
  ++s.evicted;
}

}  // namespace

void Enable(const Limits& limits) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.enabled = true;
  s.limits = limits;
}

void Disable() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.enabled = false;
  s.open.clear();
  s.per_client.clear();
}

int GuardedAccept(AcceptFn real, int fd, struct sockaddr* addr, socklen_t* len) {
  sockaddr_storage own{};
  socklen_t own_len = sizeof own;
  struct sockaddr* a = addr != nullptr ? addr : reinterpret_cast<sockaddr*>(&own);
  socklen_t* l = len != nullptr ? len : &own_len;
  const int c = real(fd, a, l);
  if (c < 0) return c;
  State& s = S();
  char host[NI_MAXHOST] = {}, serv[NI_MAXSERV] = {};
  if (::getnameinfo(a, *l, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) !=
      0) {
    return c;  // not an address the caps can count (a Unix socket)
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.enabled) return c;
  const std::string client = host;
  if (s.per_client[client] >= s.limits.per_client) {
    auto it = OldestIdle(s, client);
    if (it == s.open.end()) {
      ::close(c);
      ++s.refused;
      errno = ECONNABORTED;  // civetweb goes on listening
      return -1;
    }
    Evict(s, it);
  }
  if (static_cast<int>(s.open.size()) >= s.limits.total) {
    auto it = OldestIdle(s, "");
    if (it == s.open.end()) {
      ::close(c);
      ++s.refused;
      errno = ECONNABORTED;
      return -1;
    }
    Evict(s, it);
  }
  Connection conn;
  conn.fd = c;
  conn.client = client;
  conn.order = s.next_order++;
  s.open[Key(client, std::atoi(serv))] = conn;
  ++s.per_client[client];
  return c;
}

void BeginRequest(const std::string& address, int port) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.open.find(Key(address, port));
  if (it != s.open.end()) it->second.busy = true;
}

void Closed(const std::string& address, int port) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.open.find(Key(address, port));
  if (it == s.open.end()) return;
  if (--s.per_client[it->second.client] == 0) s.per_client.erase(it->second.client);
  s.open.erase(it);
}

int64_t Evicted() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().evicted;
}

int64_t Refused() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().refused;
}

}  // namespace servesim::services::http_guard
