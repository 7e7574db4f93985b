#include "cluster/actors.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <simgrid/s4u.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/sim_time.h"

namespace servesim::cluster {

namespace sg4 = simgrid::s4u;

namespace {

constexpr double kBytesPerPromptToken = 4;  // token ids on the wire
constexpr double kHeaderBytes = 512;

double WireBytes(const scheduler::RequestSpec& r) {
  return kHeaderBytes + kBytesPerPromptToken * static_cast<double>(r.input_tokens);
}

}  // namespace

absl::Status Interruption() { return absl::CancelledError("interrupted"); }

absl::Status PastTimeLimit(double t, const char* what) {
  return absl::OutOfRangeError(absl::StrCat(
      what, " at t = ", t, " s, past the simulated-time limit of ", kMaxSimulatedSeconds,
      " s (beyond it time loses sub-microsecond resolution); shorten the trace or raise the "
      "arrival rate"));
}

void Source(RunState* sh) {
  int64_t sent = 0;
  scheduler::RequestSpec r;
  while (true) {
    absl::StatusOr<bool> more = sh->requests->Next(&r);
    if (!more.ok()) {
      // A bad row further into the trace: stop the run, as a failed
      // iteration does.
      sh->Stop(more.status());
      return;
    }
    if (!*more) break;
    if (r.arrival_s > kMaxSimulatedSeconds) {
      sh->Stop(PastTimeLimit(r.arrival_s, absl::StrCat("request ", r.id, " arrives").c_str()));
      return;
    }
    sh->next_arrival_s = r.arrival_s;
    if (sh->hint_arrival) sh->hint_arrival(r);
    sg4::this_actor::sleep_until(r.arrival_s);
    if (sh->Interrupted()) {
      sh->Stop(Interruption());
      return;
    }
    if (sh->max_in_flight > 0) {
      // Held while the clients have their limit out; sent, and timed, from
      // when one ends.
      std::unique_lock<sg4::Mutex> lock(*sh->client_mutex);
      while (sh->client_in_flight >= sh->max_in_flight) sh->client_cv->wait(lock);
      const double now = sg4::Engine::get_clock();
      if (now > r.arrival_s) {
        const double held = now - r.arrival_s;
        ++sh->held.requests;
        sh->held.total_s += held;
        sh->held.max_s = std::max(sh->held.max_s, held);
        r.arrival_s = now;
        sh->next_arrival_s = now;
      }
      ++sh->client_in_flight;
    }
    ++sh->in_flight;
    ++sent;
    sh->metrics->OnArrival(r);
    auto* msg = sh->messages.New(r, false, 0);
    sh->router_box->put_init(msg, static_cast<uint64_t>(WireBytes(r)))->detach();
  }
  sh->next_arrival_s = std::numeric_limits<double>::infinity();
  auto* end = sh->messages.New({}, true, sent);
  sh->router_box->put_init(end, 0)->detach();
}

void RouterActor(RunState* sh) {
  // Arrivals go to the prefill pool when there is one.
  const scenario::ResolvedScenario& front =
      sh->prefill_replicas > 0 ? *sh->sc->prefill_pool : *sh->sc;
  const size_t targets = sh->prefill_replicas > 0 ? static_cast<size_t>(sh->prefill_replicas)
                                                  : sh->engine_boxes.size();
  const absl::Span<const scheduler::ReplicaLoad> loads(sh->loads.data(), targets);
  scheduler::Router router(front.routing);
  std::vector<int64_t> sent(targets, 0);
  int64_t expected = -1, received = 0;
  while (expected < 0 || received < expected) {
    auto* msg = sh->router_box->get<Message>();
    if (msg->end) {
      expected = msg->total_sent;
      sh->messages.Delete(msg);
      continue;
    }
    ++received;
    // The loads and caches it reads are those of this moment.
    if (sh->prefill_replicas == 0 && sh->advance && !sh->advance(sg4::Engine::get_clock())) {
      return;
    }
    if (router.policy() == scheduler::RoutingPolicy::kPrefixAffinity) {
      const int64_t bt = front.batching.kv_block_tokens;
      for (size_t i = 0; i < targets; ++i) {
        sh->loads[i].prompt_blocks = (msg->request.input_tokens + bt - 1) / bt;
        sh->loads[i].prefix_hit_blocks = sh->cached_blocks(static_cast<int>(i), msg->request);
      }
    }
    const int r = router.Route(loads);
    ++sh->loads[r].outstanding;
    ++sent[r];
    sh->engine_boxes[r]->put_init(msg, static_cast<uint64_t>(WireBytes(msg->request)))->detach();
  }
  for (size_t r = 0; r < targets; ++r) {
    sh->engine_boxes[r]->put_init(sh->messages.New({}, true, sent[r]), 0)->detach();
  }
}

}  // namespace servesim::cluster
