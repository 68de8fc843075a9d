// `llm`: the command-line entry point (CLI11 subcommands). The server, the engine and the
// kernels live in their own libraries; this file only dispatches.
#include <cstdio>
#include <exception>

#include "engine/error.h"
#include "server/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"llm: a Llama-family inference server built around tiled flash attention"};
  app.require_subcommand(1);
  llm::cli::Command generate = llm::cli::AddGenerate(app);
  llm::cli::Command make_model = llm::cli::AddMakeModel(app);
  llm::cli::Command bench = llm::cli::AddBench(app);
#if defined(LLM_HAS_SERVER)
  llm::cli::Command serve = llm::cli::AddServe(app);
  llm::cli::Command bench_serve = llm::cli::AddBenchServe(app);
  llm::cli::Command chat = llm::cli::AddChat(app);
#endif
#if defined(LLM_HAS_DOWNLOAD)
  llm::cli::Command download = llm::cli::AddDownload(app);
#endif
  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("make-model")) return make_model();
    if (app.got_subcommand("bench")) return bench();
#if defined(LLM_HAS_SERVER)
    if (app.got_subcommand("serve")) return serve();
    if (app.got_subcommand("bench-serve")) return bench_serve();
    if (app.got_subcommand("chat")) return chat();
#endif
#if defined(LLM_HAS_DOWNLOAD)
    if (app.got_subcommand("download")) return download();
#endif
  } catch (const llm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 1;
}
