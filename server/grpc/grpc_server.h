// The gRPC front end (proto/llm.proto): Generate streams tokens with one callback reactor per
// call and no thread per call (the engine's pushes wake the reactor through a small pool; a
// write's completion pulls the next output); cancelling the call aborts the request in the
// engine. With an API key, Generate, Tokenize and ModelInfo need metadata `authorization:
// Bearer KEY` (else UNAUTHENTICATED; health and reflection stay open). The standard health service
// (grpc.health.v1) and server reflection run on the same port. A request whose engine step
// failed ends with status INTERNAL (UNAVAILABLE once the engine is unhealthy, which also
// turns the health service NOT_SERVING and new calls UNAVAILABLE). Admission and metrics are
// the FrontEnd's, shared with HTTP (server/front_end.h): beyond the limits, RESOURCE_EXHAUSTED;
// every call is counted in GET /metrics. A structured output (sampling.structured) compiles
// with the HTTP front end's GrammarCompiler (ModelInfo::grammars: one cache) on a small pool of
// its own, never on a gRPC callback thread (a compile may take up to the compile deadline);
// no compiler (no token vocabulary): FAILED_PRECONDITION.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/front_end.h"
#include "server/http/openai_api.h"

namespace grpc {
class Server;
}

namespace llm::server {

struct GrpcConfig {
  std::string host = "127.0.0.1";
  int port = 50051;  // 0: any free port
  double default_timeout_seconds = 0;
  std::string api_key = "";  // empty: no authentication (else metadata authorization: Bearer KEY)
  int num_threads = 2;       // the pool that engine pushes wake streams on
  int num_compile_threads = 2;  // the pool that structured outputs' grammars compile on
};

class GrpcServer {
 public:
  // `front_end` (admission, metrics) is shared with the HTTP server; it outlives this one.
  // `model.grammars`: the structured outputs' compiler (HTTP's; null: none on this server).
  GrpcServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer, ModelInfo model,
             GrpcConfig config);
  ~GrpcServer();
  int Start();        // returns the bound port; throws llm::Error when it cannot bind
  void BeginDrain();  // health NOT_SERVING; new calls UNAVAILABLE; running streams go on
  void Stop();        // cancels what is left (waits for compiles in progress: their deadline)

  class Service;

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  Engine& engine_;
  int health_listener_ = -1;
  GrpcConfig config_;
};

}  // namespace llm::server
