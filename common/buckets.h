// Histogram buckets shared by the workers' and the controller's metrics.
#pragma once

#include <prometheus/histogram.h>

namespace tessera {

// first, 2 first, 4 first, ... while below `limit` (seconds).
inline prometheus::Histogram::BucketBoundaries doubling_buckets(double first, double limit) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = first; v < limit; v *= 2) b.push_back(v);
  return b;
}

}  // namespace tessera
