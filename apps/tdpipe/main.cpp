// main.cpp — the `tdpipe` command: plan, simulate, execute, compare.
#include <iostream>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tdpipe — plan, simulate, execute and compare pipeline-parallel schedules"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tdpipe 0.1.0");
  tdpipe::apps::add_plan_command(app);
  tdpipe::apps::add_sim_command(app);
  tdpipe::apps::add_compare_command(app);
  tdpipe::apps::add_balance_command(app);
  tdpipe::apps::add_search_command(app);
  tdpipe::apps::add_import_command(app);
#ifdef TDPIPE_HAVE_EXEC
  tdpipe::apps::add_exec_command(app);
  tdpipe::apps::add_calibrate_command(app);
#endif
  try {
    app.parse(argc, argv);
    tdpipe::ir::finish_stdout();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tdpipe::Error& e) {
    std::cerr << "tdpipe: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tdpipe: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
