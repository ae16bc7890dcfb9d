// gpu_probe: what a GPU machine has, against what the kit was built with,
// in "key: value" lines (the first step of tests/gpu/session.sh): the
// driver's and the runtime's CUDA versions, NCCL's and cuBLAS's versions
// against the headers the kit was compiled with, and each device. A line
// starting "MISMATCH" says what cannot work; the exit status is then 1 (2
// with no usable device).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

namespace {

int mismatches = 0;

void Mismatch(const char* what) {
  std::printf("MISMATCH: %s\n", what);
  ++mismatches;
}

}  // namespace

int main() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("cuda driver: %d.%d\ncuda runtime: %d.%d (built with %d.%d)\n",
              driver / 1000, driver % 1000 / 10, runtime / 1000,
              runtime % 1000 / 10, CUDART_VERSION / 1000,
              CUDART_VERSION % 1000 / 10);
  if (driver == 0) Mismatch("no CUDA driver");
  if (driver != 0 && driver < runtime) {
    Mismatch("the driver is older than the CUDA runtime the kit loads");
  }

  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess) {
    Mismatch("ncclGetVersion failed");
  } else {
    std::printf("nccl: %d (built with %d)\n", nccl, NCCL_VERSION_CODE);
    if (nccl / 10000 != NCCL_VERSION_CODE / 10000) {
      Mismatch("NCCL's major version differs from the kit's headers");
    }
  }

  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  std::printf("cublas: %d.%d.%d (built with %d)\n", major, minor, patch,
              CUBLAS_VERSION);
  if (major != CUBLAS_VER_MAJOR) {
    Mismatch("cuBLAS's major version differs from the kit's headers");
  }

  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("devices: none (%s)\n",
                err == cudaSuccess ? "none visible" : cudaGetErrorString(err));
    return 2;
  }
  std::printf("devices: %d\n", devices);
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      Mismatch("cudaGetDeviceProperties failed");
      continue;
    }
    size_t free = 0, total = 0;
    cudaSetDevice(d);
    cudaMemGetInfo(&free, &total);
    std::printf(
        "device %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), %d-bit bus, "
        "unified addressing %d\n",
        d, p.name, p.major, p.minor, p.multiProcessorCount,
        static_cast<double>(total) / (1 << 30),
        static_cast<double>(free) / (1 << 30), p.memoryBusWidth,
        p.unifiedAddressing);
    if (p.major < 8) Mismatch("the kit's kernels need sm_80 or newer");
  }
  return mismatches == 0 ? 0 : 1;
}
