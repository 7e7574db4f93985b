// What the parts of RemoteDevice (agents/remote_device.h) share and its
// public header keeps out of sight: the asynchronous Estimate in flight
// (Prefetch) and the estimate stream it may go on (Stream), how far ahead a
// prediction reaches, and the helpers for ops that own their lists.
//
// The parts, one file each:
//   remote_device.cc           construction (endpoints, channels, TLS), the
//                              destructor, Describe, Execute, Stats
//   remote_device_calls.cc     calls: binding, retries, fail-over, what a
//                              failed connection suggests
//   remote_device_spread.cc    measured steps spread over the endpoints, and
//                              measuring ahead
//   remote_device_memo.cc      the memo: keys, interned lists and shapes,
//                              runs of expected steps, emptying it
//   remote_device_prefetch.cc  asynchronous Estimates and estimate streams,
//                              and memoising their answers
//   remote_device_estimate.cc  Estimate itself
//   remote_device_expect.cc    hints: Expect, ExpectLater, Prepare
//   remote_session.cc          sessions (RemoteSession)
// Library-internal: include it from agents/ only.
#ifndef SERVESIM_AGENTS_REMOTE_DEVICE_INTERNAL_H_
#define SERVESIM_AGENTS_REMOTE_DEVICE_INTERNAL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "agents/remote_device.h"
#include "devices/device.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/async_stream.h"
#include "grpcpp/support/async_unary_call.h"
#include "servesim/v1/agent.grpc.pb.h"

namespace servesim::agents {

namespace internal {

// A missed call asks this many steps ahead; a hit within kPrefetchMargin
// steps of its prediction's end asks for kPrefetchSteps more,
// asynchronously. Batches change every 10-30 iterations in the Azure
// traces, so longer predictions mostly go to waste (measured: doubling them
// cost the agent 2x the work for 30% fewer blocking calls).
constexpr int kLookaheadStart = 8;
constexpr int kPrefetchSteps = 16;
constexpr int kPrefetchMargin = 6;

// `ops` with their sequence and stack lists copied into `seqs` and
// `stacks` (lists shared in `ops` stay shared).
void CopyOwned(absl::Span<const devices::Op> ops, std::vector<devices::Op>* out,
               std::deque<std::vector<devices::AttentionSeq>>* seqs,
               std::deque<std::vector<int32_t>>* stacks);

// The costs an answer to the first `answered` of `ops` holds (by blocks,
// with their steps).
size_t ExpectedCosts(absl::Span<const devices::Op> ops, absl::Span<const int32_t> steps,
                     size_t answered);

// The bytes ops owning these lists take, as the memo counts them.
size_t OwnedBytes(const std::deque<std::vector<devices::AttentionSeq>>& seqs,
                  const std::deque<std::vector<int32_t>>& stacks, size_t ops);

}  // namespace internal

// An asynchronous extension of a prediction (window set), or expected ops
// (window null), in flight.
struct RemoteDevice::Prefetch : RemoteDevice::CqTag {
  Endpoint* ep = nullptr;
  std::chrono::steady_clock::time_point sent;  // written on a stream
  uint64_t id = 0;
  std::shared_ptr<Window> window;
  OwnedOps expected;  // window null: the expected ops asked
  int from = 0;       // the request's ops are the window's at this step
  int steps = 0;      // asked for
  uint64_t epoch = 0;
  std::vector<devices::Op> ops;
  std::deque<std::vector<devices::AttentionSeq>> lists;
  servesim::v1::DeviceAgent::Stub* stub = nullptr;
  grpc::ClientContext ctx;
  servesim::v1::EstimateRequest req;
  servesim::v1::EstimateResponse resp;
  std::unique_ptr<grpc::ClientAsyncResponseReader<servesim::v1::EstimateResponse>> reader;
  grpc::Status status;
  std::shared_ptr<Prefetch> self;  // held while in flight (cq_'s tag is `this`)
  // A blocking Estimate's own request, sent as a prefetch is: its answer is
  // left to the caller (finished, status, resp), not memoised here.
  bool blocking = false;
  bool finished = false;
};

// One EstimateStream call to an endpoint: asynchronous Estimates written in
// order, one write at a time, answered in the same order. Every operation on
// it completes on cq_ with one of the three tags, and the taker handles it
// (OnStreamEventLocked).
struct RemoteDevice::Stream {
  Endpoint* ep = nullptr;
  grpc::ClientContext ctx;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<servesim::v1::EstimateRequest, servesim::v1::EstimateResponse>>
      rw;
  bool started = false, writing = false, reading = false;
  bool broken = false;    // an operation failed or the call was cancelled: no more writes
  bool answered = false;  // it has answered at least once
  int pending = 0;        // operations on cq_ not yet taken
  std::deque<std::shared_ptr<Prefetch>> to_write, waiting;
  servesim::v1::EstimateResponse resp;
  CqTag start, write, read;
};

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_REMOTE_DEVICE_INTERNAL_H_
