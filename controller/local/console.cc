#include "controller/local/console.h"

#include <algorithm>
#include <ctime>

#include "common/error.h"
#include "common/log.h"

namespace tessera::local {
namespace {

std::string clock_time() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", std::localtime(&t));
  return buf;
}

std::string duration(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? detail::concat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s") : detail::concat(s, "s");
}

}  // namespace

void JobConsole::say(const std::string& line) const {
  std::fprintf(out_, "[%s] %s\n", clock_time().c_str(), line.c_str());
  std::fflush(out_);
}

void JobConsole::placed(const nlohmann::json& status, const std::string& where, const std::string& rendezvous,
                        int threads, const std::string& logs) {
  const auto& spec = job_.spec;
  if (announced_) {
    say(detail::concat(job_.name, ": placed again: ", where));
    return;
  }
  const auto& c = spec.communication;
  std::string strategy = c.strategy;
  if (c.strategy == "hybrid")
    strategy = detail::concat("hybrid: ", c.sparse, " until epoch ", c.switch_at_epoch, ", then ", c.dense);
  say(detail::concat(
      "job ", job_.name, ": ", detail::count(spec.workers(), "worker"), " (", detail::count(spec.replicas, "replica"),
      " x ", detail::count(spec.ranks_per_replica, "rank"), ") on ", detail::count(spec.local.nodes, "virtual node"),
      " of ", detail::count(spec.local.gpus_per_node, "GPU slot"), "; spatial ", spec.parallelism.spatial_size(),
      " x data ", spec.data_replicas(), "; ", strategy, "; ", detail::count(threads, "thread"), " per worker"));
  for (const auto& p : status.value("placement", nlohmann::json::array()))
    say(detail::concat("  replica ", p["replica"].get<int>(), " on ", p["node"].get<std::string>(), ": ranks ",
                       p["ranks"].dump()));
  say(detail::concat("rendezvous on ", rendezvous, "; each pod runs tessera-worker --slots ", spec.ranks_per_replica,
                     "; pod logs in ", logs));
  announced_ = true;
}

void JobConsole::progress(const reconcile::Progress& p, const nlohmann::json& status) const {
  if (p.step < 0 || status.value("phase", "") != "Running") return;
  const auto& c = job_.spec.communication;
  const std::string phase = status.value("trainingPhase", "sparse");
  // hybrid: "sparse phase (hitopk)"; otherwise the one strategy.
  const std::string exchange = c.strategy == "hybrid"
                                   ? detail::concat(phase, " phase (", phase == "sparse" ? c.sparse : c.dense, ")")
                                   : c.strategy;
  say(detail::concat(job_.name, " Running  epoch ", p.epoch + 1, "/", job_.spec.training.epochs, "  step ", p.step,
                     "  ", fixed_digits(p.samples_per_second, 1), " samples/s  loss ", fixed_digits(p.loss, 4), "  ",
                     exchange, "  restarts ", status.value("restarts", 0)));
}

void JobConsole::report(const LocalResult& r) const {
  if (r.phase != "Succeeded") {
    say(detail::concat(job_.name, " ", r.phase, r.reason.empty() ? "" : " (" + r.reason + ")", " after ",
                       duration(r.seconds), ": ", r.message));
    return;
  }
  std::string line = detail::concat(job_.name, " Succeeded in ", duration(r.seconds), ": ", r.steps, " steps, ",
                                    fixed_digits(r.samples_per_second, 2), " samples/s, restarts ", r.restarts);
  if (r.switch_step >= 0)
    line += detail::concat(", switched to ", job_.spec.communication.dense, " at step ", r.switch_step);
  say(line);
  for (const auto& h : r.restart_history)
    say(detail::concat("  restart: ", h.reason, " at step ", h.failed_at_step, "; resumed at step ",
                       h.resumed_at_step));
  if (!r.validated)
    say("  no validation: the job has no validation set (spec.dataset.validationPath or validationSplit gives one)");
  else if (job_.spec.model.name == "cosmoflow")
    say(detail::concat("  validation MSE ", fixed_digits(r.val_loss, 4), " vs predict-the-mean ",
                       fixed_digits(r.baseline_loss, 4), ": ",
                       fixed_digits(r.val_loss / std::max(r.baseline_loss, 1e-12), 3), "x; MAE ",
                       fixed_digits(r.val_metric, 4)));
  else
    say(detail::concat("  validation loss ", fixed_digits(r.val_loss, 4), ", accuracy ", fixed_digits(r.val_metric, 4),
                       r.val_top5 >= 0 ? ", top-5 " + fixed_digits(r.val_top5, 4) : "",
                       class_scores_text(r.baseline_metric, r.iou)));
}

}  // namespace tessera::local
