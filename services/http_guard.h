// Connection limits for the live dashboard's HTTP server (http_server.h).
// civetweb has a fixed pool of workers and no per-client limit: a few
// hundred idle or slowly trickling connections from one client used to
// queue ahead of every scrape until each timed out, so /metrics and the
// page went unreachable for minutes. The guard sees every connection the
// server accepts (the `servesim` program defines accept(), which civetweb
// calls, and hands it to GuardedAccept) and the server's callbacks when a
// request has been read (BeginRequest) and when a connection closes
// (Closed):
//
//  - A client (by address) holds at most `per_client` connections, all
//    clients together at most `total`.
//  - At a cap, the new connection is kept and the oldest of that client's
//    (or, at the total, anyone's) idle connections is shut down: one whose
//    request has not been read and whose whole request header is not
//    waiting either (a peek at its socket). An idle or trickling connection
//    gives way to a new one, and a scrape or a page load, which sends its
//    request at once, is never the one that gives way. When no connection
//    can give way, the new one is closed instead.
//  - Counted: Evicted(), Refused().
//
// With no guarded server running, accept() passes through unchanged.
#ifndef SERVESIM_SERVICES_HTTP_GUARD_H_
#define SERVESIM_SERVICES_HTTP_GUARD_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace servesim::services::http_guard {

using AcceptFn = int (*)(int, struct sockaddr*, socklen_t*);

// The server has more workers than one client may hold connections, so a
// client's idle connections never keep its own new request from a worker;
// six is what a browser opens to one host.
struct Limits {
  int per_client = 6;
  int total = 64;
};

// Turns the guard on with `limits` (HttpServer::Start) or off (its
// destructor).
void Enable(const Limits& limits);
void Disable();

// The executable's accept(): accepts with `real`, then applies the caps.
int GuardedAccept(AcceptFn real, int fd, struct sockaddr* addr, socklen_t* len);

// The server's callbacks, by the client's address and port as civetweb
// reports them.
void BeginRequest(const std::string& address, int port);
void Closed(const std::string& address, int port);

int64_t Evicted();
int64_t Refused();

}  // namespace servesim::services::http_guard

#endif  // SERVESIM_SERVICES_HTTP_GUARD_H_
