// The two actors in front of the engines: the clients (Source), who send
// each request when it arrives, and the router, who picks its replica.
//
// Contract:
//  - Source pulls each request from the workload's RequestStream as the
//    run goes, sleeps until its arrival and sends it to the router; its
//    size on the wire is 4 bytes per prompt token plus a header. A stream
//    error (a bad trace row) or an arrival past the simulated-time limit
//    stops the run. At the end it tells the router how many it sent.
//  - RouterActor routes each request (scheduler/router.h) to the prefill
//    pool when there is one, else to every replica, over the replica's
//    front-end link, with the loads and caches of that moment (lazy
//    engines are brought to it first); at the end it tells every engine
//    how many requests it was sent.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_ACTORS_H_
#define SERVESIM_CLUSTER_ACTORS_H_

#include "cluster/run_state.h"

namespace servesim::cluster {

void Source(RunState* sh);
void RouterActor(RunState* sh);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_ACTORS_H_
