/* test_checks.c: the GPU checks can fail, proven on a machine without a GPU. Runs tests/test_checks.sh, which drives
 * the check scripts and tools/check_common.sh's helpers with stand-ins for nvidia-smi and cpgen: without a GPU every
 * script says skipped and exits 77; compare fails a run cut short, over a bound or missing; run counts failures, time
 * limits and skips; whole scripts end 0, 1 or 77 as their runs deserve; tools/run-tests.sh counts passed, failed and
 * skipped tests. The test fails, with the script's output, unless every case held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sh.h"
#include "source_tree.h"

static void test_check_scripts(void **state) {
    (void)state;
    char *out;
    int rc = sh("bash tests/test_checks.sh", &out);
    if (rc != 0 || !strstr(out, "every case as it should be")) {
        print_message("%s", out);
        free(out);
        fail_msg("tests/test_checks.sh exited %d: a check gives the wrong verdict (its FAIL lines above)", rc);
    }
    int cases = 0;
    for (const char *p = out; (p = strstr(p, "\nok   ")); p++) cases++;
    print_message("%d cases of the GPU checks' verdicts hold\n", cases + !strncmp(out, "ok   ", 5));
    free(out);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/test_checks.sh");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_check_scripts)};
    return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
}
