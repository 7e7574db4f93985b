// What listens at an agent's address, for the hint after a failed
// connection: gRPC's own errors read alike for "nothing there", "that end
// speaks TLS and this one does not", "this end speaks TLS and that one does
// not" and "that is a web server". The probe asks the other end directly,
// on at most two short TCP connections:
//
//  1. Connect. Refused (or unreachable): nothing listens. An HTTP/2 server
//     (a plaintext gRPC agent) sends its SETTINGS frame unasked, at once:
//     plaintext.
//  2. Otherwise send a TLS ClientHello: a TLS server answers with a
//     handshake record or an alert (either is TLS); a web server answers
//     "HTTP/".
//  3. A second connection sends "GET / HTTP/1.0" if the first was closed
//     without a word: "HTTP/" is a web server (servesim's --metrics port).
//
// Each wait is bounded by `timeout_s`; nothing is sent that a server would
// act upon. Used only after a call has failed, never on the hot path.
#ifndef SERVESIM_AGENTS_ENDPOINT_PROBE_H_
#define SERVESIM_AGENTS_ENDPOINT_PROBE_H_

#include <string>

namespace servesim::agents {

enum class Listener {
  kNothing,    // connection refused or unreachable
  kPlaintext,  // an HTTP/2 server without TLS (a plaintext agent)
  kTls,        // a TLS server
  kHttp1,      // an HTTP/1 server (a web page, servesim's dashboard)
  kUnknown,    // accepted, then silent or closed
};

// `address` as the agents take it: "HOST:PORT" or "[V6]:PORT" (a "dns:///"
// prefix is dropped; other schemes are kUnknown).
Listener ProbeEndpoint(const std::string& address, double timeout_s);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_ENDPOINT_PROBE_H_
