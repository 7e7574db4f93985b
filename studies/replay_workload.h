// The workload a replay runs: the measured run's trace.csv, merged with the
// prompts' token ids when the run's workload file lies beside the run (so
// that prefix caching sees the shared prompts), or with the one shared
// prefix the client generated. PrepareReplay (studies/replay_setup.cc)
// calls it after the engine knobs are mapped, since prefix caching decides
// whether the prompts' contents matter.
//
// Contract: writes at most one file, into the replay's output folder
// (created here); points the scenario's trace at the file the run reads
// and notes what it assumed. Errors name the file and the line.
// Library-internal: only studies/replay_*.cc include this header.
#ifndef SERVESIM_STUDIES_REPLAY_WORKLOAD_H_
#define SERVESIM_STUDIES_REPLAY_WORKLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "servesim/v1/scenario.pb.h"
#include "studies/replay.h"

namespace servesim::studies::replay_internal {

// What the workload step takes from the run and from setup.json.
struct WorkloadSource {
  std::string run_dir;        // holds trace.csv
  std::string out_dir;        // where a merged workload is written
  std::string workload_file;  // setup.json's workload.file; empty: not recorded
  int64_t shared_prefix = 0;  // workload_profile_yaml's prefix_tokens; 0: none
  // A trace the replay built (with its prefix groups), read instead of
  // run_dir's trace.csv; `trace_note` says where it came from.
  std::string trace_path;
  std::string trace_note;
  std::string workloads_dir;  // --workloads: another place for workload_file
};

// Reads trace.csv and sets `sc`'s trace (format and path) and `out`'s
// requests, workload_path, token_ids and assumptions. Reads
// sc->scheduler().prefix_caching(), which must be set already.
absl::Status PrepareWorkload(const WorkloadSource& source, servesim::v1::Scenario* sc,
                             ReplaySetup* out);

}  // namespace servesim::studies::replay_internal

#endif  // SERVESIM_STUDIES_REPLAY_WORKLOAD_H_
