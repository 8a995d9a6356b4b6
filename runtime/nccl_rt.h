/* nccl_rt.h: NCCL, loaded when a run has several GPUs (named so that it never shadows NVIDIA's nccl.h).
 *
 * libnccl.so.2 is opened with dlopen, so a one-GPU run (and every CPU tool) works on machines without NCCL; the
 * header supplies the types only. Every wrapper checks the result and turns an error into a message naming the
 * rank, the call and what to do. Communicators are created non-blocking where the library can (NCCL 2.14 and
 * later), so that initialisation and every later wait have a deadline: cp_nccl_wait polls the communicator for an
 * asynchronous error while the GPU work finishes, and aborts it on an error or a timeout, so that when one rank
 * dies the others report it instead of hanging in a collective forever. */
#ifndef CP_NCCL_RT_H
#define CP_NCCL_RT_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>
#include <nccl.h> /* NVIDIA's header, for the types and enums only: the functions come from dlopen */

/* The functions cpgen uses. Optional ones are NULL when the library lacks them. */
typedef struct {
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                       ncclConfig_t *config); /* optional (2.14) */
    ncclResult_t (*CommFinalize)(ncclComm_t comm);            /* optional (2.14) */
    ncclResult_t (*CommSplit)(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                              ncclConfig_t *config);          /* optional (2.18): runs of several groups */
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *async_error);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*ReduceScatter)(const void *send, void *recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Send)(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*Recv)(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    const char *(*GetErrorString)(ncclResult_t result);
    const char *(*GetLastError)(ncclComm_t comm); /* optional (2.13) */
} cp_nccl_api;

/* Open the library (NULL: "libnccl.so.2", found through the usual library path) and resolve every function. Also
 * sets NCCL_NVLS_ENABLE=0 in this process unless the user set it (see launch.c). Loading again after success does
 * nothing. Returns 0, or -1 with a message saying what is missing and what to install. */
int cp_nccl_load(const char *lib, char *err, int errlen);

/* The loaded functions, or NULL when nothing is loaded. */
const cp_nccl_api *cp_nccl_api_get(void);

/* Use api instead of a loaded library (tests bring fakes; NULL forgets it), reporting version as its version. */
void cp_nccl_use_api(const cp_nccl_api *api, int version);

/* The library's version code (2.28.9 is 22809), 0 when nothing is loaded; and as text "2.28.9". */
int cp_nccl_version(void);
void cp_nccl_version_str(int code, char *buf, int n);

/* Bytes per element of t; 0 for a type cpgen does not know. */
size_t cp_nccl_type_size(ncclDataType_t t);

typedef struct {
    ncclComm_t comm;   /* NULL until initialised, and after destroy or abort */
    int rank, size;
    double timeout_s;  /* deadline of initialisation and of settling non-blocking calls */
    bool nonblocking;  /* created with blocking = 0: calls may return before they are done */
    bool aborted;      /* aborted after an error or timeout: only cp_nccl_destroy is left */
} cp_nccl_comm;

/* A new unique id for rank 0 to hand to the others (see rendezvous.h). Loads the library if needed. */
int cp_nccl_unique_id(ncclUniqueId *id, char *err, int errlen);

/* Create this rank's communicator on the current CUDA device (call cudaSetDevice(local_rank) first). Waits at most
 * timeout_s (<= 0: 300 s) for every rank to join, then aborts. Loads the library if needed. */
int cp_nccl_init(cp_nccl_comm *c, int rank, int size, const ncclUniqueId *id, double timeout_s, char *err, int errlen);

/* Split parent into the communicators of a run of several groups (replicas, a ring): every rank of parent calls
 * it, and those passing the same color (>= 0) get one communicator, ranked by key (0..size-1, distinct within a
 * color), which must be `size` ranks. Non-blocking like cp_nccl_init, with parent's deadline: it returns once the
 * split is done on this rank (the parent free again, the new handle in c), so splits follow one another. Needs NCCL
 * 2.18 or newer (ncclCommSplit); an older library gets a message saying so. `what` names the communicator in
 * messages. */
int cp_nccl_split(cp_nccl_comm *parent, int color, int key, int size, const char *what, cp_nccl_comm *c, char *err,
                  int errlen);

/* Finalize and destroy (or just free after an abort). Returns 0, or -1 with a message; c is reset either way. */
int cp_nccl_destroy(cp_nccl_comm *c, char *err, int errlen);

/* Abort the communicator: pending operations stop and peers see a remote error. Safe to call twice. */
void cp_nccl_abort(cp_nccl_comm *c);

/* The collectives, enqueued on stream. count is per rank: all-gather sends count and receives size * count;
 * reduce-scatter receives count and sends size * count; all-reduce sends and receives count. */
int cp_nccl_all_gather(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                       cudaStream_t stream, char *err, int errlen);
int cp_nccl_reduce_scatter(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, cudaStream_t stream, char *err, int errlen);
int cp_nccl_all_reduce(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                       cudaStream_t stream, char *err, int errlen);
int cp_nccl_send(cp_nccl_comm *c, const void *buf, size_t count, ncclDataType_t t, int peer, cudaStream_t stream,
                 char *err, int errlen);
int cp_nccl_recv(cp_nccl_comm *c, void *buf, size_t count, ncclDataType_t t, int peer, cudaStream_t stream,
                 char *err, int errlen);
/* Group calls, so that sends and receives to several peers progress together. */
int cp_nccl_group_start(cp_nccl_comm *c, char *err, int errlen);
int cp_nccl_group_end(cp_nccl_comm *c, char *err, int errlen);

/* All-to-all of equal contiguous blocks: block p of send (count elements at p * count) goes to rank p, and rank p's
 * block for this rank lands at p * count of recv. send and recv must not overlap. One group of sends and receives,
 * this rank's own block included. */
int cp_nccl_all_to_all(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                       cudaStream_t stream, char *err, int errlen);

/* Send count elements of send to rank `to` while count elements from rank `from` arrive in recv, in one group: a
 * ring's ranks each send to the next and receive from the previous, and grouped, no rank's send waits for a receive
 * its peer has not posted yet. send and recv must not overlap. */
int cp_nccl_send_recv(cp_nccl_comm *c, const void *send, int to, void *recv, int from, size_t count,
                      ncclDataType_t t, cudaStream_t stream, char *err, int errlen);

/* count elements from every rank's send into the root's recv at rank x count: a gather (NCCL has none) as grouped
 * sends and receives. recv is used on the root only and may be NULL elsewhere; on the root, send may be its own
 * block of recv (in place: nothing is sent to itself), or must not overlap it. */
int cp_nccl_gather(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                   cudaStream_t stream, char *err, int errlen);

/* News from outside NCCL that ends every wait of this process: another rank of the run is known to be gone (the
 * run's watch, world.c, calls it from its own thread with "rank K is gone: ..." or "rank K failed: ..."). The first
 * reason stays; from then on every poll of a wait or of a non-blocking call fails with it, aborting the
 * communicator, so a rank stops at once, naming the rank that died, instead of waiting for its deadline. NULL
 * forgets the reason (tests). */
void cp_nccl_stop_all(const char *why);
/* The reason given to cp_nccl_stop_all, or NULL. */
const char *cp_nccl_stop_reason(void);
/* A watch is running: a message about an NCCL error or a timeout waits up to 2 s for its news, so that it can
 * name the rank behind it (NCCL's own error for a closed connection usually comes first). */
void cp_nccl_expect_news(bool on);

/* Wait until event (when not NULL) or else everything on stream has finished, checking the communicator for an
 * asynchronous error meanwhile. On an error, or when timeout_s (<= 0: c->timeout_s) passes first, the
 * communicator is aborted and the message says which. what names the work in messages ("the step's all-to-all"). */
int cp_nccl_wait(cp_nccl_comm *c, cudaStream_t stream, cudaEvent_t event, const char *what, double timeout_s,
                 char *err, int errlen);

/* The same watchdog around any completion test: done returns 1 when finished, 0 when not yet, -1 with a message
 * on failure. */
int cp_nccl_wait_for(cp_nccl_comm *c, int (*done)(void *ctx, char *err, int errlen), void *ctx, const char *what,
                     double timeout_s, char *err, int errlen);

#endif
