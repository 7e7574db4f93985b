// What the parts of AgentService (agents/agent_service.h) share: the
// steady clock in nanoseconds (sessions' and streams' idle times, a call's
// budget) and the bound on one Execute or Step's work.
//
// The parts, one file each:
//   agent_service.cc           the service core: the free functions of the
//                              header, creating the service, authorization,
//                              the hosted devices, Describe, Estimate,
//                              Measure, Execute and the kernels' polls
//   agent_service_streams.cc   estimate streams: admission under the caps,
//                              the idle watch, StreamCall, ServeStreams
//   agent_service_sessions.cc  sessions: OpenSession, AppendKv, Step,
//                              CloseSession, expiry
// Library-internal: include it from agents/ only.
#ifndef SERVESIM_AGENTS_AGENT_SERVICE_INTERNAL_H_
#define SERVESIM_AGENTS_AGENT_SERVICE_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "grpcpp/support/status.h"

namespace servesim::agents::internal {

// The steady clock, in nanoseconds.
int64_t SteadyNs();

// heads x q_len x kv_len x d_head of q [heads, q_len, d_head] over a K of
// kv_len positions, saturating; 0 for shapes the kernel refuses anyway.
int64_t AttentionMacs(const std::vector<int64_t>& q_shape, int64_t kv_len);

// RESOURCE_EXHAUSTED: `macs` multiply-accumulates, past `max_macs`.
grpc::Status TooMuchWork(int64_t macs, int64_t max_macs);

}  // namespace servesim::agents::internal

#endif  // SERVESIM_AGENTS_AGENT_SERVICE_INTERNAL_H_
