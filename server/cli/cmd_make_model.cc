// `llm make-model --config CONFIG.json --out DIR [--seed S] [--dtype bf16|f16|f32]
//                 [--tokenizer tokenizer.model|tokenizer.json|FOLDER] [--chat-template T]`
#include <chrono>
#include <cstdio>
#include <map>

#include "engine/loader/make_model.h"
#include "server/cli/commands.h"

namespace llm::cli {

std::string DefaultModelDir() { return LLM_DEFAULT_MODEL_DIR; }

Command AddMakeModel(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-model",
                                 "write a random-weight checkpoint folder (Hugging Face layout)");
  auto opts = std::make_shared<MakeModelOptions>();
  auto dtype = std::make_shared<DType>(DType::kBF16);
  const std::map<std::string, DType> dtypes = {
      {"bf16", DType::kBF16}, {"f16", DType::kF16}, {"f32", DType::kF32}};
  opts->tokenizer_path = DefaultModelDir() + "/tokenizer.model";
  cmd->add_option("--config", opts->config_path, "config.json to instantiate")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", opts->out_dir, "output folder")->required();
  cmd->add_option("--seed", opts->seed, "random seed")->capture_default_str();
  cmd->add_option("--dtype", *dtype, "weight dtype")
      ->transform(CLI::CheckedTransformer(dtypes, CLI::ignore_case))
      ->default_str("bf16");
  cmd->add_option("--tokenizer", opts->tokenizer_path,
                  "tokenizer to include: a tokenizer.model or tokenizer.json file, or a folder "
                  "with one (and its tokenizer_config.json) (default: the demo model's)")
      ->capture_default_str();
  cmd->add_option("--chat-template", opts->chat_template_path,
                  "Jinja chat template to store in tokenizer_config.json")
      ->check(CLI::ExistingFile);
  return [opts, dtype] {
    opts->dtype = *dtype;
    const auto start = std::chrono::steady_clock::now();
    MakeRandomModel(*opts);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "wrote %s in %.1f s\n", opts->out_dir.c_str(), s);
    return 0;
  };
}

}  // namespace llm::cli
