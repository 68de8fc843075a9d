// Internal to the HTTP server: the state one generation request shares between its handler
// and its response's content provider.
#pragma once

#include <memory>
#include <string>

#include "engine/request.h"
#include "server/front_end.h"
#include "server/http/openai_api.h"

namespace llm::server {

// One generation request in flight: what the handler made and what the response streams.
struct Flight {
  ParsedRequest parsed;
  std::string id;
  std::shared_ptr<OutputChannel> channel;
  std::unique_ptr<ResponseBuilder> builder;
  int64_t prompt_tokens = 0;
  AdmissionSlot slot;  // from admission until Finish() runs
  bool sent_roles = false;
  bool done = false;  // the last event was read
  Clock::time_point last_event = Clock::now();
};

}  // namespace llm::server
