#include "cluster/kv_transfer.h"

#include <algorithm>
#include <cmath>
#include <simgrid/s4u.hpp>

#include "absl/types/span.h"

namespace servesim::cluster {

namespace sg4 = simgrid::s4u;

KvSender::KvSender(RunState* sh, const scenario::ResolvedScenario* pool, int replica)
    : sh_(sh), pool_(pool), replica_(replica) {
  handed_.assign(static_cast<size_t>(sh->sc->replicas - sh->prefill_replicas), 0);
}

void KvSender::Track(const scheduler::RequestSpec& spec) {
  specs_.emplace(spec.id, Handoff{spec, -1, 0});
}

int KvSender::DecodeReplica(Handoff& h) {
  if (h.decode < 0) {
    // The loads of this moment (lazy decode engines brought to it; if
    // that stopped the run, this actor ends too).
    if (sh_->advance && !sh_->advance(sg4::Engine::get_clock())) sg4::this_actor::exit();
    const int64_t p = sh_->prefill_replicas;
    const absl::Span<const scheduler::ReplicaLoad> loads(
        sh_->loads.data() + p, static_cast<size_t>(sh_->sc->replicas - p));
    h.decode = static_cast<int>(p + sh_->decode_router->Route(loads));
    ++sh_->loads[h.decode].outstanding;
  }
  return h.decode;
}

int64_t KvSender::TransferTokens(Handoff& h) {
  if (h.sent_tokens < 0) {
    const int d = DecodeReplica(h);
    const int64_t block = PoolOf(*sh_->sc, d).batching.kv_block_tokens;
    const int64_t cached = sh_->cached_blocks(d, h.spec) * block;
    h.sent_tokens = h.spec.input_tokens - std::min(cached, h.spec.input_tokens - 1);
  }
  return h.sent_tokens;
}

void KvSender::SendKv(Handoff& h, double bytes, int32_t parts, double now) {
  Fabric& fabric = sh_->fabric;
  const int d = DecodeReplica(h);
  ++h.parts_sent;
  ++sh_->kv_in_flight;
  ++sh_->kv_in_flight_to[static_cast<size_t>(d)];
  fabric.ForRoute(replica_, d, [&](int l, int) {
    fabric.links[l].bytes += bytes;
    ++fabric.kv_flows_on[l];
  });
  // Out of one NIC and into another (or over the node's NVLink).
  const auto& to = PoolOf(*sh_->sc, d).proto.cluster();
  sh_->metrics->AddTransferEnergy(
      bytes * 1e-12 *
      (fabric.SameNode(replica_, d) ? pool_->proto.cluster().interconnect().energy_pj_per_byte() +
                                          to.interconnect().energy_pj_per_byte()
                                    : pool_->proto.cluster().internode().energy_pj_per_byte() +
                                          to.internode().energy_pj_per_byte()));
  auto* msg = sh_->messages.New(h.spec, false, 0, parts);
  msg->prefill_end_s = now;
  msg->bytes = bytes;
  msg->sent_s = msg->prefill_end_s;
  msg->from = replica_;
  // The bytes flow between the replicas' hosts; the decode replica's
  // receiver learns of the flow at once and lands the part as the flow
  // ends, flows ending in any order (Engine::Receiver).
  msg->flow = sg4::Comm::sendto_async(fabric.kv_hosts[replica_], fabric.kv_hosts[d],
                                      static_cast<uint64_t>(std::ceil(bytes)));
  sh_->engine_boxes[d]->put_init(msg, 0)->detach();
}

double KvSender::KvBytes(int64_t tokens) const {
  return static_cast<double>(tokens) * sh_->sc->kv_bytes_per_token;
}

void KvSender::StreamLayers(const scheduler::Batch& batch, double start) {
  const double layers = static_cast<double>(pool_->model.num_layers);
  for (const scheduler::BatchEntry& e : batch.entries) {
    if (!e.prefill || !e.emits_token) continue;
    auto it = specs_.find(e.request_id);
    if (it == specs_.end()) continue;
    Handoff& h = it->second;
    const int64_t sent = TransferTokens(h);
    h.tail_bytes = KvBytes(std::min(e.new_tokens, sent)) / layers;
    SendKv(h, KvBytes(sent) - h.tail_bytes, 0, start);
  }
}

void KvSender::StreamLayers(const Ranks& ranks, double start) {
  for (const auto& r : ranks) {
    if (r->batch != nullptr) StreamLayers(*r->batch, start);
  }
}

void KvSender::HandOff(int64_t id, double t) {
  auto it = specs_.find(id);
  Handoff& h = it->second;
  const double sent = KvBytes(TransferTokens(h));
  const double bytes = sh_->sc->kv_layerwise && h.parts_sent > 0 ? h.tail_bytes : sent;
  sh_->metrics->OnHandoff(id, replica_, t, sent);
  SendKv(h, bytes, h.parts_sent + 1, t);
  ++handed_[static_cast<size_t>(h.decode - sh_->prefill_replicas)];
  specs_.erase(it);
}

void KvSender::EndStreams() {
  for (size_t d = 0; d < handed_.size(); ++d) {
    sh_->engine_boxes[sh_->prefill_replicas + d]
        ->put_init(sh_->messages.New({}, true, handed_[d]), 0)
        ->detach();
  }
}

bool KvReceiver::Receive(const Message& msg, double landed_s, scheduler::RequestSpec* ready) {
  const int64_t id = msg.request.id;
  Arriving& a = arriving_[id];
  ++a.received;
  a.first_sent_s = std::min(a.first_sent_s, msg.sent_s);
  if (msg.kv_parts > 0) {
    a.expected = msg.kv_parts;
    a.prefill_end_s = msg.prefill_end_s;
  }
  if (a.expected == 0 || a.received < a.expected) return false;
  const double prefill_end_s = a.prefill_end_s;
  SampleTransfer(msg, a.first_sent_s, landed_s);
  arriving_.erase(id);
  sh_->metrics->OnKvReady(id, landed_s);
  if (sh_->live != nullptr) {
    sh_->live->OnKvTransfer(
        replica_, static_cast<double>(msg.request.input_tokens) * sh_->sc->kv_bytes_per_token,
        landed_s - prefill_end_s);
  }
  *ready = msg.request;
  ready->kv_ready_tokens = ready->input_tokens;
  return true;
}

void KvReceiver::SampleTransfer(const Message& last, double start_s, double landed_s) {
  const auto& o = sh_->sc->proto.output();
  if (!o.timeline() || !sh_->record_timeline || transfer_samples_ >= o.timeline_max_iterations() ||
      start_s < o.timeline_start_s() || start_s >= o.timeline_end_s()) {
    return;
  }
  ++transfer_samples_;
  sh_->metrics->AddTimelineTransfer(
      {last.request.id, last.from, replica_, start_s, landed_s,
       static_cast<double>(last.request.input_tokens) * sh_->sc->kv_bytes_per_token});
}

}  // namespace servesim::cluster
