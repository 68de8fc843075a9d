// `llm chat --url URL [--system TEXT] [--max-tokens N] [--temperature T]`: a command-line
// chat client for a running server (OpenAI chat API over HTTP, streamed). Reads one user
// message per line from stdin, prints the assistant's reply as it streams, keeps the
// conversation history; "/reset" clears it, EOF or "/quit" ends.
#include <httplib.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "server/cli/commands.h"

namespace llm::cli {
namespace {

using nlohmann::ordered_json;

struct ChatFlags {
  std::string url = "http://127.0.0.1:8000";
  std::string system;
  std::string api_key;
  int max_tokens = 256;
  double temperature = 0.7;
};

// Streams one assistant turn; returns its text ("" and a message on stderr on failure).
std::string StreamReply(httplib::Client& client, const ChatFlags& f, const ordered_json& messages) {
  const ordered_json body = {{"messages", messages},
                             {"max_tokens", f.max_tokens},
                             {"temperature", f.temperature},
                             {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!f.api_key.empty()) req.set_header("Authorization", "Bearer " + f.api_key);
  std::string buffer, reply;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: {", 0) != 0) continue;
      const auto chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || chunk["choices"].empty()) continue;
      const std::string delta = chunk["choices"][0]["delta"].value("content", "");
      reply += delta;
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!client.send(req, res, error)) {
    std::fprintf(stderr, "error: %s\n", httplib::to_string(error).c_str());
    return "";
  }
  if (res.status != 200) {
    std::fprintf(stderr, "error: HTTP %d %s\n", res.status, (buffer + res.body).c_str());
    return "";
  }
  std::fputc('\n', stdout);
  return reply;
}

int RunChat(const ChatFlags& f) {
  httplib::Client client(f.url);
  client.set_read_timeout(600, 0);
  ordered_json messages = ordered_json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  const size_t keep = messages.size();
  std::string line;
  int failures = 0;
  while (std::getline(std::cin, line)) {
    if (line == "/quit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + static_cast<ptrdiff_t>(keep), messages.end());
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string reply = StreamReply(client, f, messages);
    if (reply.empty()) {
      messages.erase(messages.end() - 1);  // the turn failed: forget it
      ++failures;
      continue;
    }
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

Command AddChat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "chat with a running server (streamed, with history)");
  auto f = std::make_shared<ChatFlags>();
  cmd->add_option("--url", f->url, "server base URL")->capture_default_str();
  cmd->add_option("--system", f->system, "system prompt");
  cmd->add_option("--max-tokens", f->max_tokens)->capture_default_str();
  cmd->add_option("--temperature", f->temperature)->capture_default_str();
  cmd->add_option("--api-key", f->api_key)->envname("LLM_API_KEY");
  return [f] { return RunChat(*f); };
}

}  // namespace llm::cli
