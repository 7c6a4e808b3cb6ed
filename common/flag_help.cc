// See flag_help.h.
#include "common/flag_help.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dsv4 {

std::string FlagHelpText(absl::string_view usage, absl::string_view main_file) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), main_file)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out =
      absl::StrCat(usage, "\n\nFlags (spelled with dashes or underscores; --flag=value or --flag value):\n");
  for (const absl::CommandLineFlag* f : flags) {
    const std::string def =
        f->IsOfType<std::string>() ? absl::StrCat("\"", f->DefaultValue(), "\"") : f->DefaultValue();
    absl::StrAppend(&out, "  --", absl::StrReplaceAll(f->Name(), {{"_", "-"}}), " (default ", def, ")\n      ",
                    f->Help(), "\n");
  }
  absl::StrAppend(&out, "\n--helpfull lists every flag linked into the program, absl's and gRPC's included.\n");
  return out;
}

void HandleHelpFlag(int argc, char** argv, absl::string_view usage, absl::string_view main_file) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") return;
    if (a == "--help" || a == "-help" || a == "-h") {
      const std::string text = FlagHelpText(usage, main_file);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      std::exit(0);
    }
  }
}

}  // namespace dsv4
