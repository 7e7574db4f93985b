// The `servesim` program's own accept(): libcivetweb's calls bind to it
// before libc's (the symbol is exported), so that the live dashboard's
// server applies its connection limits (services/http_guard.h). Linked into
// the program alone; elsewhere accept() is libc's.
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

#include "services/http_guard.h"

extern "C" int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  static const auto real =
      reinterpret_cast<servesim::services::http_guard::AcceptFn>(dlsym(RTLD_NEXT, "accept"));
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return servesim::services::http_guard::GuardedAccept(real, fd, addr, len);
}
