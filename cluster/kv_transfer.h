// KV between the pools of a disaggregated cluster (docs/disaggregation.md):
// a prefill replica hands each prompt's KV to a decode replica as SimGrid
// flows (KvSender); the decode replica puts the parts of each request
// together as they land (KvReceiver).
//
// Contract:
//  - KV is pushed when the prefill ends, or streamed layer by layer as the
//    step that ends a prompt runs (cluster.disaggregation.kv_layerwise),
//    rather than pulled after a reservation as vLLM's connectors do: one
//    message per part instead of a round trip. A decode replica reserves
//    its blocks when the last part lands.
//  - Only the prompt tokens the decode replica does not hold in its prefix
//    cache move (at least the last one), decided with the first part.
//  - The decode replica is chosen by the decode pool's router on the
//    request's first part, with the loads of that moment: lazy decode
//    engines are brought to it first (RunState::advance).
//  - Each part is a message to the decode replica's mailbox carrying its
//    flow; the replica's receiver actor (Engine::Receiver) lands it when
//    the flow ends. Bytes count on every link of the route; energy as the
//    bytes leave one NIC and enter the other (or cross the node's NVLink).
//  - Called from the prefill and decode engines' actors only.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_KV_TRANSFER_H_
#define SERVESIM_CLUSTER_KV_TRANSFER_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cluster/rank.h"
#include "cluster/run_state.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/request.h"

namespace servesim::cluster {

// A prefill replica's side.
class KvSender {
 public:
  // `pool`: the prefill pool (borrowed).
  KvSender(RunState* sh, const scenario::ResolvedScenario* pool, int replica);

  // Request `spec` (its whole output) prefills here: its KV will be handed
  // off when its prefill ends.
  void Track(const scheduler::RequestSpec& spec);
  // Layer-wise transfer: as a step that ends a prompt starts, the KV of
  // every layer but the last leaves (the layers compute one after another
  // while it streams); the last layer's follows when the step ends. KV the
  // prompt's earlier chunks or the prefix cache hold leaves then too. For
  // every rank's batch.
  void StreamLayers(const Ranks& ranks, double start);
  // Request `id`'s prefill ended at `t`: the rest of its KV leaves.
  void HandOff(int64_t id, double t);
  // The end of this replica's hand-offs, to every decode replica.
  void EndStreams();

 private:
  // A request in the prefill pool: what the decode pool will serve, where,
  // the KV parts sent so far and the last layer's bytes of its last chunk.
  struct Handoff {
    scheduler::RequestSpec spec;
    int decode = -1;
    int32_t parts_sent = 0;
    double tail_bytes = 0;
    int64_t sent_tokens = -1;  // of the prompt, the tokens whose KV moves (TransferTokens)
  };
  void StreamLayers(const scheduler::Batch& batch, double start);
  // The decode replica request `h` goes to, chosen by the decode pool's
  // router on its first KV part.
  int DecodeReplica(Handoff& h);
  // The prompt tokens whose KV moves to request `h`'s decode replica,
  // decided with its first part: those the decode replica does not hold
  // in its prefix cache then (as vLLM's P/D connectors pull only the
  // tokens the decode instance has not computed locally:
  // get_num_new_matched_tokens), at least the last one.
  int64_t TransferTokens(Handoff& h);
  // Sends `bytes` of request `h`'s KV to its decode replica as a SimGrid
  // flow from this replica's host, at `now` (this engine's time: its step's
  // start or end); `parts` as Message::kv_parts.
  void SendKv(Handoff& h, double bytes, int32_t parts, double now);
  double KvBytes(int64_t tokens) const;

  RunState* sh_;
  const scenario::ResolvedScenario* pool_;
  int replica_;
  absl::flat_hash_map<int64_t, Handoff> specs_;
  std::vector<int64_t> handed_;  // per decode replica
};

// A decode replica's side.
class KvReceiver {
 public:
  KvReceiver(RunState* sh, int replica) : sh_(sh), replica_(replica) {}

  // A KV part that landed at `landed_s`: with the request's last part,
  // returns true and `*ready` is the request with its prompt's KV in
  // place, to join a rank's queue.
  bool Receive(const Message& msg, double landed_s, scheduler::RequestSpec* ready);

 private:
  struct Arriving {
    int32_t received = 0, expected = 0;
    double prefill_end_s = 0;
    double first_sent_s = std::numeric_limits<double>::infinity();
  };
  // The KV transfers whose first part left within the timeline's window,
  // the first output.timeline_max_iterations of each decode replica.
  void SampleTransfer(const Message& last, double start_s, double landed_s);

  RunState* sh_;
  int replica_;
  absl::flat_hash_map<int64_t, Arriving> arriving_;
  int64_t transfer_samples_ = 0;
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_KV_TRANSFER_H_
