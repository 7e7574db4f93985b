// servesim-agent's cap on concurrent connections. gRPC 1.51 (Debian 12) has
// no such cap, and when accept4() fails with EMFILE its listener stops for
// good: ~20,000 idle TCP connections used to leave an agent that never
// accepted again after they closed. The guard wraps accept4() for the whole
// agent process (this file's accept4 is the executable's own definition, so
// gRPC's calls reach it first) and keeps every listener alive:
//
//  - A connection whose new descriptor number is at or above
//    `first_fd + max_connections` is closed at once. Descriptors are handed
//    out lowest first, so a number that high means that many are open: at
//    most `max_connections` accepted connections (whatever else the
//    process holds above them) are ever open together. The caller sees the
//    connection accepted and closed before any byte.
//  - If accept4() fails with EMFILE or ENFILE anyway, the guard frees a
//    descriptor it holds in reserve, accepts and closes every pending
//    connection, takes the reserve back and answers EAGAIN, which gRPC
//    treats as "nothing to accept"; the listener stays armed.
//  - Refused connections are counted (RefusedConnections).
//
// The cap needs descriptors: InstallAcceptGuard raises the soft RLIMIT_NOFILE
// towards the hard one so that the cap plus a margin for gRPC's own
// descriptors fits, and lowers the cap (saying so) when the hard limit is
// too small.
#ifndef SERVESIM_SERVICES_ACCEPT_GUARD_H_
#define SERVESIM_SERVICES_ACCEPT_GUARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace servesim::services {

struct AcceptGuardInfo {
  int max_connections = 0;  // the cap in force (lowered if the fd limit is small)
  int64_t fd_limit = 0;     // soft RLIMIT_NOFILE after raising it
  std::string note;         // non-empty: why the cap was lowered
};

// Descriptors kept free above the cap for gRPC's own (epoll, eventfds,
// files it opens while serving).
inline constexpr int kAcceptGuardMargin = 64;

// Call once, before the server starts. INVALID_ARGUMENT for a cap < 1;
// RESOURCE_EXHAUSTED when the descriptor limit leaves no room for one
// connection.
absl::StatusOr<AcceptGuardInfo> InstallAcceptGuard(int max_connections);

// Connections closed at accept since the guard was installed.
int64_t RefusedConnections();

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_ACCEPT_GUARD_H_
