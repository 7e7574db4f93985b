// A device served by remote agents (servesim-agent, agents/agent_service.h),
// behind the same devices::Device interface as an in-process one, so nothing
// else in the simulator changes.
//
// PARAMETERS AND BEHAVIOUR
//  - spec: the device wanted; it is bound on each agent with Describe (the
//    agent creates it once and returns its key). An agent that forgot the
//    key (restarted) answers NOT_FOUND and the client binds again. With
//    several endpoints, the first call binds them all at once, not each
//    when first used (creating a device may calibrate it, which can take
//    seconds on each agent).
//  - endpoints: agents serving the same device kind. Calls go round-robin
//    over the endpoints that are up. A call that ends UNAVAILABLE or
//    DEADLINE_EXCEEDED is retried on the same endpoint with exponential
//    backoff (attempts_per_endpoint times), then the endpoint is marked down
//    for down_s wall seconds and the call fails over to the next one. When
//    every endpoint failed, the call goes round them all again, backing off
//    (up to backoff_max_s between rounds), until retry_s have passed since
//    it started; then it is UNAVAILABLE, naming the device, the endpoints
//    tried and, where the error says a TLS or certificate mismatch is the
//    likely cause, which flag to check. Other codes are the agent's answer
//    and are returned.
//  - deadline_s: per call (bind_deadline_s for Describe, which may create a
//    calibrated device).
//  - Estimate answers are memoised per op, keyed by the op's exact inputs
//    (every field, the sequences and the stack placement, doubles by their
//    bits): the cycle model is pure, so a hit is the answer the agent would
//    give. Only the ops that miss go to the agent, in one call. An op's
//    shape (every field but its lists) and its sequence and stack lists are
//    interned (stored once, by content) and its key names the three by id,
//    so a call hashes each list once, not once per op, and keys are small.
//    The memo, the shapes and the lists are cleared together when they pass
//    memo_bytes. Hits and misses are counted.
//  - Lookahead: a call that misses also asks the agent for the next 8
//    decode steps of its decode-attention ops (EstimateRequest.lookahead:
//    each sequence's past_tokens + j), which go into the memo as a
//    prediction. While the batch does not change, iteration i + j sends
//    exactly those ops, so it hits and makes no round trip. When a call hits
//    within 6 steps of its prediction's end, the client asks for the next 16
//    steps (at most lookahead_max) asynchronously, so the agent costs them
//    on its own core while the simulation goes on; a batch that stays
//    unchanged need not wait. Only a changed batch (a request
//    joins or leaves) makes a blocking round trip. This changes how many
//    round trips a run makes and when, never a cost. lookahead_max 0 turns
//    it off.
//  - Expected ops (devices::Device::Expect): the simulation tells the
//    device, ExpectSteps() iterations ahead, what it expects to ask (the
//    planner's projection of the running batch: requests leave when their
//    output is done, and a prefill's requests join the decode batch after
//    it), each run of steps with the same requests as its first step's ops
//    and a count of further steps. The ops not in the memo wait in a list;
//    the next call that misses carries them (EstimateRequest.expected and
//    expected_steps: the agent derives the further steps, as it does the
//    lookahead's), or, when every op of a call hits, they go at once
//    asynchronously. A call that misses while such a call is in flight
//    waits for its answer first (the next iteration's ops are usually in
//    it). An expected op's further steps are kept as one run (its costs
//    from its first sequence's length on, keyed by its sequence list
//    relative to that first sequence), not as an entry per step: a step is
//    found by the op's relative list and its first sequence's length, so
//    neither the answer nor the lookup interns a list per step. Once told, the client stops its own
//    lookahead: the projection knows who leaves when. Only devices whose description says
//    lookahead_ok take hints (ExpectSteps() is 0 otherwise), so
//    FULL-fidelity devices are never asked ahead. Ops told by ExpectLater
//    (an arriving request's prefill) wait in the same list but are not due:
//    a call whose ops all hit sends the list only if Expect added to it,
//    so they ride along with a call made anyway and never make one.
//  - Prepared ops (devices::Device::Prepare): the planner says which ops
//    it will ask next before it asks another device; the ops the memo
//    lacks (with the expected ops waiting) go at once, asynchronously, and
//    the Estimate that follows waits for that answer. So the attention
//    device's round trip overlaps the xPU device's when both are on agents.
//    Only for devices that take hints (lookahead_ok), and not for one whose
//    steps are spread (its Measure calls already run concurrently).
//  - Measured steps spread over the endpoints: a device whose description
//    says measures_steps (FULL fidelity of topick, spatten, cta, lad: a
//    kernel per (request, L) decode step, the expensive part of Estimate)
//    served by several endpoints has its steps measured on all of them
//    (Measure), the calls of one Estimate running concurrently, one thread
//    per endpoint, joined in endpoint order. Where the description also
//    says splits_layers (topick, cta), endpoint e of n measures share e of
//    every step's layers (MeasureLayers) and answers the kernels' integer
//    counts, so each step's work is split evenly and each endpoint keeps
//    the state of its own layers. Otherwise (spatten, lad: state carried
//    from step to step through the layers) each request is measured whole
//    on one endpoint, chosen when it is first seen (the one with the least
//    work left: the sum of L over its requests' remaining steps, from
//    AttentionSeq::final_tokens; the most work placed first) and kept.
//    Between the calls that ask them, each such endpoint measures its
//    requests' next steps ahead (Measure with `ahead`, one step a call, on
//    a thread per endpoint; devices::Device::MeasureAhead), which the
//    device holds apart until asked, so results never depend on it. The
//    first endpoint (the home) then costs the ops with the others' measurements absorbed
//    (EstimateRequest.measured; shares summed, then the fractions taken)
//    and answers Describe. Its memo thus holds every step, as an in-process
//    device's would, so costs and the description are byte-identical for
//    any number of endpoints; only the kernels' wall time is shared out.
//    Other devices go round-robin as above (their Estimate is cheap: a
//    call would cost more to split than to run).
//  - Estimate streams: the asynchronous asks (lookahead extensions,
//    expected and prepared ops) go on one EstimateStream call per endpoint,
//    written one at a time and answered in order, not on a call each. An
//    answer later than deadline_s cancels the stream (what waited on it is
//    asked again); an endpoint whose stream ended before answering, or was
//    refused, takes plain calls for the rest of the run. A device with one
//    endpoint, not spread, asks its blocking Estimates on the stream too,
//    once the endpoint is bound; if the stream fails or answers amiss, the
//    plain call (with its retries) asks again. Devices with several
//    endpoints block on plain calls, round-robin as above.
//  - TLS: with tls_ca_file set the channel is TLS (the agent's certificate
//    must chain to that CA); tls_cert_file/tls_key_file add a client
//    certificate. token adds `authorization: Bearer <token>` to every call.
// Thread-safe.
// The definitions are split by job over agents/remote_device*.cc and
// agents/remote_session.cc (agents/remote_device_internal.h lists them).
#ifndef SERVESIM_AGENTS_REMOTE_DEVICE_H_
#define SERVESIM_AGENTS_REMOTE_DEVICE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "agents/client_options.h"
#include "devices/device.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "servesim/v1/agent.grpc.pb.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::agents {

struct RemoteStats {
  std::vector<std::string> endpoints;
  int64_t estimate_calls = 0;  // Estimate() calls made by the simulator
  int64_t estimate_rpcs = 0;   // of them, how many went to an agent
  int64_t ops_memo_hits = 0;
  int64_t ops_memo_misses = 0;
  int64_t predicted_ops = 0;      // costs received ahead (lookahead) into the memo
  int64_t prefetch_rpcs = 0;      // of estimate_rpcs, asynchronous prediction extensions
  int64_t prefetch_failures = 0;  // of them, failed (ignored: a later call asks again)
  int64_t other_rpcs = 0;         // Describe (binds), Execute, sessions
  int64_t retries = 0;            // re-sent after UNAVAILABLE / DEADLINE_EXCEEDED
  int64_t failovers = 0;          // moved to another endpoint
  int64_t rebinds = 0;            // agent had forgotten the device (restart)
  int64_t session_rebuilds = 0;
  // Spread measurement (measures_steps devices over several endpoints):
  // Measure calls, and the steps each endpoint measured.
  int64_t measure_rpcs = 0;
  std::vector<int64_t> measured_steps;  // per endpoint
  // Steps asked ahead (MeasureAhead, whole requests spread), and those
  // calls that failed (ignored: the step is measured when asked).
  int64_t ahead_rpcs = 0;
  int64_t ahead_failures = 0;
  // Expected ops (Expect) costed into the memo, memo hits on them, and
  // calls that missed and waited for an expectation in flight.
  int64_t expected_ops = 0;
  int64_t expected_hits = 0;
  int64_t expect_waits = 0;
  // Asynchronous calls Prepare started, and the ops they asked.
  int64_t prepare_rpcs = 0;
  int64_t prepared_ops = 0;
};

class RemoteSession;

class RemoteDevice : public devices::Device {
 public:
  // `label` names the device in errors, e.g. "attention device (attacc)".
  // Validates the endpoints and reads the TLS files; does not connect.
  static absl::StatusOr<std::unique_ptr<RemoteDevice>> Create(servesim::v1::DeviceSpec spec,
                                                              std::vector<std::string> endpoints,
                                                              ClientOptions options,
                                                              std::string label);

  // Asks an agent; if none answers, the last description seen (or the kind
  // alone), as the contract says Describe never fails.
  ~RemoteDevice() override;  // waits for its prefetches

  devices::DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const devices::Op> ops,
                        absl::Span<devices::Cost> costs) const override;
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override;
  // kExpectSteps (at most the lookahead cap) for a device whose
  // description says lookahead_ok; else 0. Asks an agent the first time.
  int ExpectSteps() const override;
  void Expect(absl::Span<const devices::Op> ops, absl::Span<const int32_t> steps) const override;
  static constexpr int kExpectSteps = 32;
  bool Remote() const override { return true; }
  void Prepare(absl::Span<const devices::Op> ops) const override;
  // Adds the ops to the expected ops waiting without making them due: an
  // Estimate whose ops all hit sends what waits only if Expect added some.
  void ExpectLater(absl::Span<const devices::Op> ops) const override;

  // Describe, with its status (connectivity checks, tests).
  absl::StatusOr<devices::DeviceDescription> DescribeOrError() const;
  // A session for one request on whichever agent is up.
  absl::StatusOr<std::unique_ptr<RemoteSession>> OpenSession(int64_t request_id, int64_t kv_heads,
                                                             int64_t d_head,
                                                             devices::ElementType type) const;

  RemoteStats Stats() const;
  // Returns once no prediction extension is in flight (tests, shutdown).
  void WaitForPrefetches() const;
  // Returns once the binds of the first call (BindAllOnce) have ended
  // (tests; the destructor cancels those still in flight).
  void WaitForBinds() const;
  const std::string& label() const { return label_; }

 private:
  friend class RemoteSession;
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<servesim::v1::DeviceAgent::Stub> stub;
    // Guarded by mu_.
    std::string device_key;
    bool bound = false;
    bool binding = false;    // a first bind (BindAllOnce) is in flight
    bool no_stream = false;  // an estimate stream ended unanswered: unary prefetches
    std::chrono::steady_clock::time_point down_until{};
  };
  using Rpc = std::function<grpc::Status(servesim::v1::DeviceAgent::Stub* stub,
                                         const std::string& device_key, grpc::ClientContext* ctx)>;

  RemoteDevice(servesim::v1::DeviceSpec spec, ClientOptions options, std::string label);
  // Runs `rpc` with binding, retries and fail-over; `preferred` >= 0 starts
  // there (sessions stay on their agent). Sets *used to the endpoint that
  // answered.
  absl::Status Call(const char* method, const Rpc& rpc, int preferred = -1,
                    int* used = nullptr) const;
  // The endpoints a call tries, in order: `preferred` (or the next up,
  // round-robin), the others that are up, then those marked down at `now`.
  std::vector<int> CallOrder(int preferred, std::chrono::steady_clock::time_point now) const;
  absl::Status BindLocked(Endpoint* ep, grpc::ClientContext* ctx = nullptr) const;
  // The first time a device with several endpoints calls: binds every
  // endpoint at once, each on its own thread, and returns without waiting
  // (a call to an endpoint still binding waits for that bind). Binding may
  // create and calibrate the device on the agent; one endpoint after the
  // other, the last would start seconds after the first.
  void BindAllOnce() const;
  // Whether Estimate spreads measured steps over the endpoints (binds the
  // home endpoint to find out, once).
  absl::StatusOr<bool> Spread() const;
  // Describe on `preferred` (-1: round-robin), remembered as the last
  // description.
  absl::StatusOr<devices::DeviceDescription> DescribeAt(int preferred) const;
  // Measures the decode steps of `ops` that the home does not hold yet on
  // their requests' endpoints, concurrently; `*absorb` receives what the
  // home must absorb, `*steps` every step it will then hold.
  absl::Status MeasureSpread(absl::Span<const devices::Op> ops,
                             std::vector<devices::StepMeasurement>* absorb,
                             std::vector<devices::StepKey>* steps) const;
  // MeasureSpread's parts. PlaceRequestsLocked gives each step the home does
  // not hold to its request's endpoint's `share`, placing the requests not
  // seen yet by the work they have left (mu_ held). MeasureShare measures
  // endpoint e's share on e (or the next endpoint up) and appends to `*got`
  // what the home must absorb.
  void PlaceRequestsLocked(absl::Span<const devices::StepKey> steps,
                           const absl::flat_hash_map<int64_t, int64_t>& final_of,
                           std::vector<std::vector<devices::StepKey>>* share) const;
  absl::Status MeasureShare(int e, absl::Span<const devices::StepKey> share, bool layers,
                            const absl::flat_hash_map<int64_t, int64_t>& final_of,
                            std::vector<devices::StepMeasurement>* got) const;
  // Measuring ahead: the endpoints' threads start once (whole requests
  // spread over them); Busy marks a call of the run's in flight to an
  // endpoint (its thread waits meanwhile); Hold tells endpoint `e` the
  // steps it was just asked, so it goes on from them; AheadLoop is endpoint
  // e's thread: it asks, one step a call, the next step of the request it
  // holds that is least far ahead, up to the request's last step.
  void StartAheadOnce() const;
  void Busy(int e, int delta) const;
  void Hold(int e, absl::Span<const devices::StepKey> asked,
            const absl::flat_hash_map<int64_t, int64_t>& final_of) const;
  void AheadLoop(int e) const;
  // What a failed connection suggests checking ("" if nothing): what
  // listens at `address` (agents/endpoint_probe.h), else the error's words.
  std::string ConnectHint(const grpc::Status& st, const std::string& address) const;
  void PrepareContext(grpc::ClientContext* ctx, double deadline_s) const;

  servesim::v1::DeviceSpec spec_;
  ClientOptions options_;
  std::string label_;
  std::string kind_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  // An op's inputs but its lists (interned too: a run has few shapes).
  struct ShapeKey {
    // m, n, k, heads, kv_heads, d_head, head range, elements, tokens,
    // sequences, MLA's kv_latent, d_rope, d_value, MoE's experts_total,
    // top_k, expert_matrices, the sliding window
    std::array<int64_t, 18> ints{};
    // bytes_per_element, flops_per_element, bytes, MoE's routed and
    // experts_touched
    std::array<uint64_t, 5> bits{};
    int32_t participants = 0;
    uint8_t kind = 0, stage = 0;
    bool operator==(const ShapeKey& o) const {
      return ints == o.ints && bits == o.bits && participants == o.participants && kind == o.kind &&
             stage == o.stage;
    }
    template <typename H>
    friend H AbslHashValue(H h, const ShapeKey& k) {
      return H::combine(std::move(h), k.ints, k.bits, k.participants, k.kind, k.stage);
    }
  };
  // An op's inputs: its shape and its sequence and stack lists, each by
  // interned id (lists: 0 for none). Small, so the memo stays compact.
  struct MemoKey {
    uint32_t shape = 0, seq_list = 0, stack_list = 0;
    bool operator==(const MemoKey& o) const {
      return shape == o.shape && seq_list == o.seq_list && stack_list == o.stack_list;
    }
    template <typename H>
    friend H AbslHashValue(H h, const MemoKey& k) {
      return H::combine(std::move(h), k.shape, k.seq_list, k.stack_list);
    }
  };
  struct MemoEntry {
    devices::Cost cost;
    int32_t step = 0;     // prediction step it was answered at; 0: asked for; -1: expected
    uint64_t window = 0;  // the prediction it belongs to; 0: none
  };
  // A prediction: the ops it started from (owning their lists) and how many
  // steps ahead of them the memo holds.
  struct Window {
    std::vector<devices::Op> ops;
    std::deque<std::vector<devices::AttentionSeq>> seqs;
    std::deque<std::vector<int32_t>> stacks;
    int horizon = 0;
    bool extending = false;
  };
  struct Prefetch;
  struct Stream;
  // What cq_ hands back: a unary prefetch (kind 0, the Prefetch itself) or
  // one of a stream's operations.
  enum : int { kUnary = 0, kStreamStart, kStreamWrite, kStreamRead };
  struct CqTag {
    int kind = kUnary;
    Stream* stream = nullptr;
  };
  // Takes a stream operation's completion: the prefetches it answered, or
  // failed if the stream ended. mu_ held.
  void OnStreamEventLocked(CqTag* t, bool ok, std::vector<std::shared_ptr<Prefetch>>* done) const;
  // Writes the next prefetch and reads the next answer, where none is in
  // progress. mu_ held.
  void StreamSendLocked(Stream* s) const;
  // Cancels streams whose oldest answer is overdue (deadline_s). mu_ held.
  void CancelHungStreamsLocked() const;
  // Ops owning their lists (Expect's, waiting to be sent).
  struct OwnedOps {
    std::vector<devices::Op> ops;
    std::deque<std::vector<devices::AttentionSeq>> seqs;
    std::deque<std::vector<int32_t>> stacks;
    int64_t sequences = 0;       // over the ops
    std::vector<int32_t> steps;  // per op: decode steps after it also expected
    std::vector<MemoKey> keys;   // the ops' keys, at memo epoch `epoch`
    uint64_t epoch = 0;
    bool due = false;  // holds Expect's ops (ExpectLater's alone wait for a call)
  };
  // Addresses `p` to `ep` and counts it in flight (StartPrefetch sends
  // it). mu_ held.
  void LaunchLocked(Endpoint* ep, Prefetch* p) const;
  // Prepares an asynchronous call with the expected ops waiting (null if
  // the endpoint is not bound and up). mu_ held.
  std::shared_ptr<Prefetch> SendExpectedLocked() const;
  // Adds the ops of `ops` that are neither in the memo nor waiting or in
  // flight to the expected ops waiting (`steps`: as Expect's); stops at the
  // bounds on what waits. mu_ held.
  void AddPendingLocked(absl::Span<const devices::Op> ops, absl::Span<const int32_t> steps) const;
  // Memoises the first `answered` of `expected` with their steps, costs
  // unique[index[at]], unique[index[at + 1]] ... (by blocks, as agent.proto
  // says; DecodeCostTable's form), and forgets them all as pending. mu_
  // held.
  void InsertExpectedLocked(const OwnedOps& expected, int answered,
                            absl::Span<const devices::Cost> unique,
                            absl::Span<const uint32_t> index, size_t at) const;
  // Prepares the asynchronous extension of window `id` (null if its
  // endpoint is not bound and up); StartPrefetch, without mu_, sends it.
  // mu_ held.
  std::shared_ptr<Prefetch> ExtendLocked(uint64_t id, const std::shared_ptr<Window>& window) const;
  // Sends `p` on cq_ (mu_ not held); its answer is taken by PollAnswers.
  void StartPrefetch(const std::shared_ptr<Prefetch>& p) const;
  void OnExtended(const std::shared_ptr<Prefetch>& p, const grpc::Status& st) const;
  // Takes the answers cq_ holds and memoises them (OnExtended), on the
  // calling thread; with `until_idle`, waits until none is in flight; with
  // `until`, until that blocking request has its answer. mu_ not held.
  void PollAnswers(bool until_idle, const Prefetch* until = nullptr) const;
  // Memo entries for steps [from, from + steps) of `window`, costs from
  // costs[at]. mu_ held.
  void InsertStepsLocked(uint64_t id, const Window& window, int from, int steps,
                         absl::Span<const devices::Cost> costs, size_t at) const;
  // The interned id of a list's content (bytes), adding it if new. mu_
  // held.
  uint32_t InternLocked(const std::string& content) const;
  // Keys of `ops`, interning their lists. `seqs_only`: `keys` hold these
  // ops' keys but for their sequence lists; only those are recomputed. mu_
  // held.
  void KeysLocked(absl::Span<const devices::Op> ops, std::vector<MemoKey>* keys,
                  bool seqs_only = false) const;
  // The interned id of an op's shape (every input but its lists). mu_ held.
  uint32_t ShapeIdLocked(const devices::Op& op) const;
  // The interned id of a non-empty stack list (`add`: interning it if new;
  // else 0 if unknown). mu_ held.
  uint32_t StackListIdLocked(absl::Span<const int32_t> stacks, bool add) const;
  // Run keys of the predictable ops of `ops` (others: shape 0) and each
  // one's offset (its first sequence's past_tokens). `add`: intern lists
  // not seen yet; else an op whose list is unknown gets shape 0 (no run
  // holds it). mu_ held.
  void RunKeysLocked(absl::Span<const devices::Op> ops, bool add, std::vector<MemoKey>* keys,
                     std::vector<int64_t>* offsets) const;
  // The cost a run holds for `key` at `offset`, or null. mu_ held.
  const devices::Cost* FindRunLocked(const MemoKey& key, int64_t offset) const;
  // Empties the memo and the lists if they hold more than memo_bytes. mu_
  // held.
  void TrimLocked() const;
  // Estimate's parts (agents/remote_device_estimate.cc).
  // Answers the ops of `ops` a run or the memo holds into `costs`, keys the
  // others (`keys`, by op) and lists them in `missed` and `missed_ops`;
  // returns the extension of a prediction near its end to start, or null.
  // mu_ held.
  std::shared_ptr<Prefetch> LookUpLocked(absl::Span<const devices::Op> ops,
                                         absl::Span<devices::Cost> costs,
                                         std::vector<MemoKey>* keys, std::vector<size_t>* missed,
                                         std::vector<devices::Op>* missed_ops) const;
  // After a wait for answers in flight: answers the missed ops that are now
  // in the memo and keeps the others (`keys` then holds the missed ops').
  // mu_ held.
  void LookUpMissedLocked(absl::Span<devices::Cost> costs, std::vector<MemoKey>* keys,
                          std::vector<size_t>* missed, std::vector<devices::Op>* missed_ops) const;
  // Drops from `extra` the expected ops without steps that the call asks
  // anyway. mu_ held.
  void DropAskedLocked(absl::Span<const devices::Op> missed_ops, OwnedOps* extra) const;
  // The blocking request: the missed ops, the expected ops riding along,
  // the lookahead asked and the steps the home absorbs.
  static void EncodeMissed(absl::Span<const devices::Op> missed_ops, const OwnedOps& extra,
                           int lookahead, absl::Span<const devices::StepMeasurement> absorb,
                           servesim::v1::EstimateRequest* req);
  // Decodes an answer to that request into `unique` and `index` (as
  // DecodeCostTable gives them) and checks that it holds `missed` ops'
  // costs, their lookahead steps and the expected ops it says it answered.
  static grpc::Status TakeAnswer(const servesim::v1::EstimateResponse& resp, int lookahead,
                                 const OwnedOps& extra, size_t missed, size_t predictable,
                                 std::vector<devices::Cost>* unique, std::vector<uint32_t>* index);
  // Asks `*req` on the endpoint's estimate stream, if it is bound, up and
  // takes streams; true if the answer came and `take` accepted it. `*req`
  // comes back (with the endpoint's device key), for a plain call to ask
  // again.
  bool AskOnStream(servesim::v1::EstimateRequest* req, servesim::v1::EstimateResponse* resp,
                   int* used, absl::FunctionRef<grpc::Status()> take) const;
  // Memoises the missed ops' costs and, where the answer holds lookahead
  // steps, a prediction (window) with them. mu_ held.
  void MemoiseAnswerLocked(absl::Span<const devices::Op> missed_ops,
                           absl::Span<const size_t> missed, absl::Span<const MemoKey> keys,
                           absl::Span<const devices::Cost> costs,
                           absl::Span<const devices::Cost> answer, int answered,
                           size_t predictable) const;

  mutable std::mutex mu_;  // endpoint state, memo, stats, last description
  mutable std::once_flag bind_all_;
  mutable std::vector<std::thread> binders_;               // BindAllOnce's; joined at destruction
  mutable std::deque<grpc::ClientContext> bind_contexts_;  // theirs, to cancel
  mutable std::condition_variable bound_;                  // a BindAllOnce bind ended
  mutable size_t next_ = 0;
  mutable absl::flat_hash_map<MemoKey, MemoEntry> memo_;
  // Expected ops' runs of steps. A predictable op (devices::Op attention,
  // every sequence decoding) and its next decode steps differ only in
  // their sequences' past_tokens, all + j at step j; so a run is keyed by
  // the op's shape, its stack list and its sequence list relative to the
  // first sequence (request ids, new tokens, past_tokens less the
  // first's), and holds the costs from `base` (the first sequence's
  // past_tokens at step 0) to base + steps. One entry and one interned
  // list per expected op, not one per step. The runs of all keys lie in one
  // vector, each key's linked from its newest (the one the simulation is
  // in) back, and the map holds a key's newest: no vector per key to
  // allocate, and a lookup touches one slot and one run.
  struct Run {
    int64_t base = 0;
    int32_t steps = 0;
    uint32_t first = 0;  // its costs: cost_pool_[run_steps_[first .. first + steps]]
    uint32_t older = 0;  // the key's run before it, + 1 (0: none)
  };
  mutable absl::flat_hash_map<MemoKey, uint32_t> runs_;  // key -> its newest run's index
  mutable std::vector<Run> run_list_;
  // The runs' steps name their costs in a pool, which holds each answer's
  // costs once apiece (a cost equal to the one before it in the answer is
  // not stored again): 4 bytes a step instead of a Cost's 120.
  mutable std::vector<uint32_t> run_steps_;
  mutable std::vector<devices::Cost> cost_pool_;
  mutable absl::flat_hash_map<std::string, uint32_t> lists_;  // content -> id
  // Relative sequence lists RunKeysLocked found lately (content, id, at
  // memo epoch), one per slot, a slot chosen by the list's length and first
  // request: a batch that does not change asks the same list every step.
  struct RecentList {
    std::string bytes;
    uint32_t id = 0;
    uint64_t epoch = 0;
  };
  mutable std::array<RecentList, 16> recent_lists_;
  mutable std::array<RecentList, 16> recent_stacks_;  // StackListIdLocked's
  // Shapes ShapeIdLocked found lately, the same way.
  struct RecentShape {
    ShapeKey key;
    uint32_t id = 0;
    uint64_t epoch = 0;
  };
  mutable std::array<RecentShape, 64> recent_shapes_;
  mutable absl::flat_hash_map<ShapeKey, uint32_t> shapes_;  // shape -> id
  mutable size_t memo_bytes_ = 0;                           // lists' content plus entries
  mutable uint64_t memo_epoch_ = 0;                         // bumped when the memo is emptied
  mutable absl::flat_hash_map<uint64_t, std::shared_ptr<Window>> windows_;
  mutable uint64_t next_window_ = 1;
  mutable int last_endpoint_ = 0;  // that answered an Estimate; prefetches go there
  mutable int inflight_ = 0;       // prefetches not yet answered
  mutable absl::flat_hash_set<Prefetch*> prefetches_;  // those, to cancel
  // Their answers land here, and the threads that need them (Estimate,
  // WaitForPrefetches) take them: no thread of gRPC's wakes for an answer
  // and hands it over (docs/agents.md#cost).
  mutable grpc::CompletionQueue cq_;
  // Estimate streams (guarded by mu_); after cq_, so destroyed before it.
  mutable std::vector<std::unique_ptr<Stream>> streams_;
  mutable RemoteStats stats_;
  mutable devices::DeviceDescription last_description_;
  // Spread measurement. spread_: -1 unknown, 0 no, 1 yes.
  mutable int spread_ = -1;
  mutable bool splits_ = false;                      // the description's splits_layers
  mutable double step_base_ = 0, first_step_ = 0;    // its step costs, for placement
  mutable absl::flat_hash_map<int64_t, int> owner_;  // request -> endpoint measuring it
  mutable int next_owner_ = 0;
  mutable absl::flat_hash_set<devices::StepKey> home_holds_;  // steps in the home's memo
  // Measuring ahead (guarded by ahead_mu_, taken before mu_ where both
  // are): per endpoint, the requests it holds, as (asked: the last step a
  // call asked; next: the next to ask ahead; last: the request's last
  // decode step, from final_tokens), the calls of the run's in flight to it
  // and the context of its call ahead in flight (to cancel).
  struct AheadStep {
    int64_t asked = 0, next = 0, last = 0;
  };
  struct AheadWork {
    absl::flat_hash_map<int64_t, AheadStep> requests;
    int busy = 0;
    grpc::ClientContext* inflight = nullptr;
  };
  mutable std::once_flag ahead_once_;
  mutable std::mutex ahead_mu_;
  mutable std::condition_variable ahead_cv_;
  mutable std::vector<AheadWork> ahead_;
  mutable std::vector<std::thread> ahead_threads_;
  mutable bool ahead_stop_ = false;
  mutable bool ahead_refused_ = false;  // the agent answered UNIMPLEMENTED
  // Expectations: the description's lookahead_ok (-1 unknown), whether
  // Expect was called, the ops waiting and the keys of those waiting or in
  // flight.
  mutable int lookahead_ok_ = -1;
  mutable bool expecting_ = false;
  mutable bool prepared_ = false;  // Prepare was called: a miss waits for answers in flight
  mutable OwnedOps pending_;
  mutable absl::flat_hash_set<MemoKey> pending_keys_;
};

// One request's KV cache on an agent (the session API). Keeps the KV it
// appended, so when its agent restarts (NOT_FOUND) or fails over, it opens
// a new session and appends the history again before going on.
class RemoteSession {
 public:
  ~RemoteSession();  // closes the session (best effort)
  // k, v [kv_heads, n, d_head].
  absl::Status AppendKv(const devices::Tensor& k, const devices::Tensor& v);
  // Attention of q [heads, q_len, d_head] over everything appended.
  absl::StatusOr<devices::AttentionResult> Step(const devices::Tensor& q, float scale = 0);
  int64_t kv_len() const { return kv_len_; }
  const std::string& session_id() const { return session_id_; }

 private:
  friend class RemoteDevice;
  RemoteSession(const RemoteDevice* device, int64_t request_id, int64_t kv_heads, int64_t d_head,
                devices::ElementType type)
      : device_(device),
        request_id_(request_id),
        kv_heads_(kv_heads),
        d_head_(d_head),
        type_(type) {}
  // Opens a session and replays the history (on `endpoint` if >= 0).
  absl::Status Rebuild(int endpoint);
  // Runs `rpc` on the session's agent, rebuilding the session once if the
  // agent lost it or the call failed over.
  absl::Status WithSession(const std::function<grpc::Status(servesim::v1::DeviceAgent::Stub*,
                                                            grpc::ClientContext*)>& rpc);

  const RemoteDevice* device_;
  int64_t request_id_, kv_heads_, d_head_;
  devices::ElementType type_;
  std::vector<std::pair<devices::Tensor, devices::Tensor>> history_;
  int64_t kv_len_ = 0;
  int endpoint_ = -1;
  std::string session_id_;
};

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_REMOTE_DEVICE_H_
