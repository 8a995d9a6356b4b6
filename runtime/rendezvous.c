/* rendezvous.c: the ranks' first meeting over a TCP star or a shared file (see rendezvous.h).
 *
 * Wire format: every message is a 16-byte header (magic "CPRV", type, payload length, sender's rank; big-endian
 * 32-bit words) and its payload. Sockets are non-blocking and every read and write waits with poll() against the
 * operation's deadline, so a dead or stuck peer ends in an error that names it rather than a hang. */
#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define RDV_MAGIC 0x43505256u /* "CPRV" */
#define RDV_VERSION 1u
#define RDV_MAX_BCAST (1u << 20)
#define RDV_MAX_GATHER 4096
#define RDV_HELLO_WAIT_S 5.0 /* how long a fresh connection has to introduce itself before it is dropped */

enum { M_HELLO = 1, M_WELCOME, M_REFUSE, M_BCAST, M_BARRIER, M_RELEASE, M_GATHER, M_GATHERED, M_BYE, M_FAIL, M_GONE };
#define RDV_MAX_NEWS 2048 /* the longest failure message a rank passes on */

static const char *msg_name(unsigned t) {
    static const char *const names[] = {"?", "hello", "welcome", "refusal", "broadcast", "barrier", "barrier release",
                                        "all-gather", "all-gather result", "goodbye", "failure", "news of a rank"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown message";
}

struct cp_rdv {
    int rank, size;
    double timeout_s;
    int *fd;           /* rank 0: fd[p] is rank p's connection (fd[0] unused); others: fd[0] is rank 0's */
    char (*peer)[128]; /* "rank p (address:port)", indexed like fd */
    bool broken;
    /* the watch (cp_rdv_watch): a thread that owns every read from then on */
    bool watching;
    pthread_t watcher;
    int wake[2];                /* a pipe: closing the rendezvous wakes the watcher */
    pthread_mutex_t send_lock;  /* the watcher passes news on while this rank may say goodbye or fail */
    unsigned char *left;        /* indexed like fd: the peer said goodbye or failed, so its closing is no news */
    cp_rdv_peer_gone on_gone;
    void *ctx;
};

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static void put64(unsigned char *p, int64_t v) {
    put32(p, (uint32_t)((uint64_t)v >> 32));
    put32(p + 4, (uint32_t)v);
}
static int64_t get64(const unsigned char *p) { return (int64_t)((uint64_t)get32(p) << 32 | get32(p + 4)); }

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

static void addr_str(const struct sockaddr *sa, char *buf, size_t n) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s = (const void *)sa;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        port = ntohs(s->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const void *)sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        port = ntohs(s->sin6_port);
        /* An IPv4 peer on a dual-stack socket: show the IPv4 address people know. */
        if (!strncmp(host, "::ffff:", 7) && strchr(host + 7, '.')) memmove(host, host + 7, strlen(host + 7) + 1);
    }
    snprintf(buf, n, "%s:%d", host, port);
}

/* ------------------------------------------------------------------------------------------------------------
 * sending and receiving with a deadline */

/* What went wrong moving bytes; the caller turns it into a message naming both ends. */
typedef enum { IO_OK, IO_TIMEOUT, IO_CLOSED, IO_ERROR } io_result;

static io_result io_all(int fd, void *buf, size_t n, bool out, double deadline, int *err_no) {
    unsigned char *p = buf;
    while (n > 0) {
        double left = deadline - cp_now();
        if (left <= 0) return IO_TIMEOUT;
        struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int rc = poll(&pf, 1, ms);
        if (rc < 0) {
            if (errno == EINTR) continue;
            *err_no = errno;
            return IO_ERROR;
        }
        if (rc == 0) continue; /* the deadline check above ends it */
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            if (errno == ECONNRESET || errno == EPIPE) return IO_CLOSED;
            *err_no = errno;
            return IO_ERROR;
        }
        if (k == 0) return IO_CLOSED;
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

/* The message for a failed transfer with peer `who` during `what`. */
static int io_fail(const cp_rdv *r, io_result res, int err_no, const char *who, const char *what, bool out,
                   char *err, int errlen) {
    switch (res) {
    case IO_TIMEOUT:
        if (out)
            return cp_errf(err, errlen, "rank %d: could not send to %s for %.3g s during the %s: it stopped reading "
                        "(stuck or overloaded)", r->rank, who, r->timeout_s, what);
        return cp_errf(err, errlen, "rank %d: no word from %s for %.3g s during the %s: it is stuck, much slower than "
                    "this rank, or running a different program; if start-up is legitimately that slow, raise the "
                    "timeout", r->rank, who, r->timeout_s, what);
    case IO_CLOSED:
        return cp_errf(err, errlen, "rank %d: %s closed the connection during the %s: it exited or failed; its own "
                    "output says why", r->rank, who, what);
    default:
        return cp_errf(err, errlen, "rank %d: %s with %s failed during the %s: %s", r->rank, out ? "send" : "recv", who,
                    what, strerror(err_no));
    }
}

static int send_msg(cp_rdv *r, int idx, unsigned type, const void *payload, size_t len, double deadline,
                    const char *what, char *err, int errlen) {
    unsigned char h[16];
    put32(h, RDV_MAGIC), put32(h + 4, type), put32(h + 8, (uint32_t)len), put32(h + 12, (uint32_t)r->rank);
    int e = 0;
    io_result res = io_all(r->fd[idx], h, sizeof h, true, deadline, &e);
    if (res == IO_OK && len) res = io_all(r->fd[idx], (void *)payload, len, true, deadline, &e);
    if (res != IO_OK) {
        r->broken = true;
        return io_fail(r, res, e, r->peer[idx], what, true, err, errlen);
    }
    return 0;
}

/* Receive a message of `type` with exactly `len` bytes of payload from connection idx. A refusal from rank 0 and a
 * message of another type (the ranks are in different operations) are reported as such. */
static int recv_msg(cp_rdv *r, int idx, unsigned type, void *payload, size_t len, double deadline, const char *what,
                    char *err, int errlen) {
    unsigned char h[16];
    int e = 0;
    io_result res = io_all(r->fd[idx], h, sizeof h, false, deadline, &e);
    if (res != IO_OK) {
        r->broken = true;
        return io_fail(r, res, e, r->peer[idx], what, false, err, errlen);
    }
    r->broken = true; /* until the message proves good */
    uint32_t magic = get32(h), got = get32(h + 4), glen = get32(h + 8);
    if (magic != RDV_MAGIC)
        return cp_errf(err, errlen, "rank %d: %s sent something that is not a cpgen rendezvous message during the %s",
                    r->rank, r->peer[idx], what);
    if (got == M_REFUSE) {
        char why[512] = "";
        size_t k = glen < sizeof why - 1 ? glen : sizeof why - 1;
        if (io_all(r->fd[idx], why, k, false, deadline, &e) != IO_OK) snprintf(why, sizeof why, "(no reason given)");
        why[k] = 0;
        return cp_errf(err, errlen, "rank %d: %s refused this rank: %s", r->rank, r->peer[idx], why);
    }
    if (got != type)
        return cp_errf(err, errlen, "rank %d: %s sent its %s while this rank was in the %s: the ranks are running "
                    "different programs; check that every rank runs the same cpgen build and spec", r->rank,
                    r->peer[idx], msg_name(got), what);
    if (glen != len)
        return cp_errf(err, errlen, "rank %d: %s sent %u bytes for the %s, this rank expects %zu: every rank must pass "
                    "the same size (are they running the same cpgen build?)", r->rank, r->peer[idx], glen, what, len);
    if (len && (res = io_all(r->fd[idx], payload, len, false, deadline, &e)) != IO_OK)
        return io_fail(r, res, e, r->peer[idx], what, false, err, errlen);
    r->broken = false;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * opening the star */

static bool is_loopback(const char *a) {
    return !strcmp(a, "localhost") || !strncmp(a, "127.", 4) || !strcmp(a, "::1");
}

static int listen_on(const cp_rdv_opts *o, char *err, int errlen) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    int family;
    struct sockaddr_in *s4 = (void *)&ss;
    struct sockaddr_in6 *s6 = (void *)&ss;
    /* A loopback address means a one-node run: listen there only. Otherwise any interface, since the address the
     * others use for this host (a name, one of several NICs) is not known here; IPv6 with IPv4 mapped, so both
     * families reach it, and plain IPv4 where IPv6 is off. */
    if (!strcmp(o->addr, "::1")) {
        family = AF_INET6;
        s6->sin6_addr = in6addr_loopback;
    } else if (is_loopback(o->addr)) {
        family = AF_INET;
        if (inet_pton(AF_INET, !strcmp(o->addr, "localhost") ? "127.0.0.1" : o->addr, &s4->sin_addr) != 1)
            return cp_errf(err, errlen, "rank 0: MASTER_ADDR %s is not a valid IPv4 address", o->addr);
    } else {
        family = AF_INET6;
        s6->sin6_addr = in6addr_any;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && family == AF_INET6 && !strcmp(o->addr, "::1"))
        return cp_errf(err, errlen, "rank 0: cannot create an IPv6 socket for MASTER_ADDR ::1: %s", strerror(errno));
    if (fd < 0 && family == AF_INET6 && (errno == EAFNOSUPPORT || errno == EPROTONOSUPPORT)) {
        family = AF_INET;
        memset(&ss, 0, sizeof ss);
        s4->sin_addr.s_addr = htonl(INADDR_ANY);
        fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    if (fd < 0) return cp_errf(err, errlen, "rank 0: cannot create a TCP socket: %s", strerror(errno));
    int one = 1, zero = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (family == AF_INET6 && strcmp(o->addr, "::1") &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0)) {
        int e = errno;
        close(fd);
        return cp_errf(err, errlen, "rank 0: setsockopt on the rendezvous socket failed: %s", strerror(e));
    }
    if (family == AF_INET) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)o->port);
        len = sizeof *s4;
    } else {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)o->port);
        len = sizeof *s6;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return cp_errf(err, errlen, "rank 0: cannot listen on port %d (MASTER_PORT): it is in use, by another "
                        "program or an earlier run that is still there; choose another MASTER_PORT", o->port);
        if (e == EACCES)
            return cp_errf(err, errlen, "rank 0: cannot listen on port %d (MASTER_PORT): ports below 1024 need root; "
                        "choose one above 1024", o->port);
        return cp_errf(err, errlen, "rank 0: cannot listen on %s port %d: %s", o->addr, o->port, strerror(e));
    }
    int backlog = o->size + 16 < SOMAXCONN ? o->size + 16 : SOMAXCONN;
    if (listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        return cp_errf(err, errlen, "rank 0: listen on port %d failed: %s", o->port, strerror(e));
    }
    return fd;
}

static void set_nodelay(int fd) {
    int one = 1;
    /* Small messages, each awaited: Nagle's delay would only add latency. Failing to set it costs nothing else. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0: accept until every other rank has said hello. Stray connections (port scanners, health checks) that do
 * not introduce themselves are dropped; a real rank with the wrong world size, a rank out of range or a rank taken
 * twice is a misconfiguration that stops the run, and that rank is told why. */
static int accept_all(cp_rdv *r, const cp_rdv_opts *o, double deadline, char *err, int errlen) {
    int lfd = listen_on(o, err, errlen);
    if (lfd < 0) return -1;
    int joined = 0, strays = 0, rc = 0;
    while (joined < r->size - 1) {
        double left = deadline - cp_now();
        if (left <= 0) {
            char missing[256] = "";
            size_t k = 0;
            for (int p = 1; p < r->size && k + 16 < sizeof missing; p++)
                if (r->fd[p] < 0) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", p);
            char stray_note[96] = "";
            if (strays)
                snprintf(stray_note, sizeof stray_note, " (%d other connection%s did not speak the rendezvous "
                         "protocol)", strays, strays > 1 ? "s" : "");
            rc = cp_errf(err, errlen, "rank 0: only %d of %d ranks reached %s:%d within %.3g s; missing rank%s %s%s: "
                      "check that they were started, with the same MASTER_ADDR and MASTER_PORT, and that they can "
                      "reach this host through the firewall", joined + 1, r->size, o->addr, o->port, r->timeout_s,
                      r->size - 1 - joined > 1 ? "s" : "", missing, stray_note);
            break;
        }
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno != EINTR) {
            rc = cp_errf(err, errlen, "rank 0: poll on the rendezvous socket failed: %s", strerror(errno));
            break;
        }
        if (pr <= 0) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int cfd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) continue;
            rc = cp_errf(err, errlen, "rank 0: accept on port %d failed: %s%s", o->port, strerror(errno),
                      errno == EMFILE ? " (raise the open-file limit: ulimit -n)" : "");
            break;
        }
        set_nodelay(cfd);
        char where[64];
        addr_str((struct sockaddr *)&ss, where, sizeof where);
        unsigned char m[28];
        int e = 0;
        double hello_deadline = cp_now() + RDV_HELLO_WAIT_S < deadline ? cp_now() + RDV_HELLO_WAIT_S : deadline;
        if (io_all(cfd, m, 16, false, hello_deadline, &e) != IO_OK || get32(m) != RDV_MAGIC ||
            get32(m + 4) != M_HELLO || get32(m + 8) != 12 ||
            io_all(cfd, m + 16, 12, false, hello_deadline, &e) != IO_OK) {
            close(cfd);
            strays++;
            continue;
        }
        uint32_t ver = get32(m + 16), prank = get32(m + 20), psize = get32(m + 24);
        char why[400] = "";
        if (ver != RDV_VERSION)
            snprintf(why, sizeof why, "the process at %s speaks rendezvous version %u, this one %u: every rank must "
                     "run the same cpgen build", where, ver, RDV_VERSION);
        else if (psize != (uint32_t)r->size)
            snprintf(why, sizeof why, "the process at %s says it is rank %u of %u, but rank 0 was told the run has "
                     "%d ranks: every rank must get the same world size (WORLD_SIZE or the launcher's)", where, prank,
                     psize, r->size);
        else if (prank < 1 || prank >= (uint32_t)r->size)
            snprintf(why, sizeof why, "the process at %s says it is rank %u, which is not 1 to %d", where, prank,
                     r->size - 1);
        else if (r->fd[prank] >= 0)
            snprintf(why, sizeof why, "two processes say they are rank %u: %s and %s; every rank needs its own "
                     "number (check RANK or the launcher's rank variable)", prank, r->peer[prank], where);
        if (why[0]) {
            unsigned char h[16];
            size_t wl = strlen(why);
            put32(h, RDV_MAGIC), put32(h + 4, M_REFUSE), put32(h + 8, (uint32_t)wl), put32(h + 12, 0);
            double d = cp_now() + 1.0;
            if (io_all(cfd, h, sizeof h, true, d, &e) == IO_OK) (void)io_all(cfd, why, wl, true, d, &e);
            close(cfd);
            rc = cp_errf(err, errlen, "rank 0: %s", why);
            break;
        }
        r->fd[prank] = cfd;
        snprintf(r->peer[prank], sizeof r->peer[prank], "rank %u (%s)", prank, where);
        joined++;
    }
    close(lfd);
    for (int p = 1; p < r->size && rc == 0; p++)
        rc = send_msg(r, p, M_WELCOME, NULL, 0, deadline, "rendezvous", err, errlen);
    return rc;
}

/* Ranks other than 0: connect to rank 0, retrying while it is not up yet, until the deadline. */
static int connect_to_root(cp_rdv *r, const cp_rdv_opts *o, double deadline, char *err, int errlen) {
    char port[16], last[256] = "no attempt finished";
    snprintf(port, sizeof port, "%d", o->port);
    double backoff = 0.02;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(o->addr, port, &hints, &res);
        if (g != 0 && g != EAI_AGAIN)
            return cp_errf(err, errlen, "rank %d: cannot resolve MASTER_ADDR %s: %s; use rank 0's host name as this "
                        "node knows it, or its IP address", r->rank, o->addr,
                        g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        if (g == EAI_AGAIN) snprintf(last, sizeof last, "resolving %s: %s", o->addr, gai_strerror(g));
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                snprintf(last, sizeof last, "socket: %s", strerror(errno));
                continue;
            }
            int c = connect(fd, ai->ai_addr, ai->ai_addrlen), e = c == 0 ? 0 : errno;
            if (c != 0 && e == EINPROGRESS) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                double left = deadline - cp_now();
                int pr;
                do pr = poll(&pf, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
                while (pr < 0 && errno == EINTR);
                socklen_t el = sizeof e;
                if (pr == 0) e = ETIMEDOUT;
                else if (pr < 0) e = errno;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
            }
            if (e == 0) {
                freeaddrinfo(res);
                set_nodelay(fd);
                r->fd[0] = fd;
                return 0;
            }
            snprintf(last, sizeof last, "%s", strerror(e));
            close(fd);
        }
        if (res) freeaddrinfo(res);
        double left = deadline - cp_now();
        if (left <= 0)
            return cp_errf(err, errlen, "rank %d: could not reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.3g "
                        "s (last error: %s): check that rank 0 is running, that MASTER_ADDR is its address as this "
                        "node sees it, and that no firewall blocks the port", r->rank, o->addr, o->port,
                        r->timeout_s, last);
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < 0.5 ? backoff * 2 : 0.5;
    }
}

int cp_rdv_open(cp_rdv **out, const cp_rdv_opts *o, char *err, int errlen) {
    *out = NULL;
    if (!o || o->size < 1 || o->rank < 0 || o->rank >= o->size)
        return cp_errf(err, errlen, "cp_rdv_open: rank %d of %d is not a valid rank", o ? o->rank : -1, o ? o->size : 0);
    if (o->size > 1 && (!o->addr || !*o->addr || o->port < 1 || o->port > 65535))
        return cp_errf(err, errlen, "rank %d: the TCP rendezvous needs rank 0's address and a port 1 to 65535 (got "
                    "\"%s\":%d): set MASTER_ADDR and MASTER_PORT", o->rank, o->addr ? o->addr : "", o->port);
    cp_rdv *r = calloc(1, sizeof *r);
    if (r) {
        r->fd = malloc((size_t)o->size * sizeof *r->fd);
        r->peer = calloc((size_t)o->size, sizeof *r->peer);
    }
    if (!r || !r->fd || !r->peer) {
        cp_rdv_close(r);
        return cp_errf(err, errlen, "rank %d: out of memory for the rendezvous of %d ranks", o->rank, o->size);
    }
    r->rank = o->rank;
    r->size = o->size;
    r->timeout_s = o->timeout_s > 0 ? o->timeout_s : 120;
    for (int p = 0; p < o->size; p++) r->fd[p] = -1;
    int rc = 0;
    double deadline = cp_now() + r->timeout_s;
    if (o->size == 1) {
        /* nothing to meet */
    } else if (o->rank == 0) {
        rc = accept_all(r, o, deadline, err, errlen);
    } else {
        snprintf(r->peer[0], sizeof r->peer[0], "rank 0 (%s:%d)", o->addr, o->port);
        rc = connect_to_root(r, o, deadline, err, errlen);
        unsigned char hello[12];
        put32(hello, RDV_VERSION), put32(hello + 4, (uint32_t)o->rank), put32(hello + 8, (uint32_t)o->size);
        if (!rc) rc = send_msg(r, 0, M_HELLO, hello, sizeof hello, deadline, "rendezvous", err, errlen);
        /* Rank 0 answers once every rank has joined; a timeout here means some other rank is missing. */
        if (!rc && recv_msg(r, 0, M_WELCOME, NULL, 0, deadline, "rendezvous", err, errlen)) {
            if (strstr(err, "no word from"))
                cp_errf(err, errlen, "rank %d: connected to rank 0 at %s:%d, but not every rank joined within %.3g s "
                     "(rank 0's output names the missing ones)", o->rank, o->addr, o->port, r->timeout_s);
            rc = -1;
        }
    }
    if (rc) {
        cp_rdv_close(r);
        return -1;
    }
    *out = r;
    return 0;
}

void cp_rdv_set_timeout(cp_rdv *r, double timeout_s) {
    if (r) r->timeout_s = timeout_s > 0 ? timeout_s : 120;
}

void cp_rdv_close(cp_rdv *r) {
    if (!r) return;
    if (r->watching) {
        close(r->wake[1]); /* the watcher's poll wakes on the pipe's end */
        pthread_join(r->watcher, NULL);
        close(r->wake[0]);
        pthread_mutex_destroy(&r->send_lock);
    }
    free(r->left);
    if (r->fd)
        for (int p = 0; p < r->size; p++)
            if (r->fd[p] >= 0) close(r->fd[p]);
    free(r->fd);
    free(r->peer);
    free(r);
}

static int usable(const cp_rdv *r, const char *what, char *err, int errlen) {
    if (!r) return cp_errf(err, errlen, "%s: the rendezvous is not open", what);
    if (r->watching)
        return cp_errf(err, errlen, "rank %d: %s after cp_rdv_watch: the watch owns the connections (a cpgen bug)",
                       r->rank, what);
    if (r->broken)
        return cp_errf(err, errlen, "rank %d: %s after a failed rendezvous operation: the connections are in an unknown "
                    "state; close the rendezvous and stop", r->rank, what);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * operations */

int cp_rdv_bcast(cp_rdv *r, void *buf, size_t n, char *err, int errlen) {
    if (usable(r, "broadcast", err, errlen)) return -1;
    if (n > RDV_MAX_BCAST || (n && !buf))
        return cp_errf(err, errlen, "rank %d: broadcast of %zu bytes: give a buffer of at most %u bytes", r->rank, n,
                    RDV_MAX_BCAST);
    double deadline = cp_now() + r->timeout_s;
    if (r->rank == 0) {
        for (int p = 1; p < r->size; p++)
            if (send_msg(r, p, M_BCAST, buf, n, deadline, "broadcast", err, errlen)) return -1;
        return 0;
    }
    return r->size > 1 ? recv_msg(r, 0, M_BCAST, buf, n, deadline, "broadcast", err, errlen) : 0;
}

int cp_rdv_barrier(cp_rdv *r, char *err, int errlen) {
    if (usable(r, "barrier", err, errlen)) return -1;
    double deadline = cp_now() + r->timeout_s;
    if (r->rank == 0) {
        for (int p = 1; p < r->size; p++)
            if (recv_msg(r, p, M_BARRIER, NULL, 0, deadline, "barrier", err, errlen)) return -1;
        for (int p = 1; p < r->size; p++)
            if (send_msg(r, p, M_RELEASE, NULL, 0, deadline, "barrier", err, errlen)) return -1;
        return 0;
    }
    if (r->size == 1) return 0;
    if (send_msg(r, 0, M_BARRIER, NULL, 0, deadline, "barrier", err, errlen)) return -1;
    return recv_msg(r, 0, M_RELEASE, NULL, 0, deadline, "barrier", err, errlen);
}

int cp_rdv_allgather(cp_rdv *r, const int64_t *mine, int count, int64_t *all, char *err, int errlen) {
    if (usable(r, "all-gather", err, errlen)) return -1;
    if (count < 1 || count > RDV_MAX_GATHER || !mine || !all || (int64_t)count * r->size > (1 << 21))
        return cp_errf(err, errlen, "rank %d: all-gather of %d values per rank over %d ranks: give 1 to %d values and "
                    "both arrays", r->rank, count, r->size, RDV_MAX_GATHER);
    size_t one = (size_t)count * 8, total = one * (size_t)r->size;
    unsigned char *buf = malloc(total);
    if (!buf) return cp_errf(err, errlen, "rank %d: out of memory for an all-gather of %zu bytes", r->rank, total);
    double deadline = cp_now() + r->timeout_s;
    int rc = 0;
    if (r->rank == 0) {
        for (int k = 0; k < count; k++) put64(buf + 8 * k, mine[k]);
        for (int p = 1; p < r->size && !rc; p++)
            rc = recv_msg(r, p, M_GATHER, buf + one * (size_t)p, one, deadline, "all-gather", err, errlen);
        for (int p = 1; p < r->size && !rc; p++)
            rc = send_msg(r, p, M_GATHERED, buf, total, deadline, "all-gather", err, errlen);
    } else {
        for (int k = 0; k < count; k++) put64(buf + 8 * k, mine[k]);
        rc = send_msg(r, 0, M_GATHER, buf, one, deadline, "all-gather", err, errlen);
        if (!rc) rc = recv_msg(r, 0, M_GATHERED, buf, total, deadline, "all-gather", err, errlen);
    }
    if (!rc)
        for (size_t k = 0; k < (size_t)count * (size_t)r->size; k++) all[k] = get64(buf + 8 * k);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * the watch: the star kept for the run, so that every rank hears at once of a rank that died or failed */

/* One message of news or goodbye, all under the send lock (the watcher and this rank's own thread both send). A
 * peer that does not take it within two seconds is left alone: news is best effort, the waits' deadlines remain. */
static void send_news(cp_rdv *r, int idx, unsigned type, int about, const char *text) {
    size_t tl = text ? strnlen(text, RDV_MAX_NEWS) : 0;
    unsigned char payload[4 + RDV_MAX_NEWS];
    size_t n = 0;
    if (type == M_GONE) put32(payload, (uint32_t)about), n = 4;
    if (tl) memcpy(payload + n, text, tl), n += tl;
    char ignored[256];
    pthread_mutex_lock(&r->send_lock);
    if (r->fd[idx] >= 0) (void)send_msg(r, idx, type, payload, n, cp_now() + 2.0, "news", ignored, sizeof ignored);
    pthread_mutex_unlock(&r->send_lock);
}

/* Rank `about` is gone (why: "failed: ..." or "is gone: ..."): rank 0 tells every other rank still there, then this
 * rank's own callback hears it. */
static void gone(cp_rdv *r, int about, const char *why) {
    if (r->rank == 0)
        for (int p = 1; p < r->size; p++)
            if (p != about && !__atomic_load_n(&r->left[p], __ATOMIC_RELAXED)) send_news(r, p, M_GONE, about, why);
    r->on_gone(r->ctx, about, why);
}

/* One message, or the end of connection idx: returns false when that connection is done. */
static bool watch_one(cp_rdv *r, int idx) {
    int peer = r->rank == 0 ? idx : 0, e = 0;
    unsigned char h[16];
    char text[RDV_MAX_NEWS + 64];
    double d = cp_now() + 5.0; /* a message that has begun arrives whole at once */
    io_result res = io_all(r->fd[idx], h, sizeof h, false, d, &e);
    uint32_t type = res == IO_OK ? get32(h + 4) : 0, len = res == IO_OK ? get32(h + 8) : 0;
    if (res == IO_OK && (get32(h) != RDV_MAGIC || len > 4 + RDV_MAX_NEWS)) res = IO_ERROR;
    unsigned char payload[4 + RDV_MAX_NEWS + 1];
    if (res == IO_OK && len) res = io_all(r->fd[idx], payload, len, false, d, &e);
    if (res != IO_OK) {
        if (!__atomic_exchange_n(&r->left[idx], 1, __ATOMIC_RELAXED)) {
            snprintf(text, sizeof text, "is gone: its connection to %s closed without a word (the process was "
                     "killed or crashed, or its node or the network failed)", r->rank == 0 ? "rank 0" : "this rank");
            gone(r, peer, text);
        }
        return false;
    }
    if (type == M_BYE) {
        __atomic_store_n(&r->left[idx], 1, __ATOMIC_RELAXED);
    } else if (type == M_FAIL && r->rank == 0 && len <= RDV_MAX_NEWS) {
        __atomic_store_n(&r->left[idx], 1, __ATOMIC_RELAXED);
        snprintf(text, sizeof text, "failed: %.*s", (int)len, (const char *)payload);
        gone(r, peer, text);
    } else if (type == M_GONE && r->rank != 0 && len >= 4) {
        int about = (int)get32(payload);
        snprintf(text, sizeof text, "%.*s", (int)(len - 4), (const char *)payload + 4);
        if (about == 0) /* rank 0 itself failed: its closing is no more news */
            __atomic_store_n(&r->left[0], 1, __ATOMIC_RELAXED);
        if (about >= 0 && about < r->size) r->on_gone(r->ctx, about, text);
    }
    return true;
}

static void *watch_main(void *arg) {
    cp_rdv *r = arg;
    int n = r->rank == 0 ? r->size : 1;
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *idx = calloc((size_t)n + 1, sizeof *idx);
    bool *open_ = calloc((size_t)n, sizeof *open_);
    if (!pf || !idx || !open_) goto out;
    for (int i = r->rank == 0 ? 1 : 0; i < n; i++) open_[i] = r->fd[i] >= 0;
    for (;;) {
        int k = 0;
        pf[k++] = (struct pollfd){.fd = r->wake[0], .events = POLLIN};
        for (int i = 0; i < n; i++)
            if (open_[i]) idx[k] = i, pf[k++] = (struct pollfd){.fd = r->fd[i], .events = POLLIN};
        if (k == 1) break; /* every peer has left */
        if (poll(pf, (nfds_t)k, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break; /* closing */
        for (int j = 1; j < k; j++)
            if (pf[j].revents && !watch_one(r, idx[j])) open_[idx[j]] = false;
    }
out:
    free(pf);
    free(idx);
    free(open_);
    return NULL;
}

int cp_rdv_watch(cp_rdv *r, cp_rdv_peer_gone on_gone, void *ctx, char *err, int errlen) {
    if (usable(r, "watch", err, errlen)) return -1;
    if (!on_gone) return cp_errf(err, errlen, "rank %d: cp_rdv_watch: no callback", r->rank);
    if (r->size == 1) return 0;
    r->left = calloc((size_t)r->size, 1);
    if (!r->left) return cp_errf(err, errlen, "rank %d: out of memory for the watch", r->rank);
    if (pipe2(r->wake, O_CLOEXEC) != 0)
        return cp_errf(err, errlen, "rank %d: the watch's pipe: %s", r->rank, strerror(errno));
    pthread_mutex_init(&r->send_lock, NULL);
    r->on_gone = on_gone;
    r->ctx = ctx;
    int e = pthread_create(&r->watcher, NULL, watch_main, r);
    if (e) {
        close(r->wake[0]);
        close(r->wake[1]);
        pthread_mutex_destroy(&r->send_lock);
        return cp_errf(err, errlen, "rank %d: starting the watch: %s", r->rank, strerror(e));
    }
    r->watching = true;
    return 0;
}

/* To every peer this rank is connected to: rank 0's news goes to all, another rank's to rank 0, which passes a
 * failure on. */
static void tell_peers(cp_rdv *r, unsigned type, const char *text) {
    if (!r || !r->watching) return;
    if (r->rank == 0) {
        for (int p = 1; p < r->size; p++)
            if (!__atomic_load_n(&r->left[p], __ATOMIC_RELAXED)) send_news(r, p, type == M_FAIL ? M_GONE : type, 0, text);
    } else {
        send_news(r, 0, type, r->rank, text);
    }
}

void cp_rdv_say_fail(cp_rdv *r, const char *why) {
    char text[RDV_MAX_NEWS + 16];
    snprintf(text, sizeof text, "%s%s", r && r->rank == 0 ? "failed: " : "", why ? why : "(no message)");
    tell_peers(r, M_FAIL, text);
}

void cp_rdv_say_bye(cp_rdv *r) { tell_peers(r, M_BYE, NULL); }

/* ------------------------------------------------------------------------------------------------------------
 * file rendezvous
 *
 * The file is text, so that `cat` shows what a stuck run is waiting for:
 *     cpgen-rendezvous 1
 *     job <job id, or - when unknown>
 *     size <world size>
 *     bytes <n>
 *     data <2n hex digits>
 */

#define RDV_FILE_MAX_BLOB 65536

/* The job id as written on its line: no line breaks, "-" for none. */
static void job_token(const char *job_id, char *out, size_t n) {
    if (!job_id || !*job_id) {
        snprintf(out, n, "-");
        return;
    }
    snprintf(out, n, "%s", job_id);
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
}

typedef struct {
    char job[160];
    int size;
    size_t bytes;
    const char *hex;
} rdv_file;

/* Parse the file's text. Returns 0, or -1 when it is not a rendezvous file. */
static int parse_rdv_file(char *text, rdv_file *f) {
    char *save = NULL, *line[5];
    for (int k = 0; k < 5; k++)
        if (!(line[k] = strtok_r(k ? NULL : text, "\n", &save))) return -1;
    unsigned long long b;
    char *end;
    if (strcmp(line[0], "cpgen-rendezvous 1") || strncmp(line[1], "job ", 4) || strncmp(line[2], "size ", 5) ||
        strncmp(line[3], "bytes ", 6) || strncmp(line[4], "data ", 5))
        return -1;
    snprintf(f->job, sizeof f->job, "%s", line[1] + 4);
    long s = strtol(line[2] + 5, &end, 10);
    if (*end || s < 1 || s > 1 << 20) return -1;
    f->size = (int)s;
    b = strtoull(line[3] + 6, &end, 10);
    if (*end || b > RDV_FILE_MAX_BLOB) return -1;
    f->bytes = (size_t)b;
    f->hex = line[4] + 5;
    return strlen(f->hex) == 2 * f->bytes ? 0 : -1;
}

static int unhex(const char *h, unsigned char *out, size_t n) {
    for (size_t k = 0; k < n; k++) {
        unsigned v;
        if (sscanf(h + 2 * k, "%2x", &v) != 1) return -1;
        out[k] = (unsigned char)v;
    }
    return 0;
}

int cp_rdv_file_exchange(const char *path, const char *job_id, int rank, int size, void *blob, size_t n,
                         double timeout_s, char *err, int errlen) {
    if (!path || !*path) return cp_errf(err, errlen, "rank %d: no rendezvous file: set CPGEN_RENDEZVOUS_FILE", rank);
    if (size < 1 || rank < 0 || rank >= size)
        return cp_errf(err, errlen, "rendezvous file %s: rank %d of %d is not a valid rank", path, rank, size);
    if (n > RDV_FILE_MAX_BLOB || (n && !blob))
        return cp_errf(err, errlen, "rank %d: rendezvous file %s: give a buffer of at most %d bytes", rank, path,
                    RDV_FILE_MAX_BLOB);
    char job[160];
    job_token(job_id, job, sizeof job);
    if (timeout_s <= 0) timeout_s = 120;
    if (rank == 0) {
        /* Replacing a file of one of ours is the point (an earlier run's is stale); anything else there is the
         * user's, and a mistyped path should not destroy it. */
        size_t len = 0;
        char why[256];
        char *old = cp_read_file_as(path, CP_FILE_STATE, &len, why, sizeof why);
        if (!old && errno != ENOENT) /* a folder, a FIFO, a large file: the user's, never replaced */
            return cp_errf(err, errlen, "rank 0: %s (CPGEN_RENDEZVOUS_FILE) exists and cannot be read as a cpgen "
                        "rendezvous file (%s): not replacing it; choose a path of its own", path, why);
        if (old) {
            rdv_file f;
            int bad = parse_rdv_file(old, &f);
            free(old);
            if (bad)
                return cp_errf(err, errlen, "rank 0: %s (CPGEN_RENDEZVOUS_FILE) exists and is not a cpgen rendezvous "
                            "file: not replacing it; choose a path of its own", path);
        }
        cp_str s = {0};
        cp_str_printf(&s, "cpgen-rendezvous 1\njob %s\nsize %d\nbytes %zu\ndata ", job, size, n);
        for (size_t k = 0; k < n; k++) cp_str_printf(&s, "%02x", ((const unsigned char *)blob)[k]);
        cp_str_printf(&s, "\n");
        int rc = cp_write_file_atomic(path, s.data, s.len);
        int e = errno;
        cp_str_free(&s);
        if (rc)
            return cp_errf(err, errlen, "rank 0: cannot write the rendezvous file %s (CPGEN_RENDEZVOUS_FILE): %s; it "
                        "must be in an existing folder that this rank can write and every node can read", path,
                        strerror(e));
        return 0;
    }
    double deadline = cp_now() + timeout_s, wait = 0.02;
    char stale[256] = "";
    for (;;) {
        size_t len = 0;
        char why[256];
        char *text = cp_read_file_as(path, CP_FILE_STATE, &len, why, sizeof why);
        if (!text && errno != ENOENT && errno != ESTALE)
            return cp_errf(err, errlen, "rank %d: cannot read the rendezvous file %s: %s", rank, path, why);
        if (text) {
            rdv_file f;
            if (parse_rdv_file(text, &f)) {
                free(text);
                return cp_errf(err, errlen, "rank %d: %s (CPGEN_RENDEZVOUS_FILE) is not a cpgen rendezvous file: check "
                            "the path", rank, path);
            }
            if (strcmp(f.job, job) || f.size != size) {
                snprintf(stale, sizeof stale, "job %s, %d ranks", f.job, f.size);
            } else if (f.bytes != n) {
                free(text);
                return cp_errf(err, errlen, "rank %d: the rendezvous file %s holds %zu bytes, this rank expects %zu: every "
                            "rank must run the same cpgen build", rank, path, f.bytes, n);
            } else {
                int bad = unhex(f.hex, blob, n);
                free(text);
                if (bad) return cp_errf(err, errlen, "rank %d: the rendezvous file %s is damaged", rank, path);
                return 0;
            }
            free(text);
        }
        double left = deadline - cp_now();
        if (left <= 0) {
            if (stale[0])
                return cp_errf(err, errlen, "rank %d: the rendezvous file %s is from another run (%s; this run is job %s "
                            "with %d ranks), and rank 0 did not replace it within %.3g s: check that rank 0 started "
                            "and shares the folder; remove the old file, or give each run its own path", rank, path,
                            stale, job, size, timeout_s);
            return cp_errf(err, errlen, "rank %d: no rendezvous file at %s after %.3g s: rank 0 did not write it; check "
                        "that rank 0 started, and that the folder is shared between its node and this one", rank,
                        path, timeout_s);
        }
        sleep_s(wait < left ? wait : left);
        wait = wait * 1.5 < 0.5 ? wait * 1.5 : 0.5;
    }
}
