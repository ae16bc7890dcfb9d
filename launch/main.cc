// shardlm: one binary, subcommands (DESIGN.md section 1).
#include <cstdio>
#include <cstring>

#include "kernels/blas_cpu.h"
#include "launch/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: shardlm <command> [flags]\n"
    "\n"
    "commands:\n"
    "  bench        load-test a running server (throughput, latency)\n"
    "  coordinator  lead a cluster of `shardlm worker` processes (no mpirun)\n"
    "  generate     stream a completion for a prompt (local model or "
    "--server)\n"
    "  inspect      print a model file's config, tensors and tokenizer\n"
    "  launch       run a TP x PP cluster under mpirun (rank 0 coordinates)\n"
    "  router       one endpoint routing requests over several replicas\n"
    "  serve        serve the gRPC API from a model in this process\n"
    "  simulate     plan capacity: the real scheduler on simulated GPUs\n"
    "  worker       one worker rank joining a `shardlm coordinator`\n"
    "\n"
    "Run 'shardlm <command> --help' for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "bench") == 0) {
    return shardlm::BenchCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "coordinator") == 0) {
    return shardlm::CoordinatorCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "worker") == 0) {
    return shardlm::WorkerCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "generate") == 0) {
    return shardlm::GenerateCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "inspect") == 0) {
    return shardlm::InspectCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "launch") == 0) {
    return shardlm::LaunchCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "serve") == 0) {
    return shardlm::ServeCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "router") == 0) {
    return shardlm::RouterCommand(argc, argv);
  }
  if (std::strcmp(argv[1], "simulate") == 0) {
    return shardlm::SimulateCommand(argc, argv);
  }
  std::fprintf(stderr, "shardlm: unknown command '%s'\n\n%s", argv[1], kUsage);
  return 2;
}
