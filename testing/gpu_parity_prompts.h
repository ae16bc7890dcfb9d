// Prompts for GPU-vs-CPU greedy parity on SmolLM2 (runner and engine GPU
// tests). Of 8 candidates, the 4 whose greedy continuations have the
// widest top-2 logit margins (>= 0.05 at every one of 32 steps on the CPU);
// none of the 8 changed a greedy token under a CPU emulation of the GPU's
// bf16 roundings, so a differing token means a bug, not rounding.
#ifndef SHARDLM_TESTING_GPU_PARITY_PROMPTS_H_
#define SHARDLM_TESTING_GPU_PARITY_PROMPTS_H_

namespace shardlm {

inline constexpr const char* kGpuParityPrompts[] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the boiling point of water at sea level?"
    "<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n",
};

}  // namespace shardlm

#endif  // SHARDLM_TESTING_GPU_PARITY_PROMPTS_H_
