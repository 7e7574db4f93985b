// `servesim plot`'s chart of a CSV table (reports/plot.h).
#include "reports/plot.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace servesim::reports {
namespace {

// servesim plot: one polyline per group, its points sorted by x, failed
// (empty) points and filtered rows left out; bad input names the column or
// the line.
TEST(PlotTest, OneLinePerGroupSortedByX) {
  const std::string csv =
      "trace,system,slo,rate\n"
      "conv,base,50,0.5\n"
      "conv,base,30,0.25\n"
      "conv,attacc,30,0.75\n"
      "conv,attacc,50,\n"
      "code,base,30,9\n";
  PlotSpec spec;
  spec.x = "slo", spec.y = "rate", spec.group = {"system"}, spec.where = {{"trace", "conv"}};
  auto svg = PlotCsv(csv, "t.csv", spec);
  ASSERT_TRUE(svg.ok()) << svg.status();
  // x spans 30..50 over 420 px from 70; y spans 0..0.75 over 225 px from 30.
  EXPECT_TRUE(absl::StrContains(*svg, "points=\"70.0,180.0 490.0,105.0 \"")) << *svg;
  EXPECT_TRUE(absl::StrContains(*svg, "points=\"70.0,30.0 \"")) << *svg;
  EXPECT_TRUE(absl::StrContains(*svg, ">base</text>"));
  EXPECT_TRUE(absl::StrContains(*svg, ">attacc</text>"));
  EXPECT_FALSE(absl::StrContains(*svg, "code"));
  EXPECT_TRUE(absl::StrContains(*svg, "rate vs slo"));
  spec.x = "tbt";
  auto bad = PlotCsv(csv, "t.csv", spec);
  EXPECT_EQ(bad.status().message(),
            "t.csv: --x column 'tbt' not in the header; columns: trace, system, slo, rate");
  spec.x = "slo";
  bad = PlotCsv(csv + "conv,base,x,1\n", "t.csv", spec);
  EXPECT_EQ(bad.status().message(), "t.csv:7: column 'slo' = 'x' is not a finite number");
  bad = PlotCsv(csv + "conv,base\n", "t.csv", spec);
  EXPECT_EQ(bad.status().message(), "t.csv:7: 2 fields; the header has 4");
}

}  // namespace
}  // namespace servesim::reports
