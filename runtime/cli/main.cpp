// tierlm — one binary, subcommands. Each subcommand lives in its own file under runtime/cli/.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "runtime/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tierlm: LLM inference for machines whose memory is smaller than the model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tierlm 0.1.0");
  tierlm::cli::add_run_command(app);
  tierlm::cli::add_bench_command(app);
  tierlm::cli::add_calibrate_command(app);
  tierlm::cli::add_wisdom_command(app);
  tierlm::cli::add_pack_command(app);
  tierlm::cli::add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
