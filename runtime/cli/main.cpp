// tierlm — one binary, subcommands. Each subcommand lives in its own file under runtime/cli/.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"tierlm: LLM inference for machines whose memory is smaller than the model"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
