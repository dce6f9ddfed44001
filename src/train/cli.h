// `vlmtrain <subcommand> ...`: dispatch to the subcommands.
#pragma once

namespace vlm::train {

int run_cli(int argc, char** argv);

} // namespace vlm::train
