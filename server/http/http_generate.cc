// The generation routes: parse, admit, hand to the engine, stream the channel back.
#include <httplib.h>

#include "engine/error.h"
#include "server/http/flight.h"
#include "server/http/http_server.h"

namespace llm::server {
namespace {

using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

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

void HttpServer::Generate(const httplib::Request& req, httplib::Response& res, bool is_chat) {
  if (draining_) {
    return SendError(res, {503, "The server is shutting down.", "server_error", "", "unavailable"});
  }
  if (!engine_.IsHealthy()) {
    return SendError(res, {503,
                           "The engine is unhealthy (" + engine_.UnhealthyReason() +
                               "); the server must be restarted.",
                           "server_error", "", "engine_unhealthy"});
  }
  const json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return SendError(res, {400, "The request body is not a JSON object.", "invalid_request_error",
                           "", "invalid_json"});
  }
  auto flight = std::make_shared<Flight>();
  try {
    if (is_chat) {
      if (!chat_) {
        throw ApiError{400, "This model has no chat template; use /v1/completions.",
                       "invalid_request_error", "messages", "no_chat_template"};
      }
      flight->parsed = ParseChatBody(req.body, body, chat_, tokenizer_, model_);
    } else {
      flight->parsed = ParseCompletion(body, tokenizer_, model_);
    }
  } catch (const ApiError& e) {
    return SendError(res, e);
  } catch (const Error& e) {
    return SendError(res, {400, e.what(), "invalid_request_error", "", "invalid_request"});
  }
  Request& request = flight->parsed.request;
  if (!request.deadline && config_.default_timeout_seconds > 0) {
    request.deadline = DeadlineAfter(config_.default_timeout_seconds);
  }
  flight->prompt_tokens = std::ssize(request.prompt_ids);
  // Bounded admission: beyond the running batch, a bounded queue; past it, come back later.
  // The slot (server/front_end.h: one count for HTTP and gRPC) goes back in Finish(), or with
  // `flight` when the request goes no further than this handler.
  flight->slot = front_end_.Admit(flight->prompt_tokens);
  if (!flight->slot) {
    res.set_header("Retry-After", "1");
    return SendError(res, {429, "The server is at capacity; retry later.", "rate_limit_error", "",
                           "overloaded"});
  }
  flight->id = std::string(is_chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  request.request_id = flight->id;
  try {
    flight->channel = engine_.AddRequest(request);
  } catch (const EngineUnavailableError& e) {
    return SendError(res, {503, e.what(), "server_error", "", "engine_unhealthy"});
  } catch (const Error& e) {
    return SendError(res, {400, e.what(), "invalid_request_error", "", "invalid_request"});
  }
  flight->builder =
      std::make_unique<ResponseBuilder>(flight->parsed, tokenizer_, flight->id, model_.id);
  if (flight->parsed.stream) {
    StreamResponse(flight, res);
  } else {
    JsonResponse(flight, res);
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
}

void HttpServer::StreamResponse(std::shared_ptr<Flight> flight, httplib::Response& res) {
  const auto probe = std::chrono::milliseconds(int64_t(config_.probe_interval_seconds * 1000));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, flight, probe](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string line = "data: " + j.dump() + "\n\n";
          return sink.write(line.data(), line.size());
        };
        if (flight->parsed.is_chat && !flight->sent_roles) {
          flight->sent_roles = true;
          for (int i = 0; i < flight->parsed.request.sampling.n; ++i) {
            if (!send(flight->builder->RoleChunk(i))) return false;
          }
        }
        RequestOutput out;
        if (!flight->channel->Pop(&out, probe)) {
          static const char kPing[] = ": ping\n\n";  // an SSE comment: finds gone clients
          return sink.write(kPing, sizeof(kPing) - 1);
        }
        const auto now = Clock::now();
        if (!out.token_ids.empty()) {
          front_end_.metrics().InterTokenGap(Seconds(now - flight->last_event));
        }
        flight->last_event = now;
        if (out.finish_reason == FinishReason::kError) {
          // One OpenAI error event for the request (not one per choice), then a clean end.
          if (!out.is_last) return true;
          RecordFinished(*flight, out);
          static const char kDone[] = "data: [DONE]\n\n";
          if (!send(ErrorBody(EngineFailure(out))) || !sink.write(kDone, sizeof(kDone) - 1)) {
            return false;
          }
          sink.done();
          return true;
        }
        flight->builder->Add(out);
        const json chunk = flight->builder->Chunk(out);
        if (!chunk.is_null() && !send(chunk)) return false;
        if (!out.is_last) return true;
        RecordFinished(*flight, out);
        if (flight->parsed.include_usage && !send(flight->builder->UsageChunk())) return false;
        static const char kDone[] = "data: [DONE]\n\n";
        if (!sink.write(kDone, sizeof(kDone) - 1)) return false;
        sink.done();
        return true;
      },
      [this, flight](bool success) { Finish(*flight, !success); });
}

void HttpServer::JsonResponse(std::shared_ptr<Flight> flight, httplib::Response& res) {
  const auto probe = std::chrono::milliseconds(int64_t(config_.probe_interval_seconds * 1000));
  // The status line goes out with the first byte, and the chunked body below starts with a
  // probe. So hold it back for up to one probe interval (when the first probe is due anyway):
  // a request that ends by then, the usual case, gets its real status, a 5xx if it failed.
  const auto hold_until = flight->last_event + probe;
  RequestOutput out;
  for (auto now = Clock::now(); now < hold_until; now = Clock::now()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(hold_until - now);
    if (!flight->channel->Pop(&out, left)) continue;
    flight->builder->Add(out);
    if (!out.is_last) continue;
    RecordFinished(*flight, out);
    if (out.finish_reason == FinishReason::kError) {
      SendError(res, EngineFailure(out));
    } else {
      res.set_content(flight->builder->Final().dump(), "application/json");
    }
    Finish(*flight, /*client_gone=*/false);
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [this, flight, probe](size_t, httplib::DataSink& sink) {
        // Nothing is sent until the end, so probe the client every `probe`: leading
        // whitespace is valid JSON, and a write is the only way to see a gone client.
        if (Clock::now() - flight->last_event >= probe) {
          flight->last_event = Clock::now();
          if (!sink.write(" ", 1)) return false;
        }
        RequestOutput out;
        if (!flight->channel->Pop(&out, probe)) return true;
        flight->builder->Add(out);
        if (!out.is_last) return true;
        RecordFinished(*flight, out);
        if (out.finish_reason == FinishReason::kError) {
          // The 200 is out already: send the error object, then break the chunked body off
          // (no last chunk), so that clients see a failed transfer rather than a success.
          const std::string error = ErrorBody(EngineFailure(out)).dump();
          sink.write(error.data(), error.size());
          return false;
        }
        const std::string body = flight->builder->Final().dump();
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      },
      [this, flight](bool success) { Finish(*flight, !success); });
}

}  // namespace llm::server
