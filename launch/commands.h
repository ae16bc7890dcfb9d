// Subcommands of the shardlm binary. Each returns the process exit code:
// 0 on success, 1 on a runtime failure, 2 on a usage error.
#ifndef SHARDLM_LAUNCH_COMMANDS_H_
#define SHARDLM_LAUNCH_COMMANDS_H_

namespace shardlm {

int BenchCommand(int argc, char** argv);
int CoordinatorCommand(int argc, char** argv);
int GenerateCommand(int argc, char** argv);
int InspectCommand(int argc, char** argv);
int LaunchCommand(int argc, char** argv);
int RouterCommand(int argc, char** argv);
int ServeCommand(int argc, char** argv);
int SimulateCommand(int argc, char** argv);
int WorkerCommand(int argc, char** argv);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_COMMANDS_H_
