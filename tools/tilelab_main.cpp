// `tilelab`: command-line front end; dispatches to subcommands.
#include <cstdio>
#include <string>
#include <vector>

#include "sim_command.hpp"

namespace {

const char* kUsage =
    "usage: tilelab <command> [options]\n"
    "\n"
    "commands:\n"
    "  sim     simulate a tile program on a NeuronCore-like machine and write reports\n"
    "  sweep   simulate a kernel over the values of one parameter; print a table or CSV\n"
    "\n"
    "Run 'tilelab <command> --help' for the options of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "sim") return tilelab::tools::run_sim_command({args.begin() + 1, args.end()});
  if (args[0] == "sweep") return tilelab::tools::run_sweep_command({args.begin() + 1, args.end()});
  std::fprintf(stderr, "tilelab: unknown command '%s'\n\n%s", args[0].c_str(), kUsage);
  return 2;
}
