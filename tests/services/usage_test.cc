// `servesim --help` and each command's own part of it.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

using test_util::RunServesim;

TEST(UsageTest, EachCommandsHelpIsItsEntryAndTheOptionsItTakes) {
  const auto all = RunServesim({"--help"});
  EXPECT_EQ(all.code, 0);
  for (const char* part : {"servesim replay RUN_DIR", "servesim sweep SCENARIO", "Options of run",
                           "Studies (docs/studies.md):", "Device agents", "Exit status:"}) {
    EXPECT_TRUE(absl::StrContains(all.out, part)) << part;
  }

  const auto replay = RunServesim({"replay", "some/run", "--help"});
  EXPECT_EQ(replay.code, 0) << replay.out;
  EXPECT_TRUE(absl::StrContains(replay.out, "servesim replay RUN_DIR --out DIR")) << replay.out;
  EXPECT_TRUE(absl::StrContains(replay.out, "--strict: any")) << replay.out;
  EXPECT_TRUE(absl::StrContains(replay.out, "Options of run")) << replay.out;
  EXPECT_TRUE(absl::StrContains(replay.out, "Exit status:")) << replay.out;
  EXPECT_FALSE(absl::StrContains(replay.out, "servesim sweep")) << replay.out;
  EXPECT_FALSE(absl::StrContains(replay.out, "Device agents")) << replay.out;

  const auto sweep = RunServesim({"sweep", "-h"});
  EXPECT_EQ(sweep.code, 0);
  EXPECT_TRUE(absl::StrContains(sweep.out, "servesim sweep SCENARIO --vary")) << sweep.out;
  EXPECT_TRUE(absl::StrContains(sweep.out, "Studies (docs/studies.md):")) << sweep.out;
  EXPECT_FALSE(absl::StrContains(sweep.out, "servesim run SCENARIO")) << sweep.out;

  const auto plot = RunServesim({"help", "plot"});
  EXPECT_EQ(plot.code, 0);
  EXPECT_TRUE(absl::StrContains(plot.out, "servesim plot TABLE.csv")) << plot.out;
  EXPECT_FALSE(absl::StrContains(plot.out, "Options of run")) << plot.out;

  const auto unknown = RunServesim({"help", "nosuch"});
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_TRUE(absl::StrContains(unknown.out, "no help for nosuch: unknown command")) << unknown.out;
}

}  // namespace
}  // namespace servesim
