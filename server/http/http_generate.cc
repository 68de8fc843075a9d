// The generation routes: parse and tokenize on the parse pool, admit, hand to the engine, then
// write the channel out from the connection's strand as the engine wakes it.
#include <boost/asio/post.hpp>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "server/http/flight.h"
#include "server/http/http_server.h"

namespace llm::server {
namespace {

using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string SseEvent(const json& j) { return "data: " + j.dump() + "\n\n"; }

constexpr std::string_view kSseDone = "data: [DONE]\n\n";
constexpr std::string_view kSsePing = ": ping\n\n";  // an SSE comment: for proxies

}  // namespace

// A request the engine ended with "error": its step failed (500), or the engine has turned
// unhealthy and the process awaits a restart (503: go elsewhere).
ApiError HttpServer::EngineFailure(const RequestOutput& out) const {
  if (!engine_.IsHealthy()) return {503, out.error, "server_error", "", "engine_unhealthy"};
  return {500, out.error, "server_error", "", "engine_step_failed"};
}

void HttpServer::RecordFinished(Flight& flight, const RequestOutput& last) {
  flight.done = true;
  front_end_.RecordFinished(flight.id, "http", last);
}

void HttpServer::Generate(const ConnPtr& conn, std::string body, bool is_chat) {
  if (draining_) {
    return conn->Reply(
        ErrorResponse({503, "The server is shutting down.", "server_error", "", "unavailable"}));
  }
  if (!engine_.IsHealthy()) {
    return conn->Reply(ErrorResponse({503,
                                      "The engine is unhealthy (" + engine_.UnhealthyReason() +
                                          "); the server must be restarted.",
                                      "server_error", "", "engine_unhealthy"}));
  }
  // Parsing, the chat template and tokenization take time that must not hold an I/O thread.
  asio::post(parse_pool_, [this, conn, body = std::move(body), is_chat] {
    auto flight = std::make_shared<Flight>(conn);
    std::optional<HttpResponse> refused;
    try {
      refused = Prepare(*flight, body, is_chat);
    } catch (const std::exception&) {
      refused = ErrorResponse({500, "internal server error", "internal_error", "", ""});
    }
    asio::post(conn->executor(), [this, flight, refused = std::move(refused)]() mutable {
      if (refused) {
        flight->conn->Reply(std::move(*refused));
      } else {
        Begin(flight);
      }
    });
  });
}

// On the parse pool: the request made, admitted and queued in the engine, or the response
// that refuses it.
std::optional<HttpResponse> HttpServer::Prepare(Flight& flight, const std::string& text,
                                                bool is_chat) {
  const json body = ParseJsonBody(text);
  if (body.is_discarded() || !body.is_object()) {
    return ErrorResponse({400,
                          "The request body is not a JSON object (or nests deeper than " +
                              std::to_string(kMaxJsonDepth) + " levels).",
                          "invalid_request_error", "", "invalid_json"});
  }
  try {
    if (is_chat) {
      if (!chat_) {
        throw ApiError{400, "This model has no chat template; use /v1/completions.",
                       "invalid_request_error", "messages", "no_chat_template"};
      }
      flight.parsed = ParseChatBody(text, body, chat_, tokenizer_, model_);
    } else {
      flight.parsed = ParseCompletion(body, tokenizer_, model_, text);
    }
  } catch (const ApiError& e) {
    return ErrorResponse(e);
  } catch (const Error& e) {
    return ErrorResponse({400, e.what(), "invalid_request_error", "", "invalid_request"});
  }
  Request& request = flight.parsed.request;
  if (!request.deadline && config_.default_timeout_seconds > 0) {
    request.deadline = DeadlineAfter(config_.default_timeout_seconds);
  }
  flight.prompt_tokens = std::ssize(request.prompt_ids);
  // Bounded admission: beyond the running batch, a bounded queue; past it, come back later.
  // The slot (server/front_end.h: one count for HTTP and gRPC) goes back in Finish(), or with
  // `flight` when the request goes no further than this.
  flight.slot = front_end_.Admit(flight.prompt_tokens);
  if (!flight.slot) {
    HttpResponse res = ErrorResponse(
        {429, "The server is at capacity; retry later.", "rate_limit_error", "", "overloaded"});
    res.set(beast_http::field::retry_after, "1");
    return res;
  }
  flight.id = std::string(is_chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  request.request_id = flight.id;
  try {
    flight.channel = engine_.AddRequest(request);
  } catch (const EngineUnavailableError& e) {
    return ErrorResponse({503, e.what(), "server_error", "", "engine_unhealthy"});
  } catch (const Error& e) {
    return ErrorResponse({400, e.what(), "invalid_request_error", "", "invalid_request"});
  }
  flight.builder =
      std::make_unique<ResponseBuilder>(flight.parsed, tokenizer_, flight.id, model_.id);
  return std::nullopt;
}

// On the strand: the response starts, and the engine's pushes wake it from here on.
void HttpServer::Begin(const std::shared_ptr<Flight>& flight) {
  Connection& conn = *flight->conn;
  if (conn.gone()) return Finish(*flight, /*client_gone=*/true);  // it left while we parsed
  conn.OnGone([this, flight] { Finish(*flight, /*client_gone=*/true); });
  // The waker runs on the engine thread: one Drain posted at a time, whatever it pushes.
  std::weak_ptr<Flight> weak = flight;
  flight->waker = std::make_shared<OutputWaker>(
      [this, weak, strand = conn.executor(), posted = flight->drain_posted] {
        if (posted->exchange(true)) return;
        // `this` outlives the posted task: Stop() detaches every waker, then ends the loop.
        asio::post(strand, [this, weak, posted] {
          posted->store(false);
          if (auto f = weak.lock()) Drain(f);
        });
      });
  wakers_.Add(flight->waker);
  const auto probe = SecondsToDuration(config_.probe_interval_seconds);
  if (flight->parsed.stream) {
    HttpResponse head{beast_http::status::ok, 11};
    head.set(beast_http::field::content_type, "text/event-stream");
    head.set(beast_http::field::cache_control, "no-cache");
    conn.BeginBody(std::move(head));
    if (flight->parsed.is_chat) {
      std::string roles;
      for (int i = 0; i < flight->parsed.request.sampling.n; ++i) {
        roles += SseEvent(flight->builder->RoleChunk(i));
      }
      conn.Write(std::move(roles));
    }
    ArmProbe(flight, Clock::now() + probe);
  } else {
    // The status line goes out with the first byte, and a chunked body would start with a
    // probe. So hold it back for one probe interval (when the first probe is due anyway): a
    // request that ends by then, the usual case, gets its real status, a 5xx if it failed.
    ArmProbe(flight, flight->last_event + probe);
  }
  flight->channel->SetWaker(flight->waker);
}

void HttpServer::ArmProbe(const std::shared_ptr<Flight>& flight, Clock::time_point at) {
  flight->timer.expires_at(at);
  flight->timer.async_wait([this, flight](boost::system::error_code ec) {
    if (!ec) Probe(flight);
  });
}

// Nothing was written for a probe interval: a stream gets an SSE comment; a non-streamed
// response sends its 200 and a chunked head, then leading whitespace (valid JSON).
void HttpServer::Probe(const std::shared_ptr<Flight>& flight) {
  if (flight->done || !flight->slot) return;
  Connection& conn = *flight->conn;
  const auto probe = SecondsToDuration(config_.probe_interval_seconds);
  const auto now = Clock::now();
  if (flight->parsed.stream) {
    if (now - flight->last_write >= probe) {
      conn.Write(std::string(kSsePing));
      flight->last_write = now;
    }
  } else if (!flight->body_started) {
    flight->body_started = true;
    HttpResponse head{beast_http::status::ok, 11};
    head.set(beast_http::field::content_type, "application/json");
    conn.BeginBody(std::move(head));
    flight->last_write = now;
  } else if (now - flight->last_write >= probe) {
    conn.Write(" ");
    flight->last_write = now;
  }
  ArmProbe(flight, std::max(now, flight->last_write) + probe);
}

void HttpServer::Drain(const std::shared_ptr<Flight>& flight) {
  if (flight->done || !flight->slot) return;
  if (flight->parsed.stream) {
    DrainStream(*flight);
  } else {
    DrainJson(*flight);
  }
}

void HttpServer::DrainStream(Flight& flight) {
  Connection& conn = *flight.conn;
  std::string events;  // everything the engine has pushed, in one write
  RequestOutput out;
  while (!flight.done && flight.channel->TryPop(&out)) {
    const auto now = Clock::now();
    if (!out.token_ids.empty())
      front_end_.metrics().InterTokenGap(Seconds(now - flight.last_event));
    flight.last_event = now;
    if (out.finish_reason == FinishReason::kError) {
      // One OpenAI error event for the request (not one per choice), then a clean end.
      if (!out.is_last) continue;
      RecordFinished(flight, out);
      events += SseEvent(ErrorBody(EngineFailure(out)));
      events += kSseDone;
      break;
    }
    flight.builder->Add(out);
    const json chunk = flight.builder->Chunk(out);
    if (!chunk.is_null()) events += SseEvent(chunk);
    if (!out.is_last) continue;
    RecordFinished(flight, out);
    if (flight.parsed.include_usage) events += SseEvent(flight.builder->UsageChunk());
    events += kSseDone;
  }
  if (!events.empty()) {
    conn.Write(std::move(events));
    flight.last_write = Clock::now();
  }
  if (flight.done) {
    Finish(flight, /*client_gone=*/false);
    conn.EndBody();
  }
}

void HttpServer::DrainJson(Flight& flight) {
  Connection& conn = *flight.conn;
  RequestOutput out;
  while (flight.channel->TryPop(&out)) {
    flight.last_event = Clock::now();
    flight.builder->Add(out);
    if (!out.is_last) continue;
    RecordFinished(flight, out);
    Finish(flight, /*client_gone=*/false);
    const bool failed = out.finish_reason == FinishReason::kError;
    if (!flight.body_started) {
      return conn.Reply(failed ? ErrorResponse(EngineFailure(out))
                               : JsonResponse(200, flight.builder->Final()));
    }
    if (failed) {
      // The 200 is out already: send the error object, then break the chunked body off (no
      // last chunk), so that clients see a failed transfer rather than a success.
      conn.Write(ErrorBody(EngineFailure(out)).dump());
      return conn.Abort();
    }
    conn.Write(flight.builder->Final().dump());
    return conn.EndBody();
  }
}

// Runs once per request, when its response is over or its client went away.
void HttpServer::Finish(Flight& flight, bool client_gone) {
  if (!flight.slot) return;  // ran already
  if (client_gone && !flight.done) {
    engine_.Cancel(flight.id);
    front_end_.RecordAborted(flight.id, "http", flight.prompt_tokens);
  }
  flight.slot.Release();
  if (flight.waker) {
    flight.waker->Detach();
    wakers_.Remove(flight.waker);
  }
  flight.timer.cancel();
  flight.conn->OnGone(nullptr);  // breaks the connection -> flight cycle
}

}  // namespace llm::server
