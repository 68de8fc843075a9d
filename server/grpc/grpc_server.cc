#include "server/grpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <condition_variable>
#include <mutex>
#include <thread>

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

// One reactor per Generate call. A pump thread moves the request's channel to the wire,
// one write in flight at a time; a cancelled call cancels the engine request. The call's
// admission slot goes back when the reactor is done.
class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine& engine, FrontEnd& front_end, std::shared_ptr<OutputChannel> channel,
                  std::string id, int64_t num_prompt_tokens, AdmissionSlot slot)
      : engine_(engine),
        front_end_(front_end),
        channel_(std::move(channel)),
        id_(std::move(id)),
        num_prompt_tokens_(num_prompt_tokens),
        slot_(std::move(slot)) {
    // Held while pump_ is assigned: Pump() takes mu_ first, so OnDone (which only follows
    // the pump's Finish) never reads pump_ before this write (a data race otherwise).
    std::lock_guard<std::mutex> lock(mu_);
    pump_ = std::thread([this] { Pump(); });
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_pending_ = false;
    if (!ok) cancelled_ = true;
    cv_.notify_all();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  void OnDone() override {
    if (pump_.get_id() == std::this_thread::get_id()) {
      pump_.detach();
    } else {
      pump_.join();
    }
    delete this;  // releases slot_
  }

 private:
  void Pump() {
    { std::lock_guard<std::mutex> lock(mu_); }  // waits for the constructor to set pump_
    RequestOutput out;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !write_pending_ || cancelled_; });
        if (cancelled_) break;
      }
      if (!channel_->Pop(&out, std::chrono::milliseconds(50))) continue;
      const auto now = Clock::now();
      if (!out.token_ids.empty()) {
        front_end_.metrics().InterTokenGap(
            std::chrono::duration<double>(now - last_event_).count());
      }
      last_event_ = now;
      if (out.finish_reason == FinishReason::kError) {
        // A failed step: the call ends with an error status (one, not a message per choice).
        if (!out.is_last) continue;
        front_end_.RecordFinished(id_, "grpc", out);
        const auto code =
            engine_.IsHealthy() ? grpc::StatusCode::INTERNAL : grpc::StatusCode::UNAVAILABLE;
        Finish(grpc::Status(code, out.error));
        return;
      }
      msg_.Clear();
      ToProto(out, &msg_);
      const bool last = out.is_last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        write_pending_ = true;
      }
      if (last) {
        front_end_.RecordFinished(id_, "grpc", out);
        StartWriteAndFinish(&msg_, grpc::WriteOptions(), grpc::Status::OK);
        return;  // nothing touches `this` after Finish
      }
      StartWrite(&msg_);
    }
    engine_.Cancel(id_);  // the client went away: abort (blocks freed at the next step)
    front_end_.RecordAborted(id_, "grpc", num_prompt_tokens_);
    Finish(grpc::Status::CANCELLED);
  }

  Engine& engine_;
  FrontEnd& front_end_;
  std::shared_ptr<OutputChannel> channel_;
  std::string id_;
  int64_t num_prompt_tokens_;
  AdmissionSlot slot_;
  Clock::time_point last_event_ = Clock::now();  // for the metrics' inter-token gaps
  v1::GenerateResponse msg_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_pending_ = false;
  bool cancelled_ = false;
  std::thread pump_;
};

class GrpcServer::Service : public v1::Llm::CallbackService {
 public:
  Service(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer, server::ModelInfo model,
          const GrpcConfig& config)
      : engine_(engine),
        front_end_(front_end),
        tokenizer_(tokenizer),
        model_(std::move(model)),
        config_(config) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const v1::GenerateRequest* req) override {
    if (draining_) return new ErrorReactor({grpc::StatusCode::UNAVAILABLE, "shutting down"});
    if (!engine_.IsHealthy()) {
      return new ErrorReactor(
          {grpc::StatusCode::UNAVAILABLE, "engine unhealthy: " + engine_.UnhealthyReason()});
    }
    Request request = ToRequest(*req, tokenizer_, config_.default_timeout_seconds);
    // The same admission as HTTP's (its 429), by the same count; the slot goes back when the
    // call is done, or here when the request goes no further.
    const int64_t num_prompt_tokens = std::ssize(request.prompt_ids);
    AdmissionSlot slot = front_end_.Admit(num_prompt_tokens);
    if (!slot) {
      return new ErrorReactor({grpc::StatusCode::RESOURCE_EXHAUSTED, "at capacity; retry later"});
    }
    request.request_id =
        req->request_id().empty() ? "grpc-" + std::to_string(next_id_++) : req->request_id();
    std::shared_ptr<OutputChannel> channel;
    try {
      channel = engine_.AddRequest(request);  // validates: the same rules as HTTP
    } catch (const EngineUnavailableError& e) {
      return new ErrorReactor({grpc::StatusCode::UNAVAILABLE, e.what()});
    } catch (const Error& e) {
      return new ErrorReactor({grpc::StatusCode::INVALID_ARGUMENT, e.what()});
    }
    return new GenerateReactor(engine_, front_end_, std::move(channel), request.request_id,
                               num_prompt_tokens, std::move(slot));
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* req,
                                     v1::TokenizeResponse* res) override {
    for (int id : tokenizer_.EncodePrompt(req->text())) res->add_token_ids(id);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx, const v1::ModelInfoRequest*,
                                      v1::ModelInfoResponse* res) override {
    res->set_model(model_.id);
    res->set_max_model_len(model_.max_model_len);
    res->set_vocab_size(model_.vocab_size);
    res->set_kv_cache_tokens(engine_.kv_capacity_tokens());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::atomic<bool> draining_{false};

 private:
  Engine& engine_;
  FrontEnd& front_end_;
  const Tokenizer& tokenizer_;
  server::ModelInfo model_;
  GrpcConfig config_;
  std::atomic<uint64_t> next_id_{0};
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
}

}  // namespace llm::server
