// HttpServer: the small HTTP/1.1 server behind every Tessera endpoint that Prometheus and the
// kubelet read: /metrics, /healthz, /readyz and the controller's scrape-target discovery. GET only,
// one request per connection (Connection: close), requests served one at a time on the server's
// own thread, each bounded by a 5 s socket timeout so a stalled client cannot hold it. Handlers run
// on that thread and must be thread-safe against the rest of the program.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

struct HttpResponse {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse()>;

  // Listens on "HOST:PORT" (IPv4; HOST empty or 0.0.0.0 for every interface, PORT 0 for a free
  // one). Throws ConfigError naming `field` when the address is malformed or cannot be bound.
  HttpServer(const std::string& address, const std::string& field);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves GET `path` (exact match, query string ignored) with `handler`; may be called at any time.
  void handle(const std::string& path, Handler handler);
  int port() const { return port_; }

 private:
  void serve();
  void answer(int connection);

  int fd_ = -1, port_ = 0;
  std::mutex mu_;
  std::map<std::string, Handler> handlers_;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace tessera
