/* module.c: GPU discovery and CUBIN modules through the CUDA runtime's library API (see module.h). */
#include "module.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"

int cp_gpu_count(char *why, int n) {
    /* cudart would call a missing driver "insufficient": say plainly that there is none */
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        snprintf(why, (size_t)n, "no NVIDIA driver: libcuda.so.1 not found");
        return 0;
    }
    dlclose(driver);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it, so that later calls report their own errors */
        cp_cuda_errmsg(e, "no usable GPU", why, n);
        return 0;
    }
    if (count == 0) snprintf(why, (size_t)n, "no usable GPU: the CUDA driver reports no devices");
    else if (n > 0) why[0] = 0;
    return count;
}

int cp_device_arch(int dev, char *arch, size_t n) {
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "compute capability of GPU %d", dev);
        return cp_cuda_errmsg(e, what, arch, (int)n);
    }
    snprintf(arch, n, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
    return 0;
}

int cp_driver_version(char *out, size_t n) {
    out[0] = 0;
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml) {
        int (*init)(void), (*version)(char *, unsigned), (*shutdown)(void);
        *(void **)&init = dlsym(nvml, "nvmlInit_v2");
        *(void **)&version = dlsym(nvml, "nvmlSystemGetDriverVersion");
        *(void **)&shutdown = dlsym(nvml, "nvmlShutdown");
        char v[96] = "";
        if (init && version && shutdown && init() == 0) {
            if (version(v, sizeof v) != 0) v[0] = 0;
            shutdown();
        }
        dlclose(nvml);
        if (v[0]) {
            snprintf(out, n, "%s", v);
            return 0;
        }
    }
    char why[256];
    int cuda = 0;
    if (cp_gpu_count(why, sizeof why) <= 0 || cudaDriverGetVersion(&cuda) != cudaSuccess || cuda <= 0) return -1;
    snprintf(out, n, "cuda %d.%d", cuda / 1000, cuda % 1000 / 10);
    return 0;
}

int cp_module_load(cp_module *m, const char *name, const void *image, size_t len, char *err, int errlen) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    (void)len; /* the image's own header gives its size */
    cudaError_t e = cudaLibraryLoadData(&m->lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
        char what[CP_KNAME_MAX + 32];
        snprintf(what, sizeof what, "loading module %s", name);
        m->lib = NULL;
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    return 0;
}

int cp_module_kernel(const cp_module *m, const char *entry, cudaKernel_t *k, char *err, int errlen) {
    cudaError_t e = cudaLibraryGetKernel(k, m->lib, entry);
    if (e != cudaSuccess) {
        char what[2 * CP_KNAME_MAX + 32];
        snprintf(what, sizeof what, "kernel %s in module %s", entry, m->name);
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    return 0;
}

int cp_module_role(const cp_module *m, const char *family, const char *role, cudaKernel_t *k, char *err, int errlen) {
    char entry[CP_KNAME_MAX];
    cp_entry_name(family, m->name, role, entry);
    return cp_module_kernel(m, entry, k, err, errlen);
}

void cp_module_unload(cp_module *m) {
    if (m->lib) (void)cudaLibraryUnload(m->lib);
    m->lib = NULL;
}

int cp_kernel_set_max_smem(cudaKernel_t k, unsigned bytes, char *err, int errlen) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes, dev);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "allowing %u bytes of dynamic shared memory", bytes);
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    return 0;
}

cudaError_t cp_launch(cudaKernel_t k, const cp_kdims *d, void **args, cudaStream_t s) {
    if (!d->grid[0] || !d->grid[1] || !d->grid[2]) return cudaSuccess;
    dim3 grid = {d->grid[0], d->grid[1], d->grid[2]}, block = {d->block, 1, 1};
    return cudaLaunchKernel((const void *)k, grid, block, args, d->smem, s);
}
