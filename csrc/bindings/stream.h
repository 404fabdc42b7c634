// A stream's configuration as Python holds it (fastload._C.StreamSampler): one replica's view of
// a step-based stream over one source or a mixture; the engine starts StreamPlans from it.
#pragma once
#include <memory>

#include "core/stream_plan.h"

namespace fastload {

struct StreamSampler {
  std::shared_ptr<const StreamConfig> config;
};

}  // namespace fastload
