// Internal to the HTTP server: one generation request in flight, from its parse to its last
// byte. Made on the parse pool; from Begin() on, touched only on its connection's strand.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/request.h"
#include "server/front_end.h"
#include "server/http/http_connection.h"
#include "server/http/openai_api.h"

namespace llm::server {

struct Flight {
  explicit Flight(std::shared_ptr<Connection> c) : conn(std::move(c)), timer(conn->executor()) {}

  std::shared_ptr<Connection> conn;
  ParsedRequest parsed;
  std::string id;
  std::shared_ptr<OutputChannel> channel;
  std::unique_ptr<ResponseBuilder> builder;
  int64_t prompt_tokens = 0;
  AdmissionSlot slot;        // from admission until Finish() runs
  asio::steady_timer timer;  // probes; a non-streamed response's status hold
  std::shared_ptr<OutputWaker> waker;
  // A Drain is posted and has not started: the engine's pushes until then need no other.
  std::shared_ptr<std::atomic<bool>> drain_posted = std::make_shared<std::atomic<bool>>(false);
  bool body_started = false;  // a non-streamed response's 200 and chunked head are out
  bool done = false;          // the last event was read
  Clock::time_point last_event = Clock::now();  // engine output (inter-token gaps)
  Clock::time_point last_write = Clock::now();  // bytes to the client (probes)
};

}  // namespace llm::server
