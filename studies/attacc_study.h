// `servesim study attacc`: the AttAcc paper's evaluation (§7) inside
// servesim.
//
// Systems (§7.1): DGX_Base (8 x A100-HBM3, 640 GB), DGX_Large (the same with
// twice the memory, 1,280 GB) and DGX+AttAccs (DGX_Base holding the weights
// plus 40 AttAcc stacks holding the KV cache) under three policies: serial
// (naive), hl_pipe (head-level pipelining) and hl_pipe_ff (+ feed-forward
// co-processing). Models: LLaMA-65B and GPT-3 175B in fp16, MT-NLG 530B in
// int8. (L_in, L_out) in {(2048,128), (2048,512), (2048,2048)}; no SLO and
// 30/50/70 ms per-token SLOs.
//
// Saturated mode, as the paper evaluates it: enough requests to keep the
// batch full, every request at the batch's average length L_in + L_out/2.
// The batch is the largest that memory holds (every request reserves
// L_in + L_out tokens; on AttAcc every KV head must also fit its stack),
// lowered by the SLO when the predicted decode iteration misses it. Decode
// throughput = batch / iteration time (generation stages only, as the
// paper's figures); end-to-end throughput adds the batch's prefill.
// Memory is used in full (memory_utilization 1), as the paper's capacity
// arithmetic does. The GPUs follow the authors' simulator: on-die traffic
// energy and SM occupancy (XpuSpec.on_die), no launch overhead on GEMMs and
// attention, int8 MACs at the fp16 energy; FF co-processing's energy is
// counted as theirs is (docs/energy.md, "The AttAcc study").
//
// Trace mode: each system serves the first 10 minutes of the Azure
// conversation trace through the full simulator (one child process per run:
// SimGrid allows one engine per process).
#ifndef SERVESIM_STUDIES_ATTACC_STUDY_H_
#define SERVESIM_STUDIES_ATTACC_STUDY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace servesim::studies {

struct StudyPoint {
  std::string model, system, policy;
  int64_t lin = 0, lout = 0;
  double slo_ms = 0;  // 0: none
  // The largest batch memory holds, as servesim's memory plan counts it
  // and as the AttAcc authors' simulator does (AuthorsCapacityBatch); the
  // study runs the second under StudyOptions::authors_rules, else the first.
  int64_t capacity_batch = 0;
  int64_t capacity_batch_authors = 0;
  int64_t max_batch = 0;
  std::string batch_bound;  // capacity | slo
  double throughput_tokens_per_s = 0;
  double tbt_ms = 0;
  // Dynamic energy per generated token, as the authors' simulator counts
  // it: with FF co-processing, as if the GPUs ran the whole FF.
  double energy_j_per_token = 0;
  // servesim's count: with FF co-processing the stacks read their slice of
  // every FF matrix once per request in the batch (GEMV units take one
  // input vector per pass); otherwise energy_j_per_token.
  double energy_j_per_token_ff_rereads = 0;
  double e2e_throughput_tokens_per_s = 0;
  double prefill_s = 0;
};

struct StudyOptions {
  std::vector<std::string> models = {"llama-65b", "gpt3-175b", "mt-nlg-530b"};
  std::vector<std::pair<int64_t, int64_t>> lengths = {{2048, 128}, {2048, 512}, {2048, 2048}};
  std::vector<double> slos_ms = {0, 30, 50, 70};
  double trace_window_s = 600;  // trace mode: the first 10 minutes
  // Whose rules decide what servesim's model leaves open (docs/devices/
  // attacc.md, "The §7 study"). true (default, `--rules authors`): the
  // AttAcc authors' simulator's, as the paper was evaluated: capacity-bound
  // batches as they count them (AuthorsCapacityBatch; FF partitions take no
  // capacity) and head-level pipelining timed by their `_pipeline` rule
  // (cluster.overlap_rule: ATTACC_SIMULATOR). false (`--rules servesim`):
  // servesim's own, the batch its memory plan and the stacks hold and the
  // planner's list schedule, which serving runs use.
  bool authors_rules = true;
};

// Every saturated point of the study.
absl::StatusOr<std::vector<StudyPoint>> RunAttAccStudy(const StudyOptions& options);

std::string StudyCsv(const std::vector<StudyPoint>& points);

// The largest batch of requests of lin + lout tokens that the AttAcc
// authors' simulator finds room for (scale-snu/attacc_simulator,
// src/system.py get_required_mem_capacity): weights L x h x (4h + 2 or 3
// x d_ff) (no embedding table), and per request the KV of lin + lout - 1
// tokens (the last token's K and V are never stored) plus its temporary
// buffers, max((h + l x heads) x a, 2h x a, 2 l x heads x a, (d_ff + h) x
// a) + l x heads bytes (a: activation bytes), out of 8 x 80 GiB (DGX_Base),
// 8 x 160 GiB (DGX_Large) or 8 x 80 GiB + 40 x 16 GiB (DGX+AttAccs).
// docs/devices/attacc.md compares it with servesim's count.
int64_t AuthorsCapacityBatch(const std::string& model, const std::string& system, int64_t lin,
                             int64_t lout);
// The table users read, with speedups over DGX_Base and DGX_Large.
std::string StudyTable(const std::vector<StudyPoint>& points);

struct StudyTraceRun {
  std::string model, system, policy;
  std::string summary_json;  // the run's summary.json
};

// Runs `trace_path` through each model x system x policy, one child process
// each. `servesim_binary` is the path of this program (for the children).
absl::StatusOr<std::vector<StudyTraceRun>> RunAttAccTraceStudy(
    const StudyOptions& options, const std::string& servesim_binary,
    const std::string& trace_path, const std::string& work_dir);

std::string TraceStudyTable(const std::vector<StudyTraceRun>& rows);
std::string TraceStudyCsv(const std::vector<StudyTraceRun>& rows);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_ATTACC_STUDY_H_
