// Subcommands of the `llm` binary. Each registers its flags on the CLI11 app and returns
// the callback that runs it (exit status).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>

namespace llm {
class Tokenizer;
}

namespace llm::cli {

using Command = std::function<int()>;

Command AddGenerate(CLI::App& app);
Command AddMakeModel(CLI::App& app);
Command AddBench(CLI::App& app);
Command AddServe(CLI::App& app);
Command AddBenchServe(CLI::App& app);
Command AddChat(CLI::App& app);  // clients/cmd_chat.cc
Command AddDownload(CLI::App& app);

// The demo model's folder in this build (made by the `demo_model` target).
std::string DefaultModelDir();

}  // namespace llm::cli
