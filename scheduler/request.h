// A request as the workload describes it: when it arrives and how long its
// prompt and its answer are.
#ifndef SERVESIM_SCHEDULER_REQUEST_H_
#define SERVESIM_SCHEDULER_REQUEST_H_

#include <cstdint>

namespace servesim::scheduler {

struct RequestSpec {
  int64_t id = 0;             // 0-based, in arrival order
  double arrival_s = 0;       // simulated arrival time
  int64_t input_tokens = 0;   // prompt length, >=1
  int64_t output_tokens = 0;  // tokens to generate, >=1
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_REQUEST_H_
