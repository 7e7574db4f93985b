// servesim plot: a line chart (SVG, as in report.html) of any CSV table
// servesim writes (sweep.csv, search.csv, the max-rate study's table): one
// line per group of rows, x and y from named columns, rows filtered by
// column values. Points are sorted by x within a line; rows whose x or y is
// empty (a failed point) are left out.
#ifndef SERVESIM_REPORTS_PLOT_H_
#define SERVESIM_REPORTS_PLOT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace servesim::reports {

struct PlotSpec {
  std::string x, y;                  // column names
  std::vector<std::string> group;    // one line per distinct tuple of these
  std::vector<std::pair<std::string, std::string>> where;  // keep rows with column == value
  std::string title;                 // default "Y vs X"
};

// The chart of `csv` (the text of `path`, named in errors: unknown columns
// list the header, bad numbers give the line and column).
absl::StatusOr<std::string> PlotCsv(const std::string& csv, const std::string& path,
                                    const PlotSpec& spec);

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_PLOT_H_
