#include "services/accept_guard.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace {

using Accept4Fn = int (*)(int, struct sockaddr*, socklen_t*, int);

// -1 until installed: accept4 passes through.
std::atomic<int> g_threshold{-1};
std::atomic<int64_t> g_refused{0};
std::mutex g_reserve_mu;
int g_reserve = -1;  // guarded by g_reserve_mu

Accept4Fn RealAccept4() {
  static const Accept4Fn real = reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

int OpenReserve() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

// The executable's own accept4: libgrpc's calls bind to it before libc's.
extern "C" int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  const Accept4Fn real = RealAccept4();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int threshold = g_threshold.load(std::memory_order_relaxed);
  const socklen_t capacity = len != nullptr ? *len : 0;
  for (;;) {
    if (len != nullptr) *len = capacity;
    const int c = real(fd, addr, len, flags);
    if (threshold < 0) return c;
    if (c >= threshold) {
      // Over the cap: closed before a byte is read. The next pending
      // connection gets the same number, so the loop empties the queue and
      // ends with the EAGAIN that re-arms gRPC's listener.
      ::close(c);
      g_refused.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (c < 0 && (errno == EMFILE || errno == ENFILE)) {
      std::lock_guard<std::mutex> lock(g_reserve_mu);
      if (g_reserve >= 0) ::close(g_reserve);
      for (;;) {
        if (len != nullptr) *len = capacity;
        const int d = real(fd, addr, len, flags);
        if (d < 0) break;
        ::close(d);
        g_refused.fetch_add(1, std::memory_order_relaxed);
      }
      g_reserve = OpenReserve();
      errno = EAGAIN;
      return -1;
    }
    return c;
  }
}

namespace servesim::services {

absl::StatusOr<AcceptGuardInfo> InstallAcceptGuard(int max_connections) {
  if (max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-connections ", max_connections, "; expected >= 1"));
  }
  if (RealAccept4() == nullptr) {
    return absl::InternalError("accept4 not found in the C library");
  }
  std::lock_guard<std::mutex> lock(g_reserve_mu);
  if (g_reserve < 0) g_reserve = OpenReserve();
  if (g_reserve < 0) {
    return absl::ResourceExhaustedError("cannot open /dev/null for the descriptor reserve");
  }
  // The lowest free descriptor now: connections take numbers from here.
  const int probe = OpenReserve();
  if (probe < 0) return absl::ResourceExhaustedError("no free file descriptor");
  ::close(probe);
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  AcceptGuardInfo info;
  const int64_t hard =
      lim.rlim_max == RLIM_INFINITY ? (int64_t{1} << 20) : static_cast<int64_t>(lim.rlim_max);
  const int64_t room = hard - probe - kAcceptGuardMargin;
  if (room < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the file-descriptor limit (ulimit -Hn = ", hard, ") leaves no room for connections"));
  }
  info.max_connections = max_connections;
  if (room < max_connections) {
    info.max_connections = static_cast<int>(room);
    info.note = absl::StrCat("--max-connections lowered from ", max_connections, " to ", room,
                             " to fit the file-descriptor limit (ulimit -Hn = ", hard, ")");
  }
  const int64_t want = probe + info.max_connections + kAcceptGuardMargin;
  if (static_cast<int64_t>(lim.rlim_cur) < want && lim.rlim_cur != RLIM_INFINITY) {
    lim.rlim_cur = static_cast<rlim_t>(want);
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  info.fd_limit = lim.rlim_cur == RLIM_INFINITY ? hard : static_cast<int64_t>(lim.rlim_cur);
  g_threshold.store(probe + info.max_connections, std::memory_order_relaxed);
  return info;
}

int64_t RefusedConnections() { return g_refused.load(std::memory_order_relaxed); }

}  // namespace servesim::services
