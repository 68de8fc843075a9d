#include "server/grpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <mutex>

#include "engine/error.h"
#include "llm.grpc.pb.h"
#include "server/grpc/grpc_convert.h"

namespace llm::server {
namespace {

void ToProto(const RequestOutput& out, v1::GenerateResponse* msg) {
  for (int id : out.token_ids) msg->add_token_ids(id);
  msg->set_text(out.text);
  for (const OutputLogprob& lp : out.logprobs) {
    v1::TokenLogprob* t = msg->add_logprobs();
    t->set_token_id(lp.token);
    t->set_logprob(lp.logprob);
    for (const TokenLogprob& alt : lp.top) {
      v1::TopLogprob* a = t->add_top();
      a->set_token_id(alt.token);
      a->set_logprob(alt.logprob);
    }
  }
  if (out.is_last) {
    msg->set_finish_reason(FinishReasonName(out.finish_reason));
    msg->mutable_usage()->set_prompt_tokens(out.usage.prompt_tokens);
    msg->mutable_usage()->set_completion_tokens(out.usage.completion_tokens);
    msg->mutable_usage()->set_cached_prompt_tokens(out.usage.cached_prompt_tokens);
  }
}

// A stream that ends at once with an error status.
class ErrorReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit ErrorReactor(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// One reactor per Generate call, and no thread: the engine's pushes wake it (the waker posts
// to the server's small wake pool), and each write's completion pulls the next output. One
// write is in flight at a time; whoever holds the `busy_` token (a wake or a write completion)
// pops and writes, so Finish is never called with a write outstanding. A cancelled call
// cancels the engine request. The call's admission slot goes back when the reactor is done.
// A reactor started without a channel (its grammar compiles first) is born holding the token:
// the compile job hands it on with Begin (the request is in the engine) or Fail.
class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine& engine, FrontEnd& front_end, WakerSet& wakers,
                  std::shared_ptr<OutputChannel> channel, std::string id, int64_t num_prompt_tokens,
                  AdmissionSlot slot)
      : engine_(engine),
        front_end_(front_end),
        wakers_(wakers),
        channel_(std::move(channel)),
        id_(std::move(id)),
        num_prompt_tokens_(num_prompt_tokens),
        slot_(std::move(slot)) {}

  // Makes the reactor and starts it: it lives until OnDone and the last posted wake (and
  // whoever else holds the returned pointer). A null `channel`: the caller holds the token
  // and must call Begin or Fail.
  static std::shared_ptr<GenerateReactor> Start(boost::asio::thread_pool& pool, Engine& engine,
                                                FrontEnd& front_end, WakerSet& wakers,
                                                std::shared_ptr<OutputChannel> channel,
                                                std::string id, int64_t num_prompt_tokens,
                                                AdmissionSlot slot) {
    const bool is_pending = channel == nullptr;
    auto self =
        std::make_shared<GenerateReactor>(engine, front_end, wakers, std::move(channel),
                                          std::move(id), num_prompt_tokens, std::move(slot));
    self->self_ = self;
    self->busy_ = is_pending;
    std::weak_ptr<GenerateReactor> weak = self;
    self->waker_ = std::make_shared<OutputWaker>([weak, &pool, posted = self->wake_posted_] {
      if (posted->exchange(true)) return;  // one wake in the pool at a time
      boost::asio::post(pool, [weak, posted] {
        posted->store(false);
        if (auto r = weak.lock()) r->Wake();
      });
    });
    wakers.Add(self->waker_);
    if (!is_pending) self->channel_->SetWaker(self->waker_);
    return self;
  }

  // The token holder of a pending reactor: the request is in the engine; stream it.
  void Begin(std::shared_ptr<OutputChannel> channel) {
    channel_ = std::move(channel);
    channel_->SetWaker(waker_);  // a wake now finds the token taken and leaves it to Run
    Run();
  }
  // The token holder of a pending reactor: the request goes no further; end with `status`.
  void Fail(const grpc::Status& status) { End(status); }
  // The client cancelled (a pending reactor's holder then records the abort and Fails).
  bool is_cancelled() const { return cancelled_; }
  const std::string& id() const { return id_; }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }

  void OnWriteDone(bool ok) override {
    if (!ok) cancelled_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    Wake();
  }
  void OnCancel() override {
    cancelled_ = true;
    Wake();
  }
  void OnDone() override {
    waker_->Detach();
    wakers_.Remove(waker_);
    slot_.Release();
    self_.reset();  // deleted now, or when the last posted wake lets go
  }

 private:
  // Any thread: takes the token if it is free and moves outputs to the wire.
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = true;
      if (busy_ || finished_) return;
      busy_ = true;
    }
    Run();
  }

  void Run() {
    RequestOutput out;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_ = false;
      }
      if (cancelled_) {
        engine_.Cancel(id_);  // the client went away: abort (blocks freed at the next step)
        front_end_.RecordAborted(id_, "grpc", num_prompt_tokens_);
        return End(grpc::Status::CANCELLED);
      }
      bool got = false;
      while (!got && channel_->TryPop(&out)) {
        // A failed step ends the call with one error status, not a message per choice.
        got = out.finish_reason != FinishReason::kError || out.is_last;
      }
      if (!got) {
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_ || cancelled_) continue;  // woken while popping
        busy_ = false;                         // idle: the next push wakes us
        return;
      }
      const auto now = Clock::now();
      if (!out.token_ids.empty()) {
        front_end_.metrics().InterTokenGap(
            std::chrono::duration<double>(now - last_event_).count());
      }
      last_event_ = now;
      if (out.finish_reason == FinishReason::kError) {
        front_end_.RecordFinished(id_, "grpc", out);
        const auto code =
            engine_.IsHealthy() ? grpc::StatusCode::INTERNAL : grpc::StatusCode::UNAVAILABLE;
        return End(grpc::Status(code, out.error));
      }
      msg_.Clear();
      ToProto(out, &msg_);
      if (out.is_last) {
        front_end_.RecordFinished(id_, "grpc", out);
        {
          std::lock_guard<std::mutex> lock(mu_);
          finished_ = true;
        }
        return StartWriteAndFinish(&msg_, grpc::WriteOptions(), grpc::Status::OK);
      }
      return StartWrite(&msg_);  // the token stays taken until OnWriteDone
    }
  }

  void End(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    Finish(status);
  }

  Engine& engine_;
  FrontEnd& front_end_;
  WakerSet& wakers_;
  std::shared_ptr<OutputChannel> channel_;
  std::string id_;
  int64_t num_prompt_tokens_;
  AdmissionSlot slot_;
  std::shared_ptr<GenerateReactor> self_;  // gRPC's reference, until OnDone
  std::shared_ptr<OutputWaker> waker_;
  std::shared_ptr<std::atomic<bool>> wake_posted_ = std::make_shared<std::atomic<bool>>(false);
  Clock::time_point last_event_ = Clock::now();  // for the metrics' inter-token gaps
  v1::GenerateResponse msg_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  bool busy_ = false;      // a thread is in Run(), or a write is in flight
  bool pending_ = false;   // woken since Run() last looked
  bool finished_ = false;  // Finish was called
};

class GrpcServer::Service : public v1::Llm::CallbackService {
 public:
  Service(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer, server::ModelInfo model,
          const GrpcConfig& config)
      : engine_(engine),
        front_end_(front_end),
        tokenizer_(tokenizer),
        model_(std::move(model)),
        config_(config),
        wake_pool_(static_cast<size_t>(std::max(1, config.num_threads))),
        compile_pool_(static_cast<size_t>(std::max(1, config.num_compile_threads))) {}

  // The API key, as HTTP's: metadata `authorization: Bearer KEY` (the health and reflection
  // services stay open for probes and tools).
  bool Authorized(const grpc::CallbackServerContext* ctx) const {
    if (config_.api_key.empty()) return true;
    const auto& metadata = ctx->client_metadata();
    const auto it = metadata.find("authorization");
    if (it == metadata.end()) return false;
    const std::string_view got(it->second.data(), it->second.size());
    constexpr std::string_view kBearer = "Bearer ";
    return got.starts_with(kBearer) &&
           ConstantTimeEquals(got.substr(kBearer.size()), config_.api_key);
  }
  static grpc::Status Unauthenticated() {
    return {grpc::StatusCode::UNAUTHENTICATED,
            "invalid or missing API key (send metadata authorization: Bearer <key>)"};
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req) override {
    if (!Authorized(ctx)) return new ErrorReactor(Unauthenticated());
    if (draining_) return new ErrorReactor({grpc::StatusCode::UNAVAILABLE, "shutting down"});
    if (!engine_.IsHealthy()) {
      return new ErrorReactor(
          {grpc::StatusCode::UNAVAILABLE, "engine unhealthy: " + engine_.UnhealthyReason()});
    }
    Request request = ToRequest(*req, tokenizer_, config_.default_timeout_seconds);
    std::optional<grammar::StructuredSpec> spec;
    if (grpc::Status bad = ToStructuredSpec(req->sampling(), &spec); !bad.ok()) {
      return new ErrorReactor(bad);
    }
    if (spec && !model_.grammars) {
      return new ErrorReactor({grpc::StatusCode::FAILED_PRECONDITION,
                               "sampling.structured: structured outputs are not available on this "
                               "server (no token vocabulary)"});
    }
    // The same admission as HTTP's (its 429), by the same count; the slot goes back when the
    // call is done, or here when the request goes no further.
    const int64_t num_prompt_tokens = std::ssize(request.prompt_ids);
    AdmissionSlot slot = front_end_.Admit(num_prompt_tokens);
    if (!slot) {
      return new ErrorReactor({grpc::StatusCode::RESOURCE_EXHAUSTED, "at capacity; retry later"});
    }
    request.request_id =
        req->request_id().empty() ? "grpc-" + std::to_string(next_id_++) : req->request_id();
    if (spec) {
      // A compile may take up to its deadline: on the compile pool, not this callback thread.
      // The admission slot is held meanwhile, so at most the admission limit waits there.
      auto reactor = GenerateReactor::Start(wake_pool_, engine_, front_end_, wakers_, nullptr,
                                            request.request_id, num_prompt_tokens, std::move(slot));
      boost::asio::post(compile_pool_,
                        [this, reactor, request = std::move(request), spec = *spec]() mutable {
                          CompileAndSubmit(*reactor, std::move(request), spec);
                        });
      return reactor.get();
    }
    std::shared_ptr<OutputChannel> channel;
    if (grpc::Status bad = Submit(request, &channel); !bad.ok()) return new ErrorReactor(bad);
    return GenerateReactor::Start(wake_pool_, engine_, front_end_, wakers_, std::move(channel),
                                  request.request_id, num_prompt_tokens, std::move(slot))
        .get();
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* req,
                                     v1::TokenizeResponse* res) override {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorized(ctx)) {
      reactor->Finish(Unauthenticated());
      return reactor;
    }
    for (int id : tokenizer_.EncodePrompt(req->text())) res->add_token_ids(id);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx, const v1::ModelInfoRequest*,
                                      v1::ModelInfoResponse* res) override {
    if (!Authorized(ctx)) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(Unauthenticated());
      return reactor;
    }
    res->set_model(model_.id);
    res->set_max_model_len(model_.max_model_len);
    res->set_vocab_size(model_.vocab_size);
    res->set_kv_cache_tokens(engine_.kv_capacity_tokens());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Stops the wakes: no engine push reaches the pool after this; then the pools end (a
  // compile in progress first runs to its end or its deadline).
  void StopWakes() {
    wakers_.DetachAll();
    wake_pool_.join();
    compile_pool_.join();
  }

  std::atomic<bool> draining_{false};

 private:
  // Into the engine's inbox; validates (the same rules as HTTP).
  grpc::Status Submit(const Request& request, std::shared_ptr<OutputChannel>* channel) {
    try {
      *channel = engine_.AddRequest(request);
    } catch (const EngineUnavailableError& e) {
      return {grpc::StatusCode::UNAVAILABLE, e.what()};
    } catch (const Error& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    }
    return grpc::Status::OK;
  }

  // On the compile pool, holding `reactor`'s token: the grammar, then the engine, then the
  // stream (or the call ends with the compile's or the engine's error).
  void CompileAndSubmit(GenerateReactor& reactor, Request request,
                        const grammar::StructuredSpec& spec) {
    grpc::Status status = reactor.is_cancelled() ? grpc::Status::CANCELLED
                                                 : CompileStructured(spec, *model_.grammars,
                                                                     &request.sampling.grammar);
    if (status.ok() && reactor.is_cancelled()) status = grpc::Status::CANCELLED;
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      front_end_.RecordAborted(reactor.id(), "grpc", reactor.num_prompt_tokens());
    }
    std::shared_ptr<OutputChannel> channel;
    if (status.ok()) status = Submit(request, &channel);
    if (!status.ok()) return reactor.Fail(status);
    reactor.Begin(std::move(channel));
  }

  Engine& engine_;
  FrontEnd& front_end_;
  const Tokenizer& tokenizer_;
  server::ModelInfo model_;
  GrpcConfig config_;
  std::atomic<uint64_t> next_id_{0};
  WakerSet wakers_;
  boost::asio::thread_pool wake_pool_;
  boost::asio::thread_pool compile_pool_;  // structured outputs' grammars (CompileAndSubmit)
};

GrpcServer::GrpcServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer,
                       ModelInfo model, GrpcConfig config)
    : service_(std::make_unique<Service>(engine, front_end, tokenizer, std::move(model), config)),
      engine_(engine),
      config_(std::move(config)) {}

GrpcServer::~GrpcServer() { Stop(); }

int GrpcServer::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config_.host + ":" + std::to_string(config_.port),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    throw Error("gRPC: cannot listen on " + config_.host + ":" + std::to_string(config_.port));
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  // An unhealthy engine turns the health service NOT_SERVING (orchestrators restart us).
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health_listener_ = engine_.AddHealthListener([health] { health->SetServingStatus(false); });
  return port;
}

void GrpcServer::BeginDrain() {
  service_->draining_ = true;
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::Stop() {
  if (!server_) return;
  engine_.RemoveHealthListener(health_listener_);  // before the health service goes away
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  service_->StopWakes();
}

}  // namespace llm::server
