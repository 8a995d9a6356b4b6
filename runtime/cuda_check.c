/* cuda_check.c: messages for failed CUDA runtime calls (see cuda_check.h). */
#include "cuda_check.h"

#include <stdio.h>
#include <stdlib.h>

const char *cp_cuda_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice:
        return "no NVIDIA GPU is visible to this process: check `nvidia-smi` and CUDA_VISIBLE_DEVICES; without a GPU, "
               "`cpgen plan` and `cpgen build --arch sm_90a` still work";
    case cudaErrorInsufficientDriver:
        return "the NVIDIA driver is older than the CUDA 13 runtime built into cpgen, or absent: install a driver that "
               "supports CUDA 13 (580 or newer; `nvidia-smi` shows the CUDA version it supports)";
    case cudaErrorSystemDriverMismatch:
        return "the driver's kernel module and user library versions differ (often after a driver upgrade): reboot, "
               "or reload the nvidia kernel module";
    case cudaErrorCompatNotSupportedOnDevice:
        return "this GPU cannot use the CUDA forward-compatibility package in use: install a driver supporting CUDA 13";
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
        return "the CUDA driver library (libcuda.so) failed to initialise or is a stub: check the driver installation "
               "with `nvidia-smi`";
    case cudaErrorDevicesUnavailable:
        return "the GPU is busy in exclusive-process mode or unavailable: check `nvidia-smi` for other processes";
    case cudaErrorMemoryAllocation:
        return "out of GPU memory: `cpgen plan` shows the memory the plan needs; lower seq_len, raise offload, or free "
               "the GPU of other processes";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidPtx:
        return "the kernel binary does not match this GPU: build for the device's architecture (cpgen takes it from "
               "the GPU; check --arch) and clear the kernel cache if it was copied from another machine";
    case cudaErrorSymbolNotFound:
        return "no kernel of that name in the module: the template's entry names and the caller's role disagree";
    case cudaErrorLaunchOutOfResources:
        return "the launch asks for more registers, threads or shared memory than the GPU gives one block: a "
               "template's block size and __launch_bounds__ disagree";
    case cudaErrorInvalidConfiguration:
        return "bad launch geometry (zero or too large a grid or block, or too much shared memory): check cp_k_dims "
               "and the shared-memory attribute";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorHardwareStackError:
        return "a kernel faulted (a bad pointer, size or alignment, or a trap); the CUDA context is now unusable: rerun "
               "with CUDA_LAUNCH_BLOCKING=1 to find the kernel, or under compute-sanitizer";
    case cudaErrorAssert:
        return "a device-side assertion failed; the CUDA context is now unusable";
    case cudaErrorLaunchTimeout:
        return "a kernel ran past the display watchdog's limit: use a GPU without a display attached";
    case cudaErrorECCUncorrectable:
        return "the GPU reported an uncorrectable memory error: check `nvidia-smi -q -d ECC`, the GPU may need a reset";
    default:
        return "";
    }
}

int cp_cuda_errmsg(cudaError_t e, const char *what, char *buf, int n) {
    const char *hint = cp_cuda_hint(e);
    snprintf(buf, (size_t)n, "%s: %s (%s)%s%s", what, cudaGetErrorName(e), cudaGetErrorString(e), *hint ? "; " : "",
             hint);
    return -1;
}

void cp_cuda_fail(cudaError_t e, const char *call, const char *file, int line) {
    char msg[1024];
    cp_cuda_errmsg(e, call, msg, sizeof msg);
    fprintf(stderr, "cpgen: %s:%d: %s\n", file, line, msg);
    exit(1);
}
