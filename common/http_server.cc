#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"

namespace tessera {
namespace {

const char* reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
    default: return code >= 500 ? "Internal Server Error" : "Bad Request";
  }
}

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

HttpServer::HttpServer(const std::string& address, const std::string& field) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) throw ConfigError(field, "'" + address + "' is not HOST:PORT");
  const std::string host = address.substr(0, colon), port_text = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end || port < 0 || port > 65535)
    throw ConfigError(field, "'" + port_text + "' in '" + address + "' is not a port number");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") a.sin_addr.s_addr = INADDR_ANY;
  else if (host == "localhost") a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  else if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    throw ConfigError(field, "'" + host + "' is not an IPv4 address");
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd_, 64) != 0) {
    const std::string why = std::strerror(errno);
    close(fd_);
    throw ConfigError(field, "cannot listen on " + address + ": " + why);
  }
  socklen_t len = sizeof(a);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { serve(); });
}

HttpServer::~HttpServer() {
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void HttpServer::handle(const std::string& path, Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[path] = std::move(handler);
}

void HttpServer::serve() {
  for (;;) {
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {  // out of descriptors: wait for some to be freed
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return;  // shut down
    }
    timeval tv{5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    answer(c);
    close(c);
  }
}

void HttpServer::answer(int c) {
  // The request line and headers; the body (there is none for GET) is not read.
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 65536) {
    const ssize_t n = recv(c, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  HttpResponse r;
  const auto sp1 = req.find(' '), sp2 = sp1 == std::string::npos ? sp1 : req.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) {
    r = {400, "text/plain; charset=utf-8", "malformed request\n"};
  } else {
    const std::string method = req.substr(0, sp1);
    std::string path = req.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    Handler h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = handlers_.find(path);
      if (it != handlers_.end()) h = it->second;
    }
    if (method != "GET" && method != "HEAD") r = {405, "text/plain; charset=utf-8", "only GET is served\n"};
    else if (!h) r = {404, "text/plain; charset=utf-8", "no such path: " + path + "\n"};
    else {
      try {
        r = h();
      } catch (const std::exception& e) {
        r = {500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"};
      }
    }
    if (method == "HEAD") r.body.clear();
  }
  write_all(c, "HTTP/1.1 " + std::to_string(r.code) + " " + reason(r.code) + "\r\nContent-Type: " + r.content_type +
                   "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body);
}

}  // namespace tessera
