// `vlmtrain <subcommand> ...`: dispatch to the subcommands.
#pragma once

namespace vlm::cli {

int run_cli(int argc, char** argv);

} // namespace vlm::cli
