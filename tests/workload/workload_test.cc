#include "workload/workload.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/workload/workload_test_util.h"

namespace servesim::workload {
namespace {

using scheduler::RequestSpec;
using servesim::v1::WorkloadSpec;

// Writes `content` to a fresh file under the test temp dir; returns its path.
std::string WriteTemp(absl::string_view name, absl::string_view content) {
  const std::string path = absl::StrCat(::testing::TempDir(), "workload_test_", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  return path;
}

int64_t SumInput(const TraceFile& trace) {
  int64_t sum = 0;
  for (const TraceRow& row : trace.rows) sum += row.input_tokens;
  return sum;
}

int64_t SumOutput(const TraceFile& trace) {
  int64_t sum = 0;
  for (const TraceRow& row : trace.rows) sum += row.output_tokens;
  return sum;
}

// -------------------------------------------------- what prompts share --

// Ids 0..n-1 as a JSON array, then `tail` more ids from `from`.
std::string Ids(int shared, int tail, int from) {
  std::string out = "[";
  for (int i = 0; i < shared + tail; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", i < shared ? i : from + i);
  }
  return out + "]";
}

TEST(PlainCsvTraceTest, ColumnsInAnyOrderAndPrefixGroups) {
  const std::string path =
      WriteTemp("plain.csv",
                "input_tokens,arrival_s,output_tokens,prefix_tokens,prefix_group\n"
                "100,0,5,40,sys\n64,0.5,3,64,sys\n30,1.25,2,,\n");
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const auto w = LoadWorkload(spec, "", "", 1, /*prefix_block_tokens=*/16);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(absl::StartsWith(w->description, "csv trace ")) << w->description;
  ASSERT_EQ(w->requests.size(), 3u);
  EXPECT_DOUBLE_EQ(w->requests[1].arrival_s, 0.5);
  EXPECT_EQ(w->requests[1].input_tokens, 64);
  const auto& a = *w->requests[0].block_hashes;
  const auto& b = *w->requests[1].block_hashes;
  ASSERT_EQ(a.size(), 6u);  // floor(100 / 16)
  ASSERT_EQ(b.size(), 4u);
  // Request 0 shares its first 40 tokens: blocks 0-1 whole, block 2 not.
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  EXPECT_EQ(w->requests[2].block_hashes, nullptr);  // no group: nothing shared
  // Without prefix caching, nothing is hashed.
  const auto plain = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->requests[0].block_hashes, nullptr);
}

TEST(PlainCsvTraceTest, BadRowsNameTheLineAndColumn) {
  const std::string one =
      WriteTemp("plain_one.csv", "arrival_s,input_tokens,output_tokens,prefix_group\n0,10,1,a\n");
  EXPECT_TRUE(IsError(ReadCsvTrace(one).status(), absl::StatusCode::kInvalidArgument,
                      {one, ":1:", "has one of prefix_group and prefix_tokens"}));
  const std::string longer =
      WriteTemp("plain_long.csv",
                "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens\n0,100,1,a,200\n");
  EXPECT_TRUE(
      IsError(ReadCsvTrace(longer).status(), absl::StatusCode::kInvalidArgument,
              {longer, ":2:", "prefix_tokens is 200; expected at most input_tokens (100)"}));
  const std::string negative =
      WriteTemp("plain_neg.csv", "arrival_s,input_tokens,output_tokens\n-1,10,1\n");
  EXPECT_TRUE(IsError(ReadCsvTrace(negative).status(), absl::StatusCode::kInvalidArgument,
                      {negative, ":2:", "arrival_s is \"-1\"; expected a number of seconds >= 0"}));
}

TEST(TokenIdsTraceTest, PromptsHashPerBlockAndGzipIsRead) {
  // Two 48-token prompts sharing their first 32 ids, 1.5 s apart.
  const std::string text = absl::StrCat(
      "{\"input_toks\": 48, \"output_toks\": 3, \"arrival_time_ns\": 0, \"input_tok_ids\": ",
      Ids(32, 16, 1000), "}\n",
      "{\"input_toks\": 48, \"output_toks\": 2, \"arrival_time_ns\": 1500000000, "
      "\"input_tok_ids\": ",
      Ids(32, 16, 2000), "}\n");
  const std::string path = WriteTemp("ids.jsonl", text);
  ASSERT_EQ(std::system(absl::StrCat("gzip -c '", path, "' > '", path, ".gz'").c_str()), 0);
  for (const std::string& p : {path, path + ".gz"}) {
    SCOPED_TRACE(p);
    WorkloadSpec spec;
    spec.mutable_trace()->set_path(p);
    const auto w = LoadWorkload(spec, "", "", 1, /*prefix_block_tokens=*/16);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(absl::StartsWith(w->description, "token-id trace ")) << w->description;
    ASSERT_EQ(w->requests.size(), 2u);
    EXPECT_DOUBLE_EQ(w->requests[1].arrival_s, 1.5);
    const auto& a = *w->requests[0].block_hashes;
    const auto& b = *w->requests[1].block_hashes;
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(a[0], b[0]);
    EXPECT_EQ(a[1], b[1]);
    EXPECT_NE(a[2], b[2]);
  }
}

TEST(TokenIdsTraceTest, BadLinesNameTheLineAndKey) {
  const std::string mismatch = WriteTemp("ids_mismatch.jsonl",
                                         "{\"input_toks\": 4, \"output_toks\": 1, "
                                         "\"arrival_time_ns\": 0, \"input_tok_ids\": [1, 2, 3]}\n");
  EXPECT_TRUE(IsError(ReadTokenIdsTrace(mismatch).status(), absl::StatusCode::kInvalidArgument,
                      {mismatch, ":1:", "input_tok_ids has 3 tokens but input_toks is 4"}));
  const std::string missing =
      WriteTemp("ids_missing.jsonl", "{\"input_toks\": 4, \"output_toks\": 1}\n");
  EXPECT_TRUE(IsError(ReadTokenIdsTrace(missing).status(), absl::StatusCode::kInvalidArgument,
                      {missing, ":1:", "no \"arrival_time_ns\" key"}));
}

// Mooncake's hash_ids name 512-token units: 16-token blocks inside a shared
// unit are shared, those of the first unit that differs are not.
TEST(MooncakeTraceTest, HashIdsNameSharedUnitsOfTheirBlocks) {
  const std::string path = WriteTemp(
      "units.jsonl",
      "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [7, 8]}\n"
      "{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [7, 9]}\n");
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const auto w = LoadWorkload(spec, "", "", 1, /*prefix_block_tokens=*/16);
  ASSERT_TRUE(w.ok()) << w.status();
  const auto& a = *w->requests[0].block_hashes;
  const auto& b = *w->requests[1].block_hashes;
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a[31], b[31]);  // tokens 496-511: unit 7
  EXPECT_NE(a[32], b[32]);  // tokens 512-527: units 8 and 9
  EXPECT_NE(a[0], a[1]);    // blocks within one unit differ
}

// ------------------------------------------------------------ real files --

TEST(AzureTraceTest, ConvFile) {
  const auto trace = ReadAzureTrace(kAzureConv);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 19366u);
  EXPECT_EQ(trace->skipped_failed, 0);
  EXPECT_EQ(SumInput(*trace), 22361870);
  EXPECT_EQ(SumOutput(*trace), 4088665);
  EXPECT_EQ(trace->rows[0].timestamp_s, 0.0);
  EXPECT_EQ(trace->rows[0].input_tokens, 374);
  EXPECT_EQ(trace->rows[0].output_tokens, 44);
  // 18:15:50.9951690 - 18:15:46.6805900.
  EXPECT_NEAR(trace->rows[1].timestamp_s, 4.3145790, 1e-9);
  // 19:14:08.4025270 - 18:15:46.6805900.
  EXPECT_NEAR(trace->rows.back().timestamp_s, 3501.7219370, 1e-9);
  EXPECT_EQ(trace->rows.back().input_tokens, 197);
  EXPECT_EQ(trace->rows.back().output_tokens, 183);
}

TEST(TraceContentTest, ParsersNameTheGivenFileAndLine) {
  auto azure = ParseAzureTrace(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,374,44\n"
      "2023-11-16 18:15:50.9951690,396,0\n",
      "upload.csv");
  ASSERT_EQ(azure.status().code(), absl::StatusCode::kInvalidArgument) << azure.status();
  EXPECT_TRUE(absl::StartsWith(azure.status().message(), "upload.csv:3: GeneratedTokens is"))
      << azure.status();
  auto mooncake = ParseMooncakeTrace(
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\n"
      "{\"timestamp\": 1, \"input_length\": 20, \"output_length\": 3, \"hash_ids\": [1]}\n",
      "m.jsonl");
  ASSERT_TRUE(mooncake.ok()) << mooncake.status();
  ASSERT_EQ(mooncake->rows.size(), 2u);
  EXPECT_EQ(mooncake->rows[1].input_tokens, 20);
  EXPECT_DOUBLE_EQ(mooncake->rows[1].timestamp_s, 0.001);
  auto pairs = ParseLengthCsvContent("num_prefill_tokens,num_decode_tokens\n12,34\n", "l.csv");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 1u);
  EXPECT_EQ((*pairs)[0].output_tokens, 34);
  auto burst = ParseBurstGptTrace("", "b.csv");
  EXPECT_TRUE(absl::StartsWith(burst.status().message(), "b.csv:1: file is empty"))
      << burst.status();
}

TEST(AzureTraceTest, CodeFile) {
  const auto trace = ReadAzureTrace(kAzureCode);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 8819u);
  EXPECT_EQ(SumInput(*trace), 18059974);
  EXPECT_EQ(SumOutput(*trace), 245896);
  // 18:17:04.0319600 - 18:17:03.9799600.
  EXPECT_NEAR(trace->rows[1].timestamp_s, 0.052, 1e-9);
  // 19:14:19.9280160 - 18:17:03.9799600.
  EXPECT_NEAR(trace->rows.back().timestamp_s, 3435.948056, 1e-9);
}

TEST(AzureTraceTest, LoadWorkloadInfersFormat) {
  WorkloadSpec spec;
  spec.mutable_trace()->set_path("traces/AzureLLMInferenceTrace_conv.csv");
  const auto workload = LoadWorkload(spec, SERVESIM_SOURCE_DIR "/examples", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 19366u);
  EXPECT_EQ(workload->rows_read, 19366);
  EXPECT_EQ(workload->skipped_failed, 0);
  EXPECT_EQ(workload->outside_window, 0);
  EXPECT_EQ(workload->description, absl::StrCat("azure trace ", SERVESIM_SOURCE_DIR,
                                                "/examples/traces/AzureLLMInferenceTrace_conv.csv "
                                                "(19366 rows)"));
  EXPECT_EQ(workload->requests[0].arrival_s, 0.0);
  EXPECT_NEAR(workload->requests[1].arrival_s, 4.3145790, 1e-9);
  EXPECT_NEAR(workload->requests.back().arrival_s, 3501.7219370, 1e-9);
  for (size_t i = 0; i < workload->requests.size(); ++i) {
    ASSERT_EQ(workload->requests[i].id, static_cast<int64_t>(i));
  }
}

TEST(MooncakeTraceTest, SyntheticFile) {
  const auto trace = ReadMooncakeTrace(kMooncake);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 3993u);
  EXPECT_EQ(SumInput(*trace), 61194628);
  EXPECT_EQ(SumOutput(*trace), 595432);
  // The first two rows share timestamp 0: spread over that millisecond.
  EXPECT_EQ(trace->rows[0].timestamp_s, 0.0);
  EXPECT_EQ(trace->rows[0].input_tokens, 40160);
  EXPECT_DOUBLE_EQ(trace->rows[1].timestamp_s, 0.0005);
  EXPECT_EQ(trace->rows[1].input_tokens, 36640);
  EXPECT_DOUBLE_EQ(trace->rows[2].timestamp_s, 0.040);
  EXPECT_DOUBLE_EQ(trace->rows.back().timestamp_s, 1022.025);
}

TEST(MooncakeTraceTest, LoadWorkloadByExtension) {
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(kMooncake);
  const auto workload = LoadWorkload(spec, "/nonexistent", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->requests.size(), 3993u);
  EXPECT_TRUE(absl::StartsWith(workload->description, "mooncake trace "));
  EXPECT_DOUBLE_EQ(workload->requests[1].arrival_s, 0.0005);
}

TEST(BurstGptTraceTest, SliceSkipsFailedRows) {
  const auto trace = ReadBurstGptTrace(kBurstGpt);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->rows.size(), 383u);
  EXPECT_EQ(trace->skipped_failed, 17);
  EXPECT_EQ(SumInput(*trace), 208189);
  EXPECT_EQ(SumOutput(*trace), 110612);
  EXPECT_EQ(trace->rows[0].timestamp_s, 5.0);
  EXPECT_EQ(trace->rows[0].input_tokens, 472);
  EXPECT_EQ(trace->rows[0].output_tokens, 18);
  EXPECT_EQ(trace->rows.back().timestamp_s, 37274.0);
}

TEST(BurstGptTraceTest, LoadWorkloadCountsRowsAndShifts) {
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(kBurstGpt);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->rows_read, 400);
  EXPECT_EQ(workload->skipped_failed, 17);
  EXPECT_EQ(workload->requests.size(), 383u);
  EXPECT_EQ(workload->requests[0].arrival_s, 0.0);
  EXPECT_EQ(workload->requests.back().arrival_s, 37269.0);
  EXPECT_EQ(workload->description,
            absl::StrCat("burstgpt trace ", kBurstGpt, " (400 rows, 17 failed skipped)"));
}

TEST(LengthCsvTest, ShareGptFile) {
  const auto pairs = ReadLengthCsv(kShareGpt);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 30731u);
  EXPECT_EQ((*pairs)[0].input_tokens, 74);
  EXPECT_EQ((*pairs)[0].output_tokens, 918);
  EXPECT_EQ(pairs->back().input_tokens, 2285);
  EXPECT_EQ(pairs->back().output_tokens, 363);
  int64_t in = 0, out = 0;
  for (const LengthPair& pair : *pairs) {
    in += pair.input_tokens;
    out += pair.output_tokens;
  }
  EXPECT_EQ(in, 71911571);
  EXPECT_EQ(out, 13481988);
}

// ------------------------------------------------------- format details --

TEST(AzureTraceTest, CrlfBlankLinesAndFractionWidths) {
  const std::string path = WriteTemp("azure_widths.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                                     "2024-02-28 23:59:59,10,1\r\n"            // no fraction
                                     "2024-02-29 00:00:00.5,20,2\r\n"          // leap day, 1 digit
                                     "2024-03-01 00:00:00.123456789,30,3\r\n"  // 9 digits
                                     "\r\n");
  const auto trace = ReadAzureTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 3u);
  EXPECT_EQ(trace->rows[0].timestamp_s, 0.0);
  EXPECT_NEAR(trace->rows[1].timestamp_s, 1.5, 1e-12);
  EXPECT_NEAR(trace->rows[2].timestamp_s, 1.0 + 86400.0 + 0.123456789, 1e-9);
  EXPECT_EQ(trace->rows[2].output_tokens, 3);
}

TEST(AzureTraceTest, YearAndMonthBoundaries) {
  const std::string path =
      WriteTemp("azure_years.csv",
                "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                "1999-12-31 23:59:59.0,1,1\n"
                "2000-03-01 00:00:00.0,1,1\n"  // 2000 is a leap year: 61 days later
                "2100-03-01 00:00:00.0,1,1");  // 2100 is not; no final newline
  const auto trace = ReadAzureTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 3u);
  EXPECT_EQ(trace->rows[1].timestamp_s, 1.0 + 60 * 86400.0);
  // 36524 days from 2000-03-01 to 2100-03-01 (25 leap days, 2100 not one).
  EXPECT_EQ(trace->rows[2].timestamp_s, 1.0 + (60 + 36524) * 86400.0);
}

TEST(AzureTraceTest, EarlierRowsAreSortedAndShifted) {
  const std::string path = WriteTemp("azure_unsorted.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 10:00:05.0,1,11\n"
                                     "2023-11-16 10:00:00.0,2,22\n"
                                     "2023-11-16 10:00:10.0,3,33\n");
  const auto trace = ReadAzureTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->rows[1].timestamp_s, -5.0);

  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  spec.mutable_trace()->set_format(servesim::v1::TRACE_FORMAT_AZURE);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->requests.size(), 3u);
  EXPECT_EQ(workload->requests[0].arrival_s, 0.0);
  EXPECT_EQ(workload->requests[0].input_tokens, 2);
  EXPECT_EQ(workload->requests[1].arrival_s, 5.0);
  EXPECT_EQ(workload->requests[1].input_tokens, 1);
  EXPECT_EQ(workload->requests[2].arrival_s, 10.0);
  EXPECT_EQ(workload->requests[2].id, 2);
}

TEST(MooncakeTraceTest, BucketsSpreadInFileOrderAndUnknownKeysIgnored) {
  const std::string path =
      WriteTemp("mooncake_buckets.jsonl",
                "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, "
                "\"hash_ids\": [1, 2, 3]}\n"
                "\n"
                "{\"input_length\": 2, \"output_length\": 2, \"timestamp\": 3, "
                "\"note\": \"a, \\\"b\\\"\", \"x\": {\"y\": [true, null]}}\n"
                "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 3}\n"
                "{\"timestamp\": 5, \"input_length\": 4, \"output_length\": 4, "
                "\"hash_ids\": []}\n");
  const auto trace = ReadMooncakeTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 4u);
  EXPECT_DOUBLE_EQ(trace->rows[0].timestamp_s, 0.005);
  EXPECT_DOUBLE_EQ(trace->rows[1].timestamp_s, 0.003);
  EXPECT_DOUBLE_EQ(trace->rows[2].timestamp_s, (5 + 1.0 / 3) / 1000);
  EXPECT_DOUBLE_EQ(trace->rows[3].timestamp_s, (5 + 2.0 / 3) / 1000);
  EXPECT_EQ(trace->rows[3].input_tokens, 4);
}

TEST(BurstGptTraceTest, ColumnsByNameFloatTimestamps) {
  const std::string path = WriteTemp("burstgpt_cols.csv",
                                     "Log Type,Response tokens,Timestamp,Request tokens\r\n"
                                     "API log,7,1.5,100\r\n"
                                     "API log,0,2,0\r\n"
                                     "API log,9,2.25,200\r\n");
  const auto trace = ReadBurstGptTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->rows.size(), 2u);
  EXPECT_EQ(trace->skipped_failed, 1);
  EXPECT_EQ(trace->rows[0].timestamp_s, 1.5);
  EXPECT_EQ(trace->rows[0].input_tokens, 100);
  EXPECT_EQ(trace->rows[0].output_tokens, 7);
  EXPECT_EQ(trace->rows[1].timestamp_s, 2.25);
}

TEST(BurstGptTraceTest, InferredFromHeader) {
  const std::string path = WriteTemp("burstgpt_infer.txt",
                                     "Timestamp,Model,Request tokens,Response tokens\n"
                                     "3,GPT-4,10,20\n");
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  const auto workload = LoadWorkload(spec, "", "", 1);
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_TRUE(absl::StartsWith(workload->description, "burstgpt trace "));
  EXPECT_EQ(workload->requests.size(), 1u);
}

// ------------------------------------------------------------ bad input --

TEST(BadInputTest, NonNumericTokenCount) {
  const std::string path = WriteTemp("bad_nonnumeric.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:46.6805900,374,44\n"
                                     "2023-11-16 18:15:47.0,12x,44\n");
  EXPECT_TRUE(
      IsError(ReadAzureTrace(path).status(), absl::StatusCode::kInvalidArgument,
              {path, ":3:", "ContextTokens is \"12x\"", "expected an integer in [1, 2147483647]"}));
}

TEST(BadInputTest, NegativeTokenCount) {
  const std::string path = WriteTemp("bad_negative.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:46.6805900,374,-3\n");
  EXPECT_TRUE(IsError(ReadAzureTrace(path).status(), absl::StatusCode::kInvalidArgument,
                      {absl::StrCat(path,
                                    ":2: GeneratedTokens is \"-3\"; expected an "
                                    "integer in [1, 2147483647]")}));
}

TEST(BadInputTest, TokenCountPastTwoToTheThirtyOne) {
  // 2^31 - 1 is the last count allowed; one more is an error naming the
  // row (5e18 input tokens once overflowed a request's wire size).
  const std::string path = WriteTemp("bad_huge.csv",
                                     "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:46.6805900,2147483647,44\n"
                                     "2023-11-16 18:15:47.0,2147483648,44\n");
  EXPECT_TRUE(IsError(ReadAzureTrace(path).status(), absl::StatusCode::kInvalidArgument,
                      {absl::StrCat(path,
                                    ":3: ContextTokens is \"2147483648\"; expected an "
                                    "integer in [1, 2147483647]")}));
}

TEST(BadInputTest, ZeroTokenCount) {
  const std::string azure = WriteTemp("bad_zero.csv",
                                      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2023-11-16 18:15:46.6805900,374,1\n"
                                      "2023-11-16 18:15:47.6805900,374,0\n");
  EXPECT_TRUE(IsError(ReadAzureTrace(azure).status(), absl::StatusCode::kInvalidArgument,
                      {azure, ":3:", "GeneratedTokens is \"0\""}));
  const std::string lengths =
      WriteTemp("bad_zero_lengths.csv", "num_prefill_tokens,num_decode_tokens\n0,5\n");
  EXPECT_TRUE(IsError(ReadLengthCsv(lengths).status(), absl::StatusCode::kInvalidArgument,
                      {lengths, ":2:", "num_prefill_tokens is \"0\""}));
}

TEST(BadInputTest, BadTimestamps) {
  for (const char* timestamp :
       {"2023-11-16 25:00:00.0", "2023-02-29 00:00:00.0", "2023-11-16 18:15:46.1234567890",
        "2023-11-16 18:15:46.", "2023/11/16 18:15:46.0", "1700000000", "2023-11-16 18:15:4a.0"}) {
    const std::string path =
        WriteTemp("bad_timestamp.csv",
                  absl::StrCat("TIMESTAMP,ContextTokens,GeneratedTokens\n", timestamp, ",1,1\n"));
    EXPECT_TRUE(IsError(ReadAzureTrace(path).status(), absl::StatusCode::kInvalidArgument,
                        {path, ":2:", "TIMESTAMP is", "YYYY-MM-DD HH:MM:SS"}))
        << timestamp;
  }
  const std::string burst = WriteTemp("bad_burst_timestamp.csv",
                                      "Timestamp,Request tokens,Response tokens\n1,2,3\nnan,2,3\n");
  EXPECT_TRUE(IsError(ReadBurstGptTrace(burst).status(), absl::StatusCode::kInvalidArgument,
                      {burst, ":3:", "Timestamp is \"nan\""}));
}

TEST(BadInputTest, MissingColumn) {
  const std::string path = WriteTemp("bad_missing_column.csv",
                                     "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n");
  EXPECT_TRUE(IsError(ReadAzureTrace(path).status(), absl::StatusCode::kInvalidArgument,
                      {path, ":1:", "no \"GeneratedTokens\" column",
                       "expected columns TIMESTAMP,ContextTokens,GeneratedTokens"}));
}

TEST(BadInputTest, WrongHeader) {
  const std::string path = WriteTemp("bad_header.csv", "time,req,resp\n1,2,3\n");
  EXPECT_TRUE(IsError(ReadBurstGptTrace(path).status(), absl::StatusCode::kInvalidArgument,
                      {path, ":1:", "expected columns Timestamp,Request tokens,Response tokens"}));
  // Nothing to infer the format from either.
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  EXPECT_TRUE(
      IsError(LoadWorkload(spec, "", "", 1).status(), absl::StatusCode::kInvalidArgument,
              {path, ":1:", "cannot infer the trace format", "azure", "burstgpt", "mooncake"}));
}

TEST(BadInputTest, WrongFieldCountAndQuotes) {
  const std::string count =
      WriteTemp("bad_count.csv",
                "Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,2,3\n"
                "2,GPT,4,2,3\n");
  EXPECT_TRUE(IsError(ReadBurstGptTrace(count).status(), absl::StatusCode::kInvalidArgument,
                      {count, ":3:", "row has 5 fields; expected 4"}));
  const std::string quoted = WriteTemp("bad_quoted.csv",
                                       "Timestamp,Model,Request tokens,Response tokens\n"
                                       "1,\"GPT, 4\",2,3\n");
  EXPECT_TRUE(IsError(ReadBurstGptTrace(quoted).status(), absl::StatusCode::kInvalidArgument,
                      {quoted, ":2:", "quoted CSV fields are not supported"}));
}

TEST(BadInputTest, EmptyFileAndHeaderOnly) {
  const std::string empty = WriteTemp("bad_empty.csv", "");
  EXPECT_TRUE(IsError(ReadAzureTrace(empty).status(), absl::StatusCode::kInvalidArgument,
                      {empty, ":1:", "file is empty"}));
  const std::string header =
      WriteTemp("bad_header_only.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n");
  EXPECT_TRUE(IsError(ReadAzureTrace(header).status(), absl::StatusCode::kInvalidArgument,
                      {header, ":2:", "no data rows"}));
  const std::string jsonl = WriteTemp("bad_empty.jsonl", "\n\n");
  EXPECT_TRUE(IsError(ReadMooncakeTrace(jsonl).status(), absl::StatusCode::kInvalidArgument,
                      {jsonl, ":3:", "no data rows"}));
}

TEST(BadInputTest, MissingFile) {
  const std::string path = ::testing::TempDir() + "workload_test_nope.csv";
  EXPECT_TRUE(IsError(ReadAzureTrace(path).status(), absl::StatusCode::kNotFound, {path}));
  WorkloadSpec spec;
  spec.mutable_trace()->set_path("workload_test_nope.csv");
  EXPECT_TRUE(IsError(LoadWorkload(spec, ::testing::TempDir(), "", 1).status(),
                      absl::StatusCode::kNotFound, {path}));
  EXPECT_TRUE(IsError(ReadLengthCsv(::testing::TempDir()).status(),
                      absl::StatusCode::kInvalidArgument,
                      {::testing::TempDir(), "is a directory"}));
}

TEST(BadInputTest, MooncakeMissingKeyAndMalformed) {
  const std::string missing =
      WriteTemp("bad_missing_key.jsonl",
                "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n"
                "{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1]}\n");
  EXPECT_TRUE(IsError(ReadMooncakeTrace(missing).status(), absl::StatusCode::kInvalidArgument,
                      {missing, ":2:", "no \"output_length\" key"}));
  const std::string malformed = WriteTemp(
      "bad_malformed.jsonl", "{\"timestamp\": 0, \"input_length\": 5 \"output_length\": 1}\n");
  EXPECT_TRUE(IsError(ReadMooncakeTrace(malformed).status(), absl::StatusCode::kInvalidArgument,
                      {malformed, ":1:", "malformed JSON"}));
  const std::string negative = WriteTemp(
      "bad_negative_ts.jsonl", "{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1}\n");
  EXPECT_TRUE(IsError(ReadMooncakeTrace(negative).status(), absl::StatusCode::kInvalidArgument,
                      {negative, ":1:", "timestamp is \"-1\""}));
}

TEST(BadInputTest, BurstGptZeroRequestTokens) {
  const std::string path =
      WriteTemp("bad_burst_zero.csv",
                "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                "5,ChatGPT,472,18,490,Conversation log\n"
                "6,ChatGPT,0,0,0,Conversation log\n"
                "7,ChatGPT,0,12,12,Conversation log\n");
  EXPECT_TRUE(IsError(ReadBurstGptTrace(path).status(), absl::StatusCode::kInvalidArgument,
                      {path, ":4:", "Request tokens is \"0\"", "Response tokens is 12"}));
}

TEST(BadInputTest, AllBurstGptRowsFailed) {
  const std::string path =
      WriteTemp("bad_all_failed.csv", "Timestamp,Request tokens,Response tokens\n1,5,0\n2,6,0\n");
  WorkloadSpec spec;
  spec.mutable_trace()->set_path(path);
  EXPECT_TRUE(IsError(LoadWorkload(spec, "", "", 1).status(), absl::StatusCode::kInvalidArgument,
                      {path, "all 2 rows are failed requests"}));
}

}  // namespace
}  // namespace servesim::workload
