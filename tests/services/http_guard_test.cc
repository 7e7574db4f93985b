// The dashboard server's connection limits (services/http_guard.h), driven
// by a fake accept() that hands out Unix socket pairs under made-up client
// addresses: the oldest idle connection gives way, one whose request waits
// whole or is being served does not, and the new one is closed when none
// can give way.
#include "services/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace servesim::services::http_guard {
namespace {

// The next connection the fake accept() returns: its client address and
// port, and the far end of its socket pair (the "client").
struct Pending {
  std::string address;
  int port = 0;
};
Pending g_next;
std::vector<int> g_clients;  // client ends, by accept order

int FakeAccept(int, struct sockaddr* addr, socklen_t* len) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return -1;
  g_clients.push_back(pair[1]);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(g_next.port));
  ::inet_pton(AF_INET, g_next.address.c_str(), &a.sin_addr);
  std::memcpy(addr, &a, sizeof a);
  *len = sizeof a;
  return pair[0];
}

int Accept(const std::string& address, int port) {
  g_next = {address, port};
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  return GuardedAccept(FakeAccept, 3, reinterpret_cast<sockaddr*>(&addr), &len);
}

// Whether the server end of connection `i` was shut down: its client reads
// the end of the stream.
bool ShutDown(size_t i) {
  char c;
  return ::recv(g_clients[i], &c, 1, MSG_DONTWAIT) == 0;
}

TEST(HttpGuardTest, TheOldestIdleConnectionGivesWayAndBusyOnesDoNot) {
  Enable(Limits{.per_client = 2, .total = 3});
  const int64_t evicted = Evicted(), refused = Refused();
  const int a1 = Accept("10.0.0.1", 1001);
  const int a2 = Accept("10.0.0.1", 1002);
  ASSERT_GE(a1, 0);
  ASSERT_GE(a2, 0);
  EXPECT_FALSE(ShutDown(0));
  // A third from the same client: the oldest idle one (a1) gives way.
  const int a3 = Accept("10.0.0.1", 1003);
  ASSERT_GE(a3, 0);
  EXPECT_TRUE(ShutDown(0));
  EXPECT_FALSE(ShutDown(1));
  EXPECT_EQ(Evicted() - evicted, 1);
  // a2's request waits whole, a3's is being served: a fourth cannot get in.
  const char request[] = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::send(g_clients[1], request, sizeof request - 1, 0),
            static_cast<ssize_t>(sizeof request - 1));
  BeginRequest("10.0.0.1", 1003);
  errno = 0;
  EXPECT_EQ(Accept("10.0.0.1", 1004), -1);
  EXPECT_EQ(errno, ECONNABORTED);
  EXPECT_EQ(Refused() - refused, 1);
  EXPECT_TRUE(ShutDown(3));  // closed before a byte
  // a2 served and closed: room again.
  Closed("10.0.0.1", 1002);
  const int a5 = Accept("10.0.0.1", 1005);
  EXPECT_GE(a5, 0);
  // Another client: b1 makes three (the total), b2 is one more, and the
  // oldest idle connection of anyone gives way (a5; a3 is busy).
  const int b1 = Accept("10.0.0.2", 2001);
  ASSERT_GE(b1, 0);
  EXPECT_EQ(Evicted() - evicted, 1);
  const int b2 = Accept("10.0.0.2", 2002);
  ASSERT_GE(b2, 0);
  EXPECT_TRUE(ShutDown(4));
  EXPECT_FALSE(ShutDown(2));
  EXPECT_FALSE(ShutDown(5));
  EXPECT_EQ(Evicted() - evicted, 2);
  Disable();
  // Off: every connection passes.
  std::vector<int> server_ends = {a1, a2, a3, a5, b1, b2};
  for (int i = 0; i < 5; ++i) {
    server_ends.push_back(Accept("10.0.0.1", 3000 + i));
    EXPECT_GE(server_ends.back(), 0);
  }
  for (int fd : server_ends) ::close(fd);
  for (int fd : g_clients) ::close(fd);
  g_clients.clear();
}

}  // namespace
}  // namespace servesim::services::http_guard
