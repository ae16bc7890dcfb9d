// In-process communicators for tests: a group of `size` communicators that
// exchange data through shared memory, to be used from `size` threads (one
// each), with the same semantics and timeouts as the real ones.
#ifndef SHARDLM_COLLECTIVES_FAKE_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_FAKE_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace shardlm {

// Returns communicators for ranks 0..size-1 of one group named `name`.
std::vector<std::unique_ptr<Communicator>> MakeFakeGroup(
    int size, std::string name, CommOptions options = {});

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_FAKE_COMMUNICATOR_H_
