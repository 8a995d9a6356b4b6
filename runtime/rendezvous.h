/* rendezvous.h: how the ranks of a run first find each other, before NCCL exists.
 *
 * Rank 0 makes a blob (the 128-byte NCCL unique id) that every rank needs before it can create the communicator.
 * Two ways to hand it over:
 *   - TCP (MASTER_ADDR, MASTER_PORT): rank 0 listens, the others connect (retrying until rank 0 is up) and stay
 *     connected in a star. The same connections then carry a barrier and a small all-gather of integers, e.g. to
 *     check that every rank planned the same arena sizes and spec hash before allocating anything.
 *   - a file in a folder every node shares (CPGEN_RENDEZVOUS_FILE), for mpirun/srun setups where no port is agreed
 *     beforehand: rank 0 writes it atomically, the others poll for it.
 * Every wait has a deadline, and every message names this rank and the peer (rank and address). Typical use:
 *
 *     cp_launch_detect(&e, ...);
 *     if (e.rendezvous_file[0]) cp_rdv_file_exchange(e.rendezvous_file, e.job_id, e.rank, e.size, &id, sizeof id, ...);
 *     else { cp_rdv_open(&r, &(cp_rdv_opts){e.rank, e.size, e.master_addr, e.master_port, 120}, ...);
 *            cp_rdv_bcast(r, &id, sizeof id, ...); cp_rdv_allgather(r, sizes, 3, all, ...); }
 */
#ifndef CP_RENDEZVOUS_H
#define CP_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int rank, size;
    const char *addr; /* rank 0's host name or address (MASTER_ADDR). Rank 0 listens on it when it is a loopback
                       * address (127.x.x.x, ::1, localhost), otherwise on every interface */
    int port;         /* MASTER_PORT */
    double timeout_s; /* for connecting and for each operation; <= 0: 120 s */
} cp_rdv_opts;

typedef struct cp_rdv cp_rdv;

/* Connect the ranks: rank 0 waits until all size - 1 others have connected and introduced themselves (same world
 * size, distinct ranks), the others connect with retries until the timeout. Returns once every rank is connected
 * (so it is also a first barrier): 0 with *out set, or -1 with a message. A world of one rank opens no socket. */
int cp_rdv_open(cp_rdv **out, const cp_rdv_opts *o, char *err, int errlen);

/* Rank 0's n bytes of buf (at most 1 MiB) into every rank's buf. Every rank passes the same n. */
int cp_rdv_bcast(cp_rdv *r, void *buf, size_t n, char *err, int errlen);

/* Returns once every rank has entered it. */
int cp_rdv_barrier(cp_rdv *r, char *err, int errlen);

/* Every rank's count values (the same count on every rank, at most 4096) into all[rank * count + k], on every
 * rank. */
int cp_rdv_allgather(cp_rdv *r, const int64_t *mine, int count, int64_t *all, char *err, int errlen);

/* The deadline of later operations (the barrier before a long start-up step may need more than the default). */
void cp_rdv_set_timeout(cp_rdv *r, double timeout_s);

/* After the meeting, the star can stay open for the whole run as the ranks' news line: a thread (the watch) reads
 * every connection from then on, and when a rank's connection closes without a goodbye (it was killed, crashed, or
 * its node failed) or it says it failed, every other rank's on_gone is called once for it, from that thread, with
 * its rank and a phrase ("is gone: ...", "failed: <its message>"): rank 0 sees its peers directly and passes the
 * news on; the others see rank 0 directly. No other rendezvous operation may follow. Returns 0, or -1 with a
 * message. A world of one rank watches nothing. */
typedef void (*cp_rdv_peer_gone)(void *ctx, int rank, const char *why);
int cp_rdv_watch(cp_rdv *r, cp_rdv_peer_gone on_gone, void *ctx, char *err, int errlen);
/* This rank failed with message why: tell the others (through rank 0) before it stops. Best effort, at most a few
 * seconds; r may be NULL or not watching (nothing happens). */
void cp_rdv_say_fail(cp_rdv *r, const char *why);
/* This rank leaves normally: its closing connection is no news to the others. */
void cp_rdv_say_bye(cp_rdv *r);

/* Close the connections (and stop the watch). r may be NULL. After a failed operation the handle is only good for
 * closing. */
void cp_rdv_close(cp_rdv *r);

/* Hand n bytes (at most 64 KiB) from rank 0 to the others through the file at path: rank 0 writes it (a temporary
 * file renamed into place, so no reader sees half of it), the others read it as soon as it exists. A file from
 * another run (a different job_id or world size) is waited out as if absent: rank 0 replaces it. With an empty
 * job_id that check is impossible, so give each run its own path. Returns 0, or -1 with a message naming the path
 * (and the stale file's run, if that was all there was at the deadline). timeout_s <= 0: 120 s. */
int cp_rdv_file_exchange(const char *path, const char *job_id, int rank, int size, void *blob, size_t n,
                         double timeout_s, char *err, int errlen);

#endif
