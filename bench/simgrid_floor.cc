// What SimGrid alone costs per arrival with servesim's actor layout: a
// source on the clients' host sleeps until each arrival and sends the
// request to the router's host, the router takes it and sends it on to one
// of R replica hosts, whose actors take it. That is what every simulated
// request costs servesim in SimGrid before any engine work (cluster/
// actors.cc: Source, RouterActor; the engines' receives), so its time
// per arrival is the floor under the real-time factor of a run whose
// transfers SimGrid carries (docs/speed.md).
// Usage: build/bench/servesim-simgrid-floor [ARRIVALS] [REPLICAS] [SIMULATED_S]
//        [SimGrid --cfg flags]   (defaults: 19366 4 3515, the Azure
//        conversation hour on the GPU-only default's 4 replicas)
#include <simgrid/s4u.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {

struct Request {
  int64_t id;
  bool end;
};

// The wire size of a request as servesim sends it (a header and 4 bytes
// per prompt token), for a 1,000-token prompt.
constexpr uint64_t kRequestBytes = 512 + 4 * 1000;

struct Layout {
  int64_t arrivals = 19366;
  int replicas = 4;
  double simulated_s = 3515;
  sg4::Mailbox* router_box = nullptr;
  std::vector<sg4::Mailbox*> replica_boxes;
};

void Source(Layout* l) {
  for (int64_t i = 0; i < l->arrivals; ++i) {
    sg4::this_actor::sleep_until(l->simulated_s * static_cast<double>(i) /
                                 static_cast<double>(l->arrivals));
    l->router_box->put_init(new Request{i, false}, kRequestBytes)->detach();
  }
  l->router_box->put_init(new Request{-1, true}, 0)->detach();
}

void Router(Layout* l) {
  for (int64_t i = 0;; ++i) {
    auto* r = l->router_box->get<Request>();
    if (r->end) {
      delete r;
      for (sg4::Mailbox* box : l->replica_boxes) box->put_init(new Request{-1, true}, 0)->detach();
      return;
    }
    l->replica_boxes[static_cast<size_t>(i % l->replicas)]->put_init(r, kRequestBytes)->detach();
  }
}

void Replica(Layout* l, int r) {
  while (true) {
    auto* q = l->replica_boxes[static_cast<size_t>(r)]->get<Request>();
    const bool end = q->end;
    delete q;
    if (end) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  sg4::Engine engine(&argc, argv);  // takes the --cfg flags out of argv
  Layout l;
  if (argc > 1) l.arrivals = std::atoll(argv[1]);
  if (argc > 2) l.replicas = std::atoi(argv[2]);
  if (argc > 3) l.simulated_s = std::atof(argv[3]);
  if (l.arrivals < 1 || l.replicas < 1 || !(l.simulated_s > 0)) {
    std::fprintf(stderr, "usage: %s [ARRIVALS >= 1] [REPLICAS >= 1] [SIMULATED_S > 0]\n", argv[0]);
    return 2;
  }
  // servesim's colocated platform (BuildPlatform): a link from the clients
  // to the router, one from the router to each replica's first xPU (100 Gb/s
  // Ethernet, the default `frontend`).
  auto* zone = sg4::create_full_zone("cluster");
  auto* clients = zone->create_host("clients", 1e9);
  auto* router = zone->create_host("router", 1e9);
  auto* in = zone->create_link("frontend.in", 12.5e9)->set_latency(10e-6)->seal();
  zone->add_route(clients->get_netpoint(), router->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(in)}, true);
  std::vector<sg4::Host*> hosts;
  for (int r = 0; r < l.replicas; ++r) {
    // (snprintf, not "r" + std::to_string(r): GCC 12's -Wrestrict misfires
    // on that.)
    char name_buf[32];
    std::snprintf(name_buf, sizeof name_buf, "r%d", r);
    const std::string name = name_buf;
    hosts.push_back(zone->create_host(name + ".xpu0", 1e9));
    auto* link = zone->create_link(name + ".frontend", 12.5e9)->set_latency(10e-6)->seal();
    zone->add_route(router->get_netpoint(), hosts.back()->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(link)}, true);
    l.replica_boxes.push_back(sg4::Mailbox::by_name(name + ".engine"));
  }
  zone->seal();
  l.router_box = sg4::Mailbox::by_name("router");
  sg4::Actor::create("router", router, Router, &l);
  for (int r = 0; r < l.replicas; ++r) sg4::Actor::create("engine", hosts[r], Replica, &l, r);
  sg4::Actor::create("source", clients, Source, &l);
  const auto start = std::chrono::steady_clock::now();
  engine.run();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("arrivals=%lld\nreplicas=%d\nsimulated_s=%.1f\nwall_s=%.4f\nus_per_arrival=%.2f\n"
              "realtime_factor_ceiling=%.0f\n",
              static_cast<long long>(l.arrivals), l.replicas, sg4::Engine::get_clock(), wall,
              1e6 * wall / static_cast<double>(l.arrivals), sg4::Engine::get_clock() / wall);
  return 0;
}
