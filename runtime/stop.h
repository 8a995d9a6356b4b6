/* stop.h: preemption. SIGTERM or SIGUSR1 (a scheduler's warning: Slurm's --signal) or a first SIGINT (Ctrl-C) asks a
 * training process to stop in order: it finishes the step it is in, saves a checkpoint, waits for the write and exits
 * with CP_EXIT_STOPPED. A second SIGINT aborts at once. The request is a flag that the executor reads at the end of
 * every step and carries in the all-reduce every rank does there (exec.h cp_exec_opts.stop_request), so a signal
 * reaching any rank stops every rank after the same step. */
#ifndef CP_STOP_H
#define CP_STOP_H

#include <signal.h>
#include <stdbool.h>

/* The exit status of a run that stopped in order when asked to (sysexits' EX_TEMPFAIL: try again later): it saved
 * its checkpoint, and `cpgen run ... --resume OUT_DIR` continues it. */
#define CP_EXIT_STOPPED 75

/* Install the handlers for this process (a training process: one rank, or the only one); rank names it in the line
 * it prints when a signal comes (-1: none). The flag is 0 until a stop is asked for, then that signal's number. */
void cp_stop_install(int rank);
/* Put back the handlers there were before cp_stop_install. */
void cp_stop_uninstall(void);
const volatile sig_atomic_t *cp_stop_flag(void);
/* For tests: ask as a signal would (without printing). */
void cp_stop_request(int sig);

/* "SIGTERM" for 15; "signal N" for one without an abbreviation. */
const char *cp_stop_signame(int sig, char *buf, int len);

#endif
