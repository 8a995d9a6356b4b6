/* module.h: GPUs and compiled kernel modules: how many GPUs there are (or why none), the architecture to compile
 * for, loading a CUBIN from memory as a CUDA library, finding its kernels by name, and launching them. */
#ifndef CP_MODULE_H
#define CP_MODULE_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "emit.h"
#include "kernels.h"

/* Number of usable GPUs. 0 with the reason in why (no driver, old driver, no device, ...) instead of failing. */
int cp_gpu_count(char *why, int n);

/* The NVRTC target for device dev: "sm_90a" for compute capability 9.0 (wgmma and TMA need the arch-specific
 * target), "sm_80" for 8.0, "sm_89" for 8.9, ... Returns 0, or -1 with the CUDA error in arch. */
int cp_device_arch(int dev, char *arch, size_t n);

/* The NVIDIA driver's version, the machine's key into the kernel tuning cache (gen/ktune.h): its release from NVML
 * ("580.82.07"), else the CUDA version it supports ("cuda 13.0"). Returns 0, or -1 with out "" when there is no
 * driver. Needs no GPU context. */
int cp_driver_version(char *out, size_t n);

typedef struct {
    char name[CP_KNAME_MAX];
    cudaLibrary_t lib;
} cp_module;

/* Load a CUBIN (or fatbin) image from memory on the current device. The image may be freed afterwards.
 * Returns 0, or -1 with a message naming the module in err. */
int cp_module_load(cp_module *m, const char *name, const void *image, size_t len, char *err, int errlen);
/* The kernel `entry` (full name, e.g. "rmsnorm_fwd_h4096_e1em05"). Returns 0, or -1 with a message. */
int cp_module_kernel(const cp_module *m, const char *entry, cudaKernel_t *k, char *err, int errlen);
/* The kernel for a role of a module emitted from a template: <family>_<role><suffix> (see emit.h). */
int cp_module_role(const cp_module *m, const char *family, const char *role, cudaKernel_t *k, char *err, int errlen);
void cp_module_unload(cp_module *m);

/* Allow up to `bytes` of dynamic shared memory per block for k on the current device (needed above 48 KiB). */
int cp_kernel_set_max_smem(cudaKernel_t k, unsigned bytes, char *err, int errlen);

/* Launch k with geometry d and kernel arguments args (pointers to each argument, in order) on stream s. Returns
 * the launch's error (cudaSuccess if it was queued); a zero grid launches nothing and returns cudaSuccess. */
cudaError_t cp_launch(cudaKernel_t k, const cp_kdims *d, void **args, cudaStream_t s);

#endif
