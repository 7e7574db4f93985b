// A request as the workload describes it: when it arrives, how long its
// prompt and its answer are, and (when the trace says) what its prompt
// shares with others.
#ifndef SERVESIM_SCHEDULER_REQUEST_H_
#define SERVESIM_SCHEDULER_REQUEST_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace servesim::scheduler {

struct RequestSpec {
  int64_t id = 0;             // 0-based, in arrival order
  double arrival_s = 0;       // simulated arrival time
  int64_t input_tokens = 0;   // prompt length, >=1
  int64_t output_tokens = 0;  // tokens to generate, >=1
  // Chained hashes of the prompt's full KV blocks (workload/prefix.h), for
  // prefix caching; null when the trace says nothing of the content.
  std::shared_ptr<const std::vector<uint64_t>> block_hashes;
  // Leading prompt tokens whose KV arrives with the request, computed
  // elsewhere (a disaggregated cluster's prefill pool): admission takes
  // them as computed, but for the last prompt token, which the first step
  // computes again to yield the first output token (vLLM's KV connectors).
  int64_t kv_ready_tokens = 0;
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_REQUEST_H_
