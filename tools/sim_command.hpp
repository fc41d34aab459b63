// `tilelab sim`: build a registered kernel for a machine, time it and write reports;
// `tilelab sweep`: the same over the values of one parameter.
#pragma once

#include <string>
#include <vector>

namespace tilelab::tools {

// Runs the subcommand with the arguments after "sim"; returns the process exit code
// (0 success, 1 error reported by the simulator, 2 usage error).
int run_sim_command(const std::vector<std::string>& args);

// The --help text of `tilelab sim`.
std::string sim_usage();

// `tilelab sweep`: simulates a kernel once per value of one parameter and prints a table
// (optionally CSV); exit codes as run_sim_command.
int run_sweep_command(const std::vector<std::string>& args);
std::string sweep_usage();

}  // namespace tilelab::tools
