// The workers' and the controller's Prometheus metrics, and the HTTP server that serves them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <string>

#include "common/error.h"
#include "common/http_server.h"
#include "controller/metrics/controller_metrics.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

using nlohmann::json;

// The value of the series `name{labels}` in a text exposition (labels exactly as serialised).
double value_of(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

std::string get(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(WorkerMetricsTest, StepsAccumulateWithTheRanksLabels) {
  WorkerMetrics m({"cosmo", "team-a", "node-1", "cosmo-0-1", 3});
  StepRecord r;
  r.step = 9;
  r.loss = 0.5;
  r.lr = 0.001;
  r.strategy = "hitopk";
  r.forward_s = 0.02;
  r.bytes_intra = 1000;
  r.bytes_inter = 10;
  r.dense = false;
  r.density = 0.01;
  m.observe_step(r, 2.0);
  r.step = 10;
  m.observe_step(r, 2.0);
  r.strategy = "torus";
  r.dense = true;
  r.density = 1.0;
  m.observe_step(r, 2.0);
  m.observe_checkpoint(0.25);
  TieredCache::Counters c;
  c.hits[0] = 7;
  c.misses[0] = 3;
  m.observe_cache(c, 4096, 8192);
  const std::string t = m.text();
  const std::string who = "job=\"cosmo\",namespace=\"team-a\",node=\"node-1\",rank=\"3\"";
  EXPECT_EQ(value_of(t, "tessera_samples_total{" + who + "}"), 6);
  EXPECT_EQ(value_of(t, "tessera_step{" + who + "}"), 11);
  EXPECT_EQ(value_of(t, "tessera_training_phase{" + who + "}"), 1);
  EXPECT_EQ(value_of(t, "tessera_exchange_density{" + who + "}"), 1);
  EXPECT_EQ(
      value_of(
          t,
          "tessera_comm_bytes_total{" +
              std::string(
                  "job=\"cosmo\",link=\"intra\",namespace=\"team-a\",node=\"node-1\",rank=\"3\",strategy=\"hitopk\"}")),
      2000);
  EXPECT_EQ(
      value_of(
          t,
          "tessera_comm_bytes_total{" +
              std::string(
                  "job=\"cosmo\",link=\"inter\",namespace=\"team-a\",node=\"node-1\",rank=\"3\",strategy=\"torus\"}")),
      10);
  EXPECT_EQ(value_of(t, "tessera_step_seconds_count{" + who + ",stage=\"forward\"}"), 3);
  EXPECT_EQ(value_of(t, "tessera_checkpoint_seconds_count{" + who + "}"), 1);
  EXPECT_EQ(value_of(t, "tessera_cache_hits_total{" + who + ",tier=\"memory\"}"), 7);
  EXPECT_EQ(value_of(t, "tessera_cache_bytes{" + who + ",tier=\"ssd\"}"), 8192);
  EXPECT_EQ(
      value_of(t,
               "tessera_worker_info{job=\"cosmo\",namespace=\"team-a\",node=\"node-1\",pod=\"cosmo-0-1\",rank=\"3\"}"),
      1);
  // The cache's totals are turned into increments: observing the same totals again adds nothing.
  m.observe_cache(c, 4096, 8192);
  EXPECT_EQ(value_of(m.text(), "tessera_cache_hits_total{" + who + ",tier=\"memory\"}"), 7);
}

TEST(HttpServerTest, ServesHandlersAndRefusesTheRest) {
  HttpServer s("127.0.0.1:0", "--metrics-addr");
  ASSERT_GT(s.port(), 0);
  s.handle("/metrics", [] { return HttpResponse{200, "text/plain", "x 1\n"}; });
  s.handle("/boom", []() -> HttpResponse { throw Error("broken"); });
  const std::string ok = get(s.port(), "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Length: 4\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 4), "x 1\n");
  EXPECT_EQ(get(s.port(), "GET /nothing HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(get(s.port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(get(s.port(), "GET /boom HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 500", 0), 0u);
  EXPECT_EQ(get(s.port(), "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
}

TEST(HttpServerTest, BadAddressesNameTheField) {
  try {
    HttpServer s("127.0.0.1", "--metrics-addr");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-addr"), std::string::npos);
  }
  EXPECT_THROW(HttpServer("nohost:80", "--health-addr"), ConfigError);
  EXPECT_THROW(HttpServer("127.0.0.1:99999", "--health-addr"), ConfigError);
  HttpServer taken("127.0.0.1:0", "a");
  EXPECT_THROW(HttpServer("127.0.0.1:" + std::to_string(taken.port()), "b"), ConfigError);
}

reconcile::Action patch(json object) {
  reconcile::Action a;
  a.kind = reconcile::Action::Kind::kPatchStatus;
  a.object = std::move(object);
  return a;
}

TEST(ControllerMetricsTest, CountsTheLifecycleFromTheStatusWrites) {
  ControllerMetrics m;
  json status = json::object();
  m.observe_action("ns", "a", status, patch({{"phase", "Pending"}}));
  status = {{"phase", "Pending"}};
  m.observe_action("ns", "a", status, patch({{"phase", "Running"}}));
  status = {{"phase", "Running"}};
  m.observe_action("ns", "a", status, patch({{"phase", "Restarting"}, {"restarts", 1}}));
  status = {{"phase", "Restarting"}, {"restarts", 1}};
  reconcile::Action pod;
  pod.kind = reconcile::Action::Kind::kCreate;
  pod.resource = reconcile::Resource::kPod;
  m.observe_action("ns", "a", status, pod);
  m.observe_action("ns", "a", status, pod);
  m.observe_action("ns", "a", status, patch({{"phase", "Succeeded"}}));
  m.observe_action("ns", "b", json(), patch({{"phase", "Failed"}}));
  m.observe_job("ns", "c", json::object());
  std::string t = m.text();
  EXPECT_EQ(value_of(t, "tessera_jobs_created_total{namespace=\"ns\"}"), 2);
  EXPECT_EQ(value_of(t, "tessera_jobs_restarted_total{namespace=\"ns\"}"), 1);
  EXPECT_EQ(value_of(t, "tessera_jobs_succeeded_total{namespace=\"ns\"}"), 1);
  EXPECT_EQ(value_of(t, "tessera_jobs_failed_total{namespace=\"ns\"}"), 1);
  EXPECT_EQ(value_of(t, "tessera_pods_created_total{namespace=\"ns\"}"), 2);
  EXPECT_EQ(value_of(t, "tessera_jobs{namespace=\"ns\",phase=\"Succeeded\"}"), 1);
  EXPECT_EQ(value_of(t, "tessera_jobs{namespace=\"ns\",phase=\"Pending\"}"), 1);
  EXPECT_EQ(value_of(t, "tessera_job_restarts{job=\"a\",namespace=\"ns\"}"), 1);
  // A status write that changes nothing counts nothing.
  m.observe_action("ns", "a", {{"phase", "Succeeded"}, {"restarts", 1}}, patch({{"phase", "Succeeded"}}));
  EXPECT_EQ(value_of(m.text(), "tessera_jobs_succeeded_total{namespace=\"ns\"}"), 1);
  // A deleted job's series go.
  m.forget_job("ns", "a");
  t = m.text();
  EXPECT_EQ(value_of(t, "tessera_job_restarts{job=\"a\",namespace=\"ns\"}"), -1);
  EXPECT_EQ(value_of(t, "tessera_jobs{namespace=\"ns\",phase=\"Succeeded\"}"), 0);
}

TEST(ControllerMetricsTest, ScrapeHookAndTargets) {
  ControllerMetrics m;
  m.on_scrape([](ControllerMetrics& cm) {
    cm.set_queue_depth(4);
    cm.set_rendezvous({3, 40});
  });
  std::string t = m.text();
  EXPECT_EQ(value_of(t, "tessera_workqueue_depth"), 4);
  EXPECT_EQ(value_of(t, "tessera_rendezvous_heartbeats_total"), 40);
  m.on_scrape(nullptr);
  EXPECT_EQ(value_of(m.text(), "tessera_rendezvous_heartbeats_total"), 40);
  const json sd = json::parse(http_sd_targets({{"team/cosmo", 2, "node-3", "10.0.0.5:9401"}}));
  ASSERT_EQ(sd.size(), 1u);
  EXPECT_EQ(sd[0]["targets"][0], "10.0.0.5:9401");
  EXPECT_EQ(sd[0]["labels"], (json{{"namespace", "team"}, {"job", "cosmo"}, {"rank", "2"}, {"node", "node-3"}}));
}

}  // namespace
}  // namespace tessera
