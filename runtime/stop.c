/* stop.c: preemption's signal handlers (stop.h): the first stop signal sets a flag the training loop acts on at the
 * end of the step; a second SIGINT ends the process at once. Only async-signal-safe calls in the handlers. */
#include "stop.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t flag;
static volatile sig_atomic_t interrupts; /* SIGINTs received */
static int my_rank = -1;
static bool installed;
static struct sigaction old_term, old_usr1, old_int;

static void say(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;
}

static void on_signal(int sig) {
    if (sig == SIGINT && ++interrupts >= 2) {
        say("cpgen: a second SIGINT: aborting now, without a checkpoint of this step\n");
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
        return;
    }
    if (flag) return; /* stopping already */
    flag = sig;
    char line[256] = "cpgen: ";
    if (my_rank >= 0) { /* "rank N: ", by hand: snprintf is not async-signal-safe */
        char num[16];
        int k = 0, r = my_rank;
        do num[k++] = (char)('0' + r % 10); while ((r /= 10) && k < 15);
        strcat(line, "rank ");
        size_t at = strlen(line);
        while (k) line[at++] = num[--k];
        line[at] = 0;
        strcat(line, ": ");
    }
    strcat(line, sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "SIGINT");
    strcat(line, ": stopping after this step, with a checkpoint (Ctrl-C twice aborts at once)\n");
    say(line);
}

void cp_stop_install(int rank) {
    my_rank = rank;
    flag = 0;
    interrupts = 0;
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    sigaction(SIGINT, &sa, &old_int);
    installed = true;
}

void cp_stop_uninstall(void) {
    if (!installed) return;
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    sigaction(SIGINT, &old_int, NULL);
    installed = false;
}

const volatile sig_atomic_t *cp_stop_flag(void) { return &flag; }

void cp_stop_request(int sig) {
    if (!flag) flag = sig;
}

const char *cp_stop_signame(int sig, char *buf, int len) {
    const char *a = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (a) snprintf(buf, (size_t)len, "SIG%s", a);
    else snprintf(buf, (size_t)len, "signal %d", sig);
    return buf;
}
