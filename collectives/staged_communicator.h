// A communicator that takes device tensors by staging them through host
// memory around another (host-only) communicator: ranks on threads of one
// process sharing a GPU, where NCCL refuses two ranks of one communicator
// on one device. Correct, not fast: every call copies synchronously, and
// the caller must have finished the work that wrote its tensors (the CUDA
// runner synchronizes its stream before each call). Host tensors pass
// straight through. Built only with CUDA.
#ifndef SHARDLM_COLLECTIVES_STAGED_COMMUNICATOR_H_
#define SHARDLM_COLLECTIVES_STAGED_COMMUNICATOR_H_

#include <memory>

#include "collectives/communicator.h"

namespace shardlm {

std::unique_ptr<Communicator> StageThroughHost(
    std::unique_ptr<Communicator> host);

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_STAGED_COMMUNICATOR_H_
