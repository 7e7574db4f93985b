// The servesim subcommands, one file each under services/commands/; each
// takes the arguments after its command word and returns the exit status
// (0 success, 1 bad input or a failed run, 2 a bad command line).
// servesim_main.cc dispatches to them. No model logic lives here: the
// commands parse flags, call into the libraries and print.
#ifndef SERVESIM_SERVICES_COMMANDS_COMMANDS_H_
#define SERVESIM_SERVICES_COMMANDS_COMMANDS_H_

#include <optional>
#include <string>
#include <vector>

#include "services/commands/flags.h"

namespace servesim::services {

using Args = std::vector<std::string>;

int RunCommand(const Args& args);       // run SCENARIO: simulate, print, write outputs
int ValidateCommand(const Args& args);  // validate SCENARIO: the resolved scenario and memory plan
int PresetsCommand(const Args& args);   // presets [KIND]: built-in presets
int StudyCommand(const Args& args);     // study attacc: the AttAcc paper's evaluation
int SweepCommand(const Args& args);     // sweep SCENARIO --vary ...: a cross product of runs
int MergeCommand(const Args& args);     // merge DIR...: sweep.csv from finished points
int SearchCommand(const Args& args);    // search SCENARIO --slo ...: max rate / min replicas
int PlotCommand(const Args& args);      // plot TABLE.csv --x --y: an SVG line chart
int ReplayCommand(const Args& args);    // replay RUN_DIR: a measured vLLM run, compared
int CalibrateCommand(const Args& args); // calibrate PROFILE_DIR: fit the roofline to a profile

// Prints the usage text on stdout; returns 0.
// `servesim --help`; with a command, that command's part of it.
int PrintUsage(const std::string& command = "");

// Parses `args` with `flags`: nullopt to go on, else the exit status to
// return at once (the usage text was asked for, or a usage error printed).
std::optional<int> ParseFlags(FlagParser& flags, const Args& args);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_COMMANDS_H_
