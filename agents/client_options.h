// How the simulator reaches device agents (agents/remote_device.h). Kept
// free of gRPC headers: scenario/scenario.h carries it.
#ifndef SERVESIM_AGENTS_CLIENT_OPTIONS_H_
#define SERVESIM_AGENTS_CLIENT_OPTIONS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace servesim::agents {

struct ClientOptions {
  double deadline_s = 30;        // per call (servesim run --agent-deadline)
  double bind_deadline_s = 600;  // Describe with a spec: may calibrate a device
  int attempts_per_endpoint = 3;
  double backoff_initial_s = 0.05;  // doubles per retry, up to backoff_max_s
  double backoff_max_s = 1.0;
  double down_s = 30;  // an endpoint that failed is skipped this long
  // When every endpoint failed (UNAVAILABLE / DEADLINE_EXCEEDED), the call
  // tries them all again, with backoff, until this many seconds have passed
  // since it started (servesim run --agent-retry-s): an agent restarted
  // within it is picked up. 0: one round.
  double retry_s = 10;
  std::string tls_ca_file;    // set: TLS, the agents' certificates chain to it
  std::string tls_cert_file;  // client certificate (with tls_key_file)
  std::string tls_key_file;
  std::string token;  // bearer token sent on every call
  int max_message_bytes = 256 << 20;
  size_t memo_bytes = size_t{64} << 20;  // Estimate memo: lists and entries
  // Decode steps asked ahead per Estimate call, at most (a miss asks 8, a
  // prefetch 16; agents/remote_device.h), 0..256; 0: no lookahead.
  int lookahead_max = 64;
};

// OK for a bearer token: 1-4,096 printable ASCII characters, no spaces
// (gRPC metadata carries printable ASCII only). INVALID_ARGUMENT naming
// `where` (a flag, file or variable) otherwise: an empty or blank token is
// an error, never "no token". (Defined in agent_service.cc.)
absl::Status CheckToken(const std::string& token, const std::string& where);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_CLIENT_OPTIONS_H_
