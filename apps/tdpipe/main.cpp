// main.cpp — the `tdpipe` command: plan, simulate, execute, compare.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/closest.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::apps {
namespace {
std::vector<std::string> g_invocation;
}
void set_invocation(int argc, char** argv) { g_invocation.assign(argv, argv + argc); }
const std::vector<std::string>& invocation() { return g_invocation; }

namespace {
const auto all = [](const auto*) { return true; };

/// The word where the subcommand goes (argv[1]), "" when that is an option or missing.
std::string command_word(const std::vector<std::string>& args) {
  return args.size() < 2 || args[1].empty() || args[1][0] == '-' ? "" : args[1];
}

/// The subcommand named `word`, or null.
const CLI::App* subcommand_named(const CLI::App& app, const std::string& word) {
  for (const CLI::App* s : app.get_subcommands(all))
    if (s->get_name() == word) return s;
  return nullptr;
}

/// After a parse error: the subcommand, or each long option of the subcommand, that a
/// mistyped one most likely meant ("" when none is close).
std::string did_you_mean(const CLI::App& app, const std::vector<std::string>& args) {
  if (command_word(args).empty()) return "";
  const CLI::App* sub = subcommand_named(app, args[1]);
  if (!sub) {
    std::vector<std::string> names;
    for (const CLI::App* s : app.get_subcommands(all)) names.push_back(s->get_name());
    const auto c = ir::closest(args[1], names);
    return c ? fmt::format("did you mean 'tdpipe {}'?", *c) : "";
  }
  std::vector<std::string> longs;
  for (const CLI::Option* o : sub->get_options(all))
    for (const std::string& n : o->get_lnames()) longs.push_back("--" + n);
  std::string out;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string flag = args[i].substr(0, args[i].find('='));
    if (flag.rfind("--", 0) != 0 || flag == "--" || std::find(longs.begin(), longs.end(), flag) != longs.end())
      continue;
    if (const auto c = ir::closest(flag, longs))
      out += fmt::format("{}did you mean {} for {}?", out.empty() ? "" : " ", *c, flag);
  }
  return out;
}
}  // namespace
}  // namespace tdpipe::apps

int main(int argc, char** argv) {
  tdpipe::apps::set_invocation(argc, argv);
  CLI::App app{"tdpipe — plan, simulate, execute and compare pipeline-parallel schedules"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tdpipe 0.1.0");
  tdpipe::apps::add_plan_command(app);
  tdpipe::apps::add_sim_command(app);
  tdpipe::apps::add_serve_command(app);
  tdpipe::apps::add_compare_command(app);
  tdpipe::apps::add_balance_command(app);
  tdpipe::apps::add_search_command(app);
  tdpipe::apps::add_import_command(app);
  tdpipe::apps::add_trace_command(app);
#ifdef TDPIPE_HAVE_EXEC
  tdpipe::apps::add_exec_command(app);
  tdpipe::apps::add_calibrate_command(app);
#endif
  tdpipe::apps::add_completion_command(app);  // last: it lists the others
  try {
    app.parse(argc, argv);
    tdpipe::ir::finish_stdout();
  } catch (const CLI::ParseError& e) {
    const auto& args = tdpipe::apps::invocation();
    const std::string hint = tdpipe::apps::did_you_mean(app, args);
    // A word where the subcommand goes that is none: say that, not "a subcommand is required".
    if (const std::string word = tdpipe::apps::command_word(args);
        e.get_exit_code() != 0 && !word.empty() && !tdpipe::apps::subcommand_named(app, word)) {
      std::cerr << "tdpipe: '" << args[1] << "' is not a tdpipe command" << (hint.empty() ? "" : "; ") << hint
                << "\nRun with --help for the commands.\n";
      return e.get_exit_code();
    }
    const int rc = app.exit(e);
    if (rc != 0 && !hint.empty()) std::cerr << "tdpipe: " << hint << "\n";
    return rc;
  } catch (const tdpipe::Error& e) {
    std::cerr << "tdpipe: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tdpipe: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
