// The event-driven HTTP/1.1 transport under the HTTP front end (Boost.Beast and Asio from
// Debian): a listener that accepts on a few I/O threads and one Connection per client socket.
// No thread belongs to a connection or a stream: every socket operation is asynchronous and a
// connection's handlers run one at a time on its strand, so 10,000 open streams cost memory,
// not threads, and /health is answered however many clients hold sockets open.
//
// A connection reads one request at a time (keep-alive, HTTP/1.0 and /1.1), hands it to the
// RequestHandler and writes its response: whole (Reply) or as a body written piece by piece
// (BeginBody / Write / EndBody: chunked on HTTP/1.1). While a response is being made it keeps
// a read posted on the socket, so a client that closes is seen at once (OnGone), with nothing
// written to it. Deadlines (ConnectionLimits): the request head, the body, an idle keep-alive
// connection, and every write (a client that stops reading is cut off and its request ends).
// Head and body size limits answer 431 and 413. Past max_connections a new client gets 503
// and is closed.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace llm::server {

namespace asio = boost::asio;
namespace beast_http = boost::beast::http;
using HttpRequest = beast_http::request<beast_http::string_body>;
using HttpResponse = beast_http::response<beast_http::string_body>;
using Strand = asio::strand<asio::io_context::executor_type>;

struct ConnectionLimits {
  size_t max_header_bytes = 16 << 10;  // the request line and headers (431 beyond)
  size_t max_body_bytes = 4 << 20;     // 413 beyond
  double header_timeout_seconds = 10;  // from a connection's (or request's) first byte
  double body_timeout_seconds = 60;    // from the end of the head to the end of the body
  double idle_timeout_seconds = 60;    // a keep-alive connection between requests
  double write_timeout_seconds = 30;   // each write: a client that stops reading is cut off
  int64_t max_connections = 10000;     // open client sockets; beyond: 503 and close
};

class Connection;

// Gets every complete request, on its connection's strand. It must answer each one (Reply,
// or BeginBody ... EndBody / Abort) from that strand; work that takes time is done elsewhere
// and posted back (Connection::executor()).
class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  virtual void Handle(const std::shared_ptr<Connection>& conn, HttpRequest request) = 0;
  // The response to a request the connection refuses itself (431, 413, 503 past the
  // connection limit): the front end's error shape.
  virtual HttpResponse Refusal(int status, const std::string& message, const std::string& code) = 0;
  // Every response's status as it is sent (metrics).
  virtual void Responded(int /*status*/) {}
};

class HttpListener;

// One client socket. Everything here runs on executor() (a strand): call it from there.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpListener& listener, asio::ip::tcp::socket socket, Strand strand);
  ~Connection();

  const Strand& executor() const { return strand_; }
  // The current request's response in one piece; then the next request (keep-alive) or close.
  void Reply(HttpResponse response);
  // A body that is written as it is made: `head`'s status and headers go out now (its body is
  // ignored), chunked on HTTP/1.1 (HTTP/1.0: raw, and the connection closes after it).
  void BeginBody(HttpResponse head);
  void Write(std::string data);  // queued behind what is being written (bytes coalesce)
  void EndBody();                // the last chunk; then keep-alive or close
  void Abort();                  // closes without ending the body (a failed transfer)
  // Runs once if the client goes away (closed, reset, a write failed or missed its deadline,
  // the server stops) before the current response has been written out; null clears it.
  void OnGone(std::function<void()> gone) { on_gone_ = std::move(gone); }
  bool gone() const { return closed_; }
  void Close();  // now, from the strand (the server's Stop)

  void Start();                              // begins reading (the listener calls it)
  void StartRefused(HttpResponse response);  // answers `response` at once, then closes

 private:
  void WaitForBytes();  // one read into buffer_: the next request's first bytes, or EOF
  void OnBytes(boost::system::error_code ec, size_t n);
  void ReadHead();
  void OnHead(boost::system::error_code ec);
  void ReadBody();
  void OnBody(boost::system::error_code ec);
  void Dispatch();
  void Refuse(int status, const std::string& message, const std::string& code);
  void RefuseLargeBody();  // 413: declared (Content-Length) or read
  void ArmReadDeadline(double seconds);
  void Send(std::string bytes);
  void DoWrite();
  void OnWritten(boost::system::error_code ec);
  void ResponseWritten();  // the whole response is out
  void Gone();             // the client is gone (or must be dropped)

  HttpListener& listener_;
  asio::ip::tcp::socket socket_;
  Strand strand_;
  asio::steady_timer read_timer_, write_timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<beast_http::request_parser<beast_http::string_body>> parser_;
  bool reading_ = false;         // a WaitForBytes read is posted
  bool in_response_ = false;     // a request was dispatched and its response is not all written
  bool response_ended_ = false;  // Reply/EndBody called: close or keep alive once written
  bool keep_alive_ = false;
  bool chunked_ = false;  // the body in progress is chunked
  bool fresh_ = true;     // no request read yet on this connection
  bool reparse_ = false;
  bool lingering_ = false;  // our side is shut: reading and dropping until EOF or deadline  // the
                            // read was cancelled to parse bytes already buffered
  bool closed_ = false;
  bool head_only_ = false;  // a HEAD request: the response's head without its body
  unsigned version_ = 11;
  std::deque<std::string> queued_;    // waiting for the write in flight
  std::vector<std::string> writing_;  // the write in flight
  std::function<void()> on_gone_;
};

class HttpListener {
 public:
  HttpListener(RequestHandler& handler, ConnectionLimits limits, int num_threads);
  ~HttpListener();
  int Bind(const std::string& host, int port);  // returns the port; throws llm::Error
  void Start();                                 // the I/O threads begin accepting and serving
  void Wait();                                  // blocks until Stop() has finished
  // Closes the listening socket and every connection (their responses see OnGone), then
  // stops and joins the I/O threads. `before_join` runs after the connections are closed and
  // before the threads stop (the front end detaches its engine wakers there).
  void Stop(const std::function<void()>& before_join = nullptr);

  asio::io_context& context() { return ioc_; }
  int64_t num_connections() const { return num_connections_.load(); }
  const ConnectionLimits& limits() const { return limits_; }
  RequestHandler& handler() { return handler_; }

 private:
  friend class Connection;
  void Accept();
  void OnAccept(boost::system::error_code ec, asio::ip::tcp::socket socket, const Strand& strand);
  void Register(const std::shared_ptr<Connection>& conn);
  void Unregister(Connection* conn);

  RequestHandler& handler_;
  ConnectionLimits limits_;
  int num_threads_;
  std::mutex mu_;  // guards connections_, stopped_, threads_
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections_;
  std::atomic<int64_t> num_connections_{0};
  bool stopped_ = false;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  // Destroyed first (declared last): the connections its handlers hold unregister above.
  asio::io_context ioc_;
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::vector<std::thread> threads_;
};

// Seconds as the timers' duration.
std::chrono::steady_clock::duration SecondsToDuration(double seconds);

}  // namespace llm::server
