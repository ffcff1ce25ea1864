// runtime/cli/commands.h — each subcommand registers itself on the CLI11 app; main() only dispatches.
#pragma once

namespace CLI {
class App;
}

namespace tierlm::cli {

void add_run_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_profile_command(CLI::App& bench);  // `tierlm bench profile`
void add_calibrate_command(CLI::App& app);
void add_wisdom_command(CLI::App& app);
void add_pack_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_pull_command(CLI::App& app);
void add_fit_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);

}  // namespace tierlm::cli
