#include "devices/interrupt.h"

#include <utility>

namespace servesim::devices {

namespace {
thread_local const std::function<absl::Status()>* t_poll = nullptr;
}  // namespace

absl::Status PollInterrupt() { return t_poll != nullptr ? (*t_poll)() : absl::OkStatus(); }

InterruptScope::InterruptScope(std::function<absl::Status()> poll)
    : poll_(std::move(poll)), outer_(t_poll) {
  t_poll = &poll_;
}

InterruptScope::~InterruptScope() { t_poll = outer_; }

}  // namespace servesim::devices
