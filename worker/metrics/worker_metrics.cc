#include "worker/metrics/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>
#include <sstream>

#include "common/buckets.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

using prometheus::Labels;

// 1 ms .. ~65 s.
prometheus::Histogram::BucketBoundaries seconds_buckets() { return doubling_buckets(0.001, 70); }

}  // namespace

struct WorkerMetrics::Families {
  prometheus::Family<prometheus::Counter>* comm;
  prometheus::Family<prometheus::Counter>* hits;
  prometheus::Family<prometheus::Counter>* misses;
  prometheus::Family<prometheus::Gauge>* held;
  Labels base;
  std::mutex mu;  // comm series are added on the first step of each strategy
};

WorkerMetrics::WorkerMetrics(const WorkerIdentity& who)
    : registry_(std::make_shared<prometheus::Registry>()), families_(std::make_unique<Families>()) {
  const Labels base = {
      {"job", who.job}, {"namespace", who.namespace_}, {"rank", std::to_string(who.rank)}, {"node", who.node}};
  families_->base = base;
  auto& r = *registry_;
  auto with = [&](Labels extra) {
    Labels l = base;
    l.insert(extra.begin(), extra.end());
    return l;
  };
  prometheus::BuildGauge()
      .Name("tessera_worker_info")
      .Help("1 for each rank; pod joins it to per-pod metrics (GPU utilisation)")
      .Register(r)
      .Add(with({{"pod", who.pod}}))
      .Set(1);
  samples_ =
      &prometheus::BuildCounter()
           .Name("tessera_samples_total")
           .Help("Samples trained: this rank's share of the global batch each step (the sum over ranks is the job's)")
           .Register(r)
           .Add(base);
  auto& stages = prometheus::BuildHistogram()
                     .Name("tessera_step_seconds")
                     .Help("Time of each stage of a training step on this rank")
                     .Register(r);
  const char* names[5] = {"data", "forward", "backward", "comm", "update"};
  for (int i = 0; i < 5; ++i) stage_[i] = &stages.Add(with({{"stage", names[i]}}), seconds_buckets());
  comm_total_ =
      &prometheus::BuildHistogram()
           .Name("tessera_comm_seconds")
           .Help(
               "All gradient communication of a step, overlapped with the backward pass or not (the part the step "
               "waited for is tessera_step_seconds{stage=\"comm\"})")
           .Register(r)
           .Add(base, seconds_buckets());
  checkpoint_ = &prometheus::BuildHistogram()
                     .Name("tessera_checkpoint_seconds")
                     .Help("Time to write this rank's checkpoint")
                     .Register(r)
                     .Add(base, seconds_buckets());
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(base);
  };
  density_ =
      gauge("tessera_exchange_density", "Fraction of gradient entries exchanged in the last step (1 when dense)");
  phase_ = gauge("tessera_training_phase", "Exchange phase of the last step: 0 sparse, 1 dense");
  loss_ = gauge("tessera_loss", "Training loss of the last step (mean over the global batch)");
  lr_ = gauge("tessera_learning_rate", "Learning rate of the last step");
  step_ = gauge("tessera_step", "Global steps completed");
  families_->comm = &prometheus::BuildCounter()
                         .Name("tessera_comm_bytes_total")
                         .Help(
                             "Gradient bytes this rank sent, by exchange strategy and link (intra: within the node, "
                             "inter: between nodes)")
                         .Register(r);
  const char* tiers[3] = {"memory", "ssd", "remote"};
  auto& hits = prometheus::BuildCounter()
                   .Name("tessera_cache_hits_total")
                   .Help("Sample blocks served by each tier of the data cache (remote: every fetch from the dataset)")
                   .Register(r);
  auto& misses = prometheus::BuildCounter()
                     .Name("tessera_cache_misses_total")
                     .Help("Sample blocks not found in a cache tier")
                     .Register(r);
  auto& read = prometheus::BuildCounter()
                   .Name("tessera_cache_read_bytes_total")
                   .Help("Bytes served by each tier of the data cache")
                   .Register(r);
  auto& held = prometheus::BuildGauge().Name("tessera_cache_bytes").Help("Bytes held in a cache tier").Register(r);
  for (int t = 0; t < 3; ++t) {
    hits_[t] = &hits.Add(with({{"tier", tiers[t]}}));
    read_bytes_[t] = &read.Add(with({{"tier", tiers[t]}}));
  }
  for (int t = 0; t < 2; ++t) {
    misses_[t] = &misses.Add(with({{"tier", tiers[t]}}));
    held_bytes_[t] = &held.Add(with({{"tier", tiers[t]}}));
  }
  families_->hits = &hits;
  families_->misses = &misses;
  families_->held = &held;
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::observe_step(const StepRecord& s, double samples) {
  samples_->Increment(samples);
  const double t[5] = {s.data_s, s.forward_s, s.backward_s, s.comm_s, s.update_s};
  for (int i = 0; i < 5; ++i) stage_[i]->Observe(t[i]);
  comm_total_->Observe(s.comm_total_s);
  density_->Set(s.density);
  phase_->Set(s.dense ? 1 : 0);
  loss_->Set(s.loss);
  lr_->Set(s.lr);
  step_->Set(static_cast<double>(s.step + 1));
  std::array<prometheus::Counter*, 2>* c;
  {
    std::lock_guard<std::mutex> lock(families_->mu);
    auto it = comm_.find(s.strategy);
    if (it == comm_.end()) {
      Labels intra = families_->base, inter = families_->base;
      intra["strategy"] = inter["strategy"] = s.strategy;
      intra["link"] = "intra";
      inter["link"] = "inter";
      it = comm_
               .emplace(s.strategy,
                        std::array<prometheus::Counter*, 2>{&families_->comm->Add(intra), &families_->comm->Add(inter)})
               .first;
    }
    c = &it->second;
  }
  (*c)[0]->Increment(static_cast<double>(s.bytes_intra));
  (*c)[1]->Increment(static_cast<double>(s.bytes_inter));
}

void WorkerMetrics::observe_checkpoint(double seconds) { checkpoint_->Observe(seconds); }

void WorkerMetrics::observe_cache(const TieredCache::Counters& c, int64_t memory_bytes, int64_t ssd_bytes) {
  // Counters only grow: the cache's totals become the series' increments.
  for (int t = 0; t < 3; ++t) {
    hits_[t]->Increment(std::max(0.0, static_cast<double>(c.hits[t]) - hits_[t]->Value()));
    read_bytes_[t]->Increment(std::max(0.0, static_cast<double>(c.bytes[t]) - read_bytes_[t]->Value()));
  }
  for (int t = 0; t < 2; ++t)
    misses_[t]->Increment(std::max(0.0, static_cast<double>(c.misses[t]) - misses_[t]->Value()));
  held_bytes_[0]->Set(static_cast<double>(memory_bytes));
  held_bytes_[1]->Set(static_cast<double>(ssd_bytes));
}

void WorkerMetrics::observe_device_cache(const SampleCache::Counters& c, int64_t bytes) {
  if (!device_hits_) {  // the series appear with the cache (jobs on the GPU with spec.cache.device)
    Labels l = families_->base;
    l["tier"] = "device";
    device_hits_ = &families_->hits->Add(l);
    device_misses_ = &families_->misses->Add(l);
    device_held_ = &families_->held->Add(l);
  }
  device_hits_->Increment(std::max(0.0, static_cast<double>(c.hits) - device_hits_->Value()));
  device_misses_->Increment(std::max(0.0, static_cast<double>(c.misses) - device_misses_->Value()));
  device_held_->Set(static_cast<double>(bytes));
}

void WorkerMetrics::observe(const StepRecord& step, double samples, const TieredCache* cache,
                            const SampleCache* device_cache) {
  observe_step(step, samples);
  if (step.checkpoint_s > 0) observe_checkpoint(step.checkpoint_s);
  if (cache) observe_cache(cache->counters(), cache->memory_bytes_used(), cache->ssd_bytes_used());
  if (device_cache) observe_device_cache(device_cache->counters(), device_cache->bytes_used());
}

std::string WorkerMetrics::text() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace tessera
