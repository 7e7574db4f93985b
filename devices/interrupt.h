// Stopping a functional kernel whose caller no longer wants the answer.
//
// Execute() of every device polls PollInterrupt() between heads (and the
// exact kernel every 64 query rows): a long kernel on an agent stops soon
// after its client cancels or its deadline passes, or after the agent's own
// time budget for one call (servesim-agent --call-budget-s), instead of
// computing on for minutes. The poll is the current thread's: the agent's
// handler installs one with an InterruptScope around the call; a thread
// with none (the simulator itself, tests) is never interrupted. A kernel
// that stops returns the poll's status (CANCELLED or DEADLINE_EXCEEDED)
// and keeps no partial state (LAD drops the session's state, rebuilt on the
// next call).
#ifndef SERVESIM_DEVICES_INTERRUPT_H_
#define SERVESIM_DEVICES_INTERRUPT_H_

#include <functional>

#include "absl/status/status.h"

namespace servesim::devices {

// OK while the current thread's call should go on.
absl::Status PollInterrupt();

// Installs `poll` for the current thread for the scope's life (scopes nest;
// the innermost counts).
class InterruptScope {
 public:
  explicit InterruptScope(std::function<absl::Status()> poll);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  std::function<absl::Status()> poll_;
  const std::function<absl::Status()>* outer_;
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_INTERRUPT_H_
