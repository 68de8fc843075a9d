#include "server/http/http_connection.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <sstream>
#include <utility>

#include "engine/error.h"

namespace llm::server {
namespace {

using boost::system::error_code;
using tcp = asio::ip::tcp;

// Bytes a client may send ahead while its response is being made (pipelined requests);
// beyond, the socket is no longer read until the response is out.
constexpr size_t kMaxReadAhead = 64 << 10;
constexpr size_t kReadChunk = 4096;
constexpr double kLingerSeconds = 2;

std::string Serialize(const HttpResponse& res) {
  std::ostringstream os;
  os << res;
  return std::move(os).str();
}

std::string HeadOnly(const HttpResponse& res) {
  std::ostringstream os;
  os << res.base();
  return std::move(os).str();
}

}  // namespace

std::chrono::steady_clock::duration SecondsToDuration(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(seconds, 1e9)));
}

Connection::Connection(HttpListener& listener, tcp::socket socket, Strand strand)
    : listener_(listener),
      socket_(std::move(socket)),
      strand_(std::move(strand)),
      read_timer_(strand_),
      write_timer_(strand_) {}

Connection::~Connection() { listener_.Unregister(this); }

void Connection::Start() {
  error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // SSE events go out as they come
  ArmReadDeadline(listener_.limits().header_timeout_seconds);
  WaitForBytes();
}

void Connection::StartRefused(HttpResponse response) {
  in_response_ = true;
  keep_alive_ = false;
  fresh_ = false;
  Reply(std::move(response));
}

void Connection::ArmReadDeadline(double seconds) {
  read_timer_.expires_after(SecondsToDuration(seconds));
  read_timer_.async_wait([self = shared_from_this()](error_code ec) {
    // A timer re-armed after this wait completed leaves a stale success here: check.
    if (ec || self->closed_ || self->read_timer_.expiry() > std::chrono::steady_clock::now()) {
      return;
    }
    if (!self->in_response_) self->Close();  // slow head or body, or idle keep-alive
  });
}

void Connection::WaitForBytes() {
  reading_ = true;
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](error_code ec, size_t n) {
                            self->reading_ = false;
                            self->OnBytes(ec, n);
                          });
}

void Connection::OnBytes(error_code ec, size_t n) {
  if (closed_) return;
  if (ec == asio::error::operation_aborted && std::exchange(reparse_, false)) return ReadHead();
  if (ec) return Gone();  // EOF or reset: while a response is made, the client left
  buffer_.commit(n);
  if (lingering_) {
    buffer_.consume(buffer_.size());  // what a refused client still sends: dropped
    return WaitForBytes();
  }
  if (in_response_) {
    if (buffer_.size() < kMaxReadAhead) WaitForBytes();
    return;
  }
  ReadHead();
}

void Connection::ReadHead() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(listener_.limits().max_header_bytes));
  parser_->body_limit(listener_.limits().max_body_bytes);
  // A head's deadline runs from its first byte (a new connection's from the accept).
  if (!fresh_) ArmReadDeadline(listener_.limits().header_timeout_seconds);
  fresh_ = false;
  beast_http::async_read_header(
      socket_, buffer_, *parser_,
      asio::bind_executor(
          strand_, [self = shared_from_this()](error_code ec, size_t) { self->OnHead(ec); }));
}

void Connection::OnHead(error_code ec) {
  if (closed_) return;
  if (ec == beast_http::error::header_limit) {
    return Refuse(431,
                  "Request header fields larger than " +
                      std::to_string(listener_.limits().max_header_bytes) + " bytes",
                  "header_too_large");
  }
  if (ec == beast_http::error::body_limit) {
    return RefuseLargeBody();
  }
  if (ec == beast_http::error::end_of_stream || ec == asio::error::eof ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
    return Close();
  }
  if (ec) return Refuse(400, "Malformed HTTP request: " + ec.message(), "bad_request");
  const HttpRequest& head = parser_->get();
  version_ = head.version();
  const auto expect = head[beast_http::field::expect];
  if (!expect.empty() && boost::beast::iequals(expect, "100-continue") && !parser_->is_done()) {
    // curl sends large bodies only after this (the body limit was checked by the parser).
    Send("HTTP/1.1 100 Continue\r\n\r\n");
  }
  ReadBody();
}

void Connection::ReadBody() {
  if (parser_->is_done()) return Dispatch();
  ArmReadDeadline(listener_.limits().body_timeout_seconds);
  beast_http::async_read(
      socket_, buffer_, *parser_,
      asio::bind_executor(
          strand_, [self = shared_from_this()](error_code ec, size_t) { self->OnBody(ec); }));
}

void Connection::OnBody(error_code ec) {
  if (closed_) return;
  if (ec == beast_http::error::body_limit) {
    return RefuseLargeBody();
  }
  if (ec) return Close();  // the client left mid-body, or a malformed body
  Dispatch();
}

void Connection::Dispatch() {
  read_timer_.cancel();
  HttpRequest request = parser_->release();
  parser_.reset();
  keep_alive_ = request.keep_alive();
  version_ = request.version();
  head_only_ = request.method() == beast_http::verb::head;
  in_response_ = true;
  response_ended_ = false;
  // Watch the socket while the response is made: a close is seen at once.
  if (!reading_ && buffer_.size() < kMaxReadAhead) WaitForBytes();
  listener_.handler().Handle(shared_from_this(), std::move(request));
}

void Connection::RefuseLargeBody() {
  Refuse(413,
         "Request body larger than " + std::to_string(listener_.limits().max_body_bytes) + " bytes",
         "payload_too_large");
}

void Connection::Refuse(int status, const std::string& message, const std::string& code) {
  in_response_ = true;
  keep_alive_ = false;  // the rest of the stream cannot be trusted
  Reply(listener_.handler().Refusal(status, message, code));
}

void Connection::Reply(HttpResponse response) {
  if (closed_ || response_ended_) return;
  listener_.handler().Responded(response.result_int());
  response.version(version_);
  response.keep_alive(keep_alive_);
  response.prepare_payload();
  response_ended_ = true;
  Send(head_only_ ? HeadOnly(response) : Serialize(response));
}

void Connection::BeginBody(HttpResponse head) {
  if (closed_ || response_ended_) return;
  listener_.handler().Responded(head.result_int());
  head.version(version_);
  head.body().clear();
  if (version_ >= 11) {
    head.keep_alive(keep_alive_);
    head.chunked(true);
    chunked_ = true;
  } else {
    keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
    head.keep_alive(false);
    chunked_ = false;
  }
  Send(HeadOnly(head));
}

void Connection::Write(std::string data) {
  if (closed_ || response_ended_ || data.empty()) return;
  if (!chunked_) return Send(std::move(data));
  char size[24];
  const int len = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  data.insert(0, size, static_cast<size_t>(len));
  data += "\r\n";
  Send(std::move(data));
}

void Connection::EndBody() {
  if (closed_ || response_ended_) return;
  response_ended_ = true;
  Send(chunked_ ? "0\r\n\r\n" : "");
}

void Connection::Abort() {
  on_gone_ = nullptr;  // the handler knows
  Close();
}

void Connection::Send(std::string bytes) {
  if (!bytes.empty()) queued_.push_back(std::move(bytes));
  if (writing_.empty()) DoWrite();
}

void Connection::DoWrite() {
  if (queued_.empty()) {
    if (response_ended_ && in_response_) ResponseWritten();
    return;
  }
  std::vector<asio::const_buffer> buffers;
  while (!queued_.empty()) {
    writing_.push_back(std::move(queued_.front()));
    queued_.pop_front();
  }
  for (const std::string& b : writing_) buffers.emplace_back(b.data(), b.size());
  write_timer_.expires_after(SecondsToDuration(listener_.limits().write_timeout_seconds));
  write_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->closed_ || self->writing_.empty() ||
        self->write_timer_.expiry() > std::chrono::steady_clock::now()) {
      return;
    }
    self->Gone();  // the client stopped reading
  });
  asio::async_write(
      socket_, buffers,
      asio::bind_executor(
          strand_, [self = shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); }));
}

void Connection::OnWritten(error_code ec) {
  writing_.clear();
  write_timer_.cancel();
  if (closed_) return;
  if (ec) return Gone();
  DoWrite();
}

void Connection::ResponseWritten() {
  in_response_ = false;
  on_gone_ = nullptr;
  chunked_ = false;
  if (!keep_alive_) {
    // Closing at once would reset a client still sending (a refused body, a pipelined
    // request), and a reset can discard the response before it reads it. So end our side,
    // then read and drop what comes for up to kLingerSeconds (as nginx's lingering close).
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    lingering_ = true;
    buffer_.consume(buffer_.size());
    ArmReadDeadline(kLingerSeconds);
    if (!reading_) WaitForBytes();
    return;
  }
  ArmReadDeadline(listener_.limits().idle_timeout_seconds);
  if (buffer_.size() == 0) {
    if (!reading_) WaitForBytes();  // else the posted read brings the next request
  } else if (reading_) {
    reparse_ = true;  // a pipelined request is buffered: stop the read, then parse it
    error_code ignored;
    socket_.cancel(ignored);
  } else {
    ReadHead();
  }
}

void Connection::Gone() {
  if (closed_) return;
  Close();
}

void Connection::Close() {
  if (closed_) return;
  closed_ = true;
  error_code ignored;
  read_timer_.cancel();
  write_timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  listener_.Unregister(this);
  if (auto gone = std::move(on_gone_)) {
    on_gone_ = nullptr;
    if (in_response_) gone();
  }
}

HttpListener::HttpListener(RequestHandler& handler, ConnectionLimits limits, int num_threads)
    : handler_(handler),
      limits_(limits),
      num_threads_(std::max(1, num_threads)),
      ioc_(num_threads_),
      acceptor_(asio::make_strand(ioc_)),
      accept_retry_(acceptor_.get_executor()) {}

HttpListener::~HttpListener() { Stop(); }

int HttpListener::Bind(const std::string& host, int port) {
  error_code ec;
  const asio::ip::address address =
      asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  const std::string where = host + ":" + std::to_string(port);
  if (ec) throw Error("cannot listen on " + where + ": " + ec.message());
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + where + ": " + ec.message());
  return acceptor_.local_endpoint().port();
}

void HttpListener::Start() {
  std::lock_guard<std::mutex> lock(mu_);  // Stop() from another thread waits for this
  if (stopped_ || !threads_.empty()) return;
  asio::post(acceptor_.get_executor(), [this] { Accept(); });
  for (int i = 0; i < num_threads_; ++i) {
    threads_.emplace_back([this] {
      // Handlers do not throw; one that did would end this thread, not the process.
      for (;;) {
        try {
          ioc_.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[llm] http: %s\n", e.what());
        }
      }
    });
  }
}

void HttpListener::Accept() {
  Strand strand = asio::make_strand(ioc_);  // the new connection's
  acceptor_.async_accept(strand, [this, strand](error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket), strand);
  });
}

void HttpListener::OnAccept(error_code ec, tcp::socket socket, const Strand& strand) {
  if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
  if (ec) {
    // Out of file descriptors (EMFILE) or a connection reset before it was accepted: wait a
    // moment (a busy retry would spin) and go on.
    accept_retry_.expires_after(
        std::chrono::milliseconds(ec == asio::error::no_descriptors ? 50 : 1));
    accept_retry_.async_wait([this](error_code wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  auto conn = std::make_shared<Connection>(*this, std::move(socket), strand);
  if (num_connections_.load() >= limits_.max_connections) {
    // Past the limit: a 503 and close (the connection is not counted or kept).
    HttpResponse res =
        handler_.Refusal(503, "Too many open connections; retry later.", "too_many_connections");
    res.set(beast_http::field::retry_after, "1");
    asio::post(conn->executor(),
               [conn, res = std::move(res)]() mutable { conn->StartRefused(std::move(res)); });
  } else {
    Register(conn);
    asio::post(conn->executor(), [conn] { conn->Start(); });
  }
  Accept();
}

void HttpListener::Register(const std::shared_ptr<Connection>& conn) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.emplace(conn.get(), conn);
  num_connections_ = std::ssize(connections_);
}

void HttpListener::Unregister(Connection* conn) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(conn);
  num_connections_ = std::ssize(connections_);
}

void HttpListener::Wait() {
  std::unique_lock<std::mutex> lock(done_mu_);
  done_cv_.wait(lock, [this] { return done_; });
}

void HttpListener::Stop(const std::function<void()>& before_join) {
  std::vector<std::shared_ptr<Connection>> open;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (auto& [ptr, weak] : connections_) {
      if (auto conn = weak.lock()) open.push_back(std::move(conn));
    }
    threads = std::move(threads_);
  }
  asio::post(acceptor_.get_executor(), [this] {
    error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
  });
  for (auto& conn : open) asio::post(conn->executor(), [conn] { conn->Close(); });
  open.clear();
  if (!threads.empty()) {
    // Give the strands a moment to close their connections (their responses end).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (num_connections() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  if (before_join) before_join();
  ioc_.stop();
  for (std::thread& t : threads) t.join();
  error_code ignored;
  acceptor_.close(ignored);  // the port is free when Stop returns (no thread runs now)
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_ = true;
  }
  done_cv_.notify_all();
}

}  // namespace llm::server
