// The device interface: every accelerator kind servesim models implements it.
//
// Contract:
//  - Describe() names the device and lists its parameters and the op kinds it
//    accepts. It never fails.
//  - Estimate() is the cycle model. It is pure (the same ops give the same
//    costs, bit for bit, on any host), batched (one call covers one
//    iteration's ops for one layer on one device instance) and fast (it runs
//    once per simulated iteration). costs[i] receives the cost of ops[i].
//    Ops of a kind the device does not accept give INVALID_ARGUMENT.
//  - Execute() is the functional kernel: real attention on real tensors with
//    the device's algorithm. It returns the output and the statistics the
//    cycle model consumes. Shapes: q [heads, q_len, d_head], k and v
//    [kv_heads, kv_len, d_head]; query i sits at position kv_len - q_len + i
//    and attends causally. Bad shapes give INVALID_ARGUMENT.
//  - A Device is immutable after Create(), so one instance may serve
//    concurrent callers (in-process engines or gRPC handler threads).
//  - Measure() and Absorb() (devices whose description says
//    `measures_steps`; UNIMPLEMENTED elsewhere) split Estimate's expensive
//    part from its cheap one, so that the work can be spread over several
//    agents (agents/remote_device.h). Such a device runs a functional
//    kernel per decode step, keyed by (request id, context length L), and
//    memoises what it measured; Estimate reads the memo and measures the
//    steps it lacks. Measure(steps) measures those steps now (or finds them)
//    and returns their values, with any other step of the same requests the
//    device measured along the way that no earlier Measure returned (a
//    kernel with state across steps may fill in steps it skipped).
//    Absorb(values) puts values measured by another instance of the same
//    spec into the memo: afterwards Estimate and Describe behave exactly as
//    if this instance had measured those steps itself. A request's steps
//    must be measured on one instance, in order, for the values to equal
//    the in-process ones (LAD and SpAtten carry state from step to step).
//  - MeasureAhead(steps) measures steps that a later Measure, Estimate or
//    Absorb is expected to ask, in the time the device would otherwise wait
//    (UNIMPLEMENTED where a device cannot; SpAtten FULL can). What it
//    measures is held apart: it reaches the memo, Describe and the fresh
//    steps only when a step at or after it is asked, exactly as if measured
//    then, so asking ahead never changes a result. It skips steps of
//    requests the device has not measured yet and steps already measured,
//    and returns early (OK) when another call is waiting for the device.
//  - MeasureLayers(steps, part, parts) (devices whose description says
//    `splits_layers`) measures only a share of every step's layers and
//    returns the kernels' additive counts over that share (exact integers),
//    not the step's values; Absorb given all `parts` shares of a step sums
//    them and derives the values exactly as a whole measurement would. So
//    `parts` instances can each take one share of every step.
//  - ExpectSteps() and Expect() are hints, for devices that answer from far
//    away (agents/remote_device.h; 0 and a no-op elsewhere). ExpectSteps()
//    is how many iterations ahead the simulation should say what it expects
//    to ask; Expect(ops, steps) says it: ops that coming iterations will
//    probably send to Estimate (the planner's projection of the running
//    batch if no request arrives: scheduler::ReplicaScheduler::Project),
//    and, where steps[i] > 0 and op i is an attention op whose sequences
//    all decode (new_tokens 1), the same op at its next steps[i] decode
//    steps (every past_tokens + 1, + 2, ...). `steps` is empty or one per
//    op. A device may cost them ahead of time. Hints never change an answer, so a run gives
//    the same results with or without them; a wrong hint costs only the
//    work of answering it. Thread-safe like Estimate; the spans need not
//    outlive the call.
//  - ExpectLater(ops): ops a later call may send to Estimate, in no hurry
//    (the prefill step of a request on its way, scheduler::IterationPlanner::
//    ExpectLater). A remote device sends them along with its next round
//    trip, never on one of their own. A hint, like Expect's.
//  - Remote() and Prepare(ops): Remote() says the device answers from far
//    away, so Estimate may block on a round trip (false elsewhere).
//    Prepare(ops) says Estimate(ops) follows soon from the same caller: a
//    remote device starts asking now, without waiting, so that the call the
//    caller makes to another device in between overlaps it (the planner
//    prepares the attention device's ops before it asks the xPU device when
//    both are remote). The later Estimate waits for that answer. Prepare
//    never changes an answer; it is a no-op elsewhere.
#ifndef SERVESIM_DEVICES_DEVICE_H_
#define SERVESIM_DEVICES_DEVICE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "devices/ops.h"
#include "devices/tensor.h"

namespace servesim::devices {

struct DeviceDescription {
  std::string kind;    // registry name, e.g. "gpu"
  std::string preset;  // hardware preset, e.g. "a100-80gb"
  std::vector<std::pair<std::string, double>> parameters;  // name_unit -> value
  std::vector<OpKind> accepts;
  double memory_bytes = 0;
  // Estimate may be asked ahead of time, for ops the simulation may never
  // send (the agents' lookahead, agents/remote_device.h): answering has no
  // effect on later answers or on Describe, and is cheap. Devices that keep
  // statistics of what they were asked, or run a functional kernel per op
  // (FULL fidelity), say false.
  bool lookahead_ok = false;
  // Power the device draws whenever it is powered (leakage, memory
  // background and refresh; an idle GPU's board power), W for the whole
  // device: the simulation charges it over the run (docs/energy.md).
  // `static_in_op_energy`: Estimate's energy already charges it for each
  // op's time, so only the device's idle time is added.
  double static_power_w = 0;
  bool static_in_op_energy = false;
  // Measure() and Absorb() are implemented and worth spreading: Estimate
  // runs a kernel per (request, L) decode step (FULL fidelity).
  bool measures_steps = false;
  // MeasureLayers() is implemented: a step's layers may be measured apart.
  bool splits_layers = false;
  // What a measured step costs in kernel time, in units of what one context
  // position adds to a steady step: a step at context L costs
  // L + step_base_positions; a request's first step here, which builds its
  // state for its prompt, costs first_step_positions_per_token x L more.
  // Whole-request placement over agents weighs requests by it
  // (agents/remote_device.cc); 0 where not profiled.
  double step_base_positions = 0;
  double first_step_positions_per_token = 0;
};

// One decode step of one request, as Measure() takes it.
struct StepKey {
  int64_t request_id = -1;
  int64_t l = 0;  // context length: past tokens + the new one
  bool operator==(const StepKey& o) const { return request_id == o.request_id && l == o.l; }
  template <typename H>
  friend H AbslHashValue(H h, const StepKey& k) {
    return H::combine(std::move(h), k.request_id, k.l);
  }
};

// What a device measured on one step: the figures its cycle model reads
// (the device's own, in its own order; at most kMaxStepValues).
struct StepMeasurement {
  StepKey step;
  std::vector<double> values;
  // parts > 1: `values` are the counts of share `part` of the step's layers
  // (layers [layers * part / parts, layers * (part + 1) / parts)).
  int32_t part = 0;
  int32_t parts = 1;
};
inline constexpr int kMaxStepValues = 16;
inline constexpr int kMaxLayerParts = 64;

struct AttentionCall {
  Tensor q, k, v;
  float scale = 0;  // 0: use 1/sqrt(d_head)
  // The agent session the call steps (agents/agent_service.h), so a kernel
  // with state across decode steps (LAD) can keep it per session; -1: none.
  int64_t session = -1;
};

// What the kernel did; the cycle model's inputs, measured.
struct KernelStats {
  // Counted over (query head, query, key position) triples the causal mask
  // allows: how many there are, for how many the kernel read K, and for how
  // many it read V. Exact attention reads all of them.
  int64_t kv_positions = 0;
  int64_t kv_positions_read = 0;
  int64_t v_rows_read = 0;
  double bytes_read = 0;      // K, V and Q bytes read
};

struct AttentionResult {
  Tensor out;  // fp32, [heads, q_len, d_head]
  KernelStats stats;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceDescription Describe() const = 0;
  virtual absl::Status Estimate(absl::Span<const Op> ops,
                                absl::Span<Cost> costs) const = 0;
  virtual absl::StatusOr<AttentionResult> Execute(
      const AttentionCall& call) const = 0;
  virtual absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const;
  virtual absl::Status Absorb(absl::Span<const StepMeasurement> measured) const;
  virtual absl::Status MeasureAhead(absl::Span<const StepKey> steps) const;
  virtual absl::StatusOr<std::vector<StepMeasurement>> MeasureLayers(
      absl::Span<const StepKey> steps, int part, int parts) const;
  virtual int ExpectSteps() const { return 0; }
  virtual void Expect(absl::Span<const Op> /*ops*/, absl::Span<const int32_t> /*steps*/) const {}
  virtual void ExpectLater(absl::Span<const Op> /*ops*/) const {}
  virtual bool Remote() const { return false; }
  virtual void Prepare(absl::Span<const Op> /*ops*/) const {}
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_DEVICE_H_
