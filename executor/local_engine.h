// An engine whose ranks run in this process: the executor for the device
// the options name (CPU shards on threads, or GPUs), under an Engine. The
// engine itself (engine/) knows only the StepExecutor interface; this is
// where the device is chosen. Remote workers are cluster/'s executor.
#ifndef SHARDLM_EXECUTOR_LOCAL_ENGINE_H_
#define SHARDLM_EXECUTOR_LOCAL_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/step_executor.h"
#include "model/weight_source.h"

namespace shardlm {

// The executor for options.device: tp x pp (x cp) CPU shards on threads
// of this process, or the CUDA executor (one GPU per rank). Sets the
// process's CPU thread count (options.threads). What a device cannot do
// is refused by name (e.g. --cp or a KV dtype other than bf16 on CUDA).
absl::StatusOr<std::unique_ptr<StepExecutor>> MakeExecutor(
    const WeightSource& source, const EngineOptions& options);

// MakeExecutor, then Engine::Create over it.
absl::StatusOr<std::unique_ptr<Engine>> CreateLocalEngine(
    const WeightSource& source, const EngineOptions& options);

}  // namespace shardlm

#endif  // SHARDLM_EXECUTOR_LOCAL_ENGINE_H_
