// --help for the dsv4 programs: lists the program's own flags (dashed spelling, default, meaning) and exits 0.
//
// absl's own --help (Debian's absl 20220623) shows only flags defined in a file named after the program
// (dsv4-worker.cc), so for flags in worker/main.cc it prints "No flags matched" and exits 1. HandleHelpFlag
// runs before absl::ParseCommandLine and answers --help, -help and -h itself; --helpfull and --help=SUBSTRING
// stay absl's.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

namespace dsv4 {

// The help text: `usage`, then every flag defined in a source file whose path ends with `main_file`
// (e.g. "worker/main.cc"), sorted by name, as "  --max-batch (default 32)" and its help line.
std::string FlagHelpText(absl::string_view usage, absl::string_view main_file);

// When argv[1..] holds --help, -help or -h (before any "--"), prints FlagHelpText to stdout and exits 0.
void HandleHelpFlag(int argc, char** argv, absl::string_view usage, absl::string_view main_file);

}  // namespace dsv4
