// tierlm — one binary, subcommands. Each subcommand lives in its own file under runtime/cli/.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "runtime/cli/commands.h"

int main(int argc, char** argv) {
  // stdout carries only the product (generated text, JSON, a rendered plan); every log line goes to stderr, so
  // `tierlm run > out.txt` and piped JSON stay clean whatever the run logs (e.g. the first-run calibration notice).
  spdlog::set_default_logger(spdlog::stderr_color_mt("tierlm"));
  CLI::App app{"tierlm: LLM inference for machines whose memory is smaller than the model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tierlm 0.1.0");
  tierlm::cli::add_run_command(app);
  tierlm::cli::add_bench_command(app);
  tierlm::cli::add_calibrate_command(app);
  tierlm::cli::add_wisdom_command(app);
  tierlm::cli::add_pack_command(app);
  tierlm::cli::add_serve_command(app);
  tierlm::cli::add_pull_command(app);
  tierlm::cli::add_fit_command(app);
  tierlm::cli::add_perplexity_command(app);
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
