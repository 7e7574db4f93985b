// What the disaggregation tests share (tests/cluster/disaggregation_test.cc,
// kv_transfer_test.cc, fabric_test.cc): a small prefill/decode scenario
// whose KV transfers are worked by hand, and readers of the run's files.
#ifndef SERVESIM_TESTS_CLUSTER_DISAGGREGATION_UTIL_H_
#define SERVESIM_TESTS_CLUSTER_DISAGGREGATION_UTIL_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim::disaggregation_test {

using test_util::FreshDir;
using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;
using test_util::WriteFile;

// Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2
// bytes = 131,072 bytes of KV per token; a 1000-token prompt's KV is
// 131,072,000 bytes. Every xPU has a 10 GB/s NIC with 10 us of latency.
inline constexpr double kPromptKvBytes = 131072000.0;

inline constexpr double kNicBw = 1e10;

inline constexpr double kNicLatency = 1e-5;

inline std::string Scenario(int prefill_replicas, int requests, const std::string& policy,
                            const std::string& extra_cluster = "", const std::string& fabric = "") {
  return absl::StrCat(R"(
model { preset: "llama3.1-8b" }
cluster {
  xpu { preset: "a100-80gb" }
  internode { bandwidth_bytes_per_s: 1e10 latency_s: 1e-5 }
  )",
                      extra_cluster, R"(
  disaggregation {
    prefill { cluster { replicas: )",
                      prefill_replicas, R"( } }
    decode { cluster { replicas: 1 } }
    kv_transfer: )",
                      policy, R"(
    )",
                      fabric, R"(
  }
}
workload { saturated { num_requests: )",
                      requests, R"( input_tokens: 1000 output_tokens: 8 } }
scheduler { batching: BATCHING_POLICY_VLLM_V1 }
)");
}

// requests.csv's rows as column name -> value.
inline std::vector<std::map<std::string, std::string>> Requests(const std::string& dir) {
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/requests.csv"));
  std::vector<std::map<std::string, std::string>> rows;
  if (lines.empty()) return rows;
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    EXPECT_EQ(cells.size(), header.size()) << lines[i];
    std::map<std::string, std::string> row;
    for (size_t c = 0; c < header.size() && c < cells.size(); ++c) row[header[c]] = cells[c];
    rows.push_back(std::move(row));
  }
  return rows;
}

inline double Num(const std::map<std::string, std::string>& row, const std::string& key) {
  double v = std::nan("");
  auto it = row.find(key);
  EXPECT_TRUE(it != row.end() && absl::SimpleAtod(it->second, &v)) << key;
  return v;
}

// Runs `text`; its requests.csv rows.
inline std::vector<std::map<std::string, std::string>> RunScenario(const std::string& text,
                                                                   std::string* out_dir = nullptr) {
  const std::string dir = FreshDir("disagg");
  WriteFile(dir + "/s.pbtxt", text);
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  if (out_dir != nullptr) *out_dir = dir + "/out";
  return Requests(dir + "/out");
}

// requests.csv stamps times to the microsecond.
inline constexpr double kCsvResolution = 2e-6;

// iterations.csv's duration_s of replica `replica`'s steps, in order.
inline std::vector<double> StepDurations(const std::string& dir, const std::string& replica) {
  std::vector<double> out;
  const std::vector<std::string> lines = Lines(ReadFile(dir + "/iterations.csv"));
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    double d = 0;
    if (cells.size() > 2 && cells[0] == replica && absl::SimpleAtod(cells[2], &d)) {
      out.push_back(d);
    }
  }
  return out;
}

// The text value of `key` in the JSON file `path`.
inline std::string JsonFileValue(const std::string& path, const std::string& key) {
  const std::string json = ReadFile(path);
  const std::string tag = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(tag);
  if (at == std::string::npos) return "";
  const size_t from = at + tag.size();
  return json.substr(from, json.find_first_of(",}\n", from) - from);
}

// The text value of summary.json's `key`.
inline std::string SummaryValue(const std::string& dir, const std::string& key) {
  return JsonFileValue(dir + "/summary.json", key);
}

// A SimGrid platform file with the built-in fabric's NICs: each prefill
// replica's host reaches the decode replica's over its own 10 GB/s link
// and the decode host's, 10 us each.
inline constexpr char kPlatform[] = R"(<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="fabric" routing="Full">
    <host id="prefill0" speed="1Gf"/>
    <host id="prefill1" speed="1Gf"/>
    <host id="decode0" speed="1Gf"/>
    <link id="p0" bandwidth="10GBps" latency="10us"/>
    <link id="p1" bandwidth="10GBps" latency="10us"/>
    <link id="d0" bandwidth="DECODE_BW" latency="10us"/>
    <route src="prefill0" dst="decode0"><link_ctn id="p0"/><link_ctn id="d0"/></route>
    <route src="prefill1" dst="decode0"><link_ctn id="p1"/><link_ctn id="d0"/></route>
  </zone>
</platform>
)";

// Runs `text` beside platform.xml (kPlatform with the decode link's
// bandwidth `decode_bw`); the output folder.
inline std::string RunWithPlatform(const std::string& text,
                                   const std::string& decode_bw = "10GBps") {
  const std::string dir = FreshDir("platform");
  WriteFile(dir + "/platform.xml", absl::StrReplaceAll(kPlatform, {{"DECODE_BW", decode_bw}}));
  WriteFile(dir + "/s.pbtxt", text);
  const auto r = RunServesim({"run", dir + "/s.pbtxt", "--out", dir + "/out"});
  EXPECT_EQ(r.code, 0) << r.out;
  return dir + "/out";
}

// Loads `text` with `servesim validate`; its output.
inline test_util::CommandResult Validate(const std::string& text) {
  const std::string dir = FreshDir("disagg_bad");
  WriteFile(dir + "/s.pbtxt", text);
  return RunServesim({"validate", dir + "/s.pbtxt"});
}

}  // namespace servesim::disaggregation_test

#endif  // SERVESIM_TESTS_CLUSTER_DISAGGREGATION_UTIL_H_
