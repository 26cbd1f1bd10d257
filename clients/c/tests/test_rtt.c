/* test_rtt.c - RFC 6298 estimator with the peer's ack delay (PROTOCOL 11.2). */
#include "rtt.h"

#include <stdio.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)
#define NEAR(a, b) ((a) - (b) < 1e-9 && (b) - (a) < 1e-9)

static void test_initial_rto_is_clamped(void)
{
    rc_rtt r;
    rc_rtt_init(&r, 0.2, 0.03, 1.0);
    CHECK(NEAR(r.rto, 0.2) && !r.has_sample);
    rc_rtt_init(&r, 5.0, 0.03, 1.0);
    CHECK(NEAR(r.rto, 1.0));
}

static void test_first_and_later_samples(void)
{
    rc_rtt r;
    rc_rtt_init(&r, 0.2, 0.03, 1.0);
    rc_rtt_sample(&r, 0.1, 0.005);
    CHECK(NEAR(r.srtt, 0.1) && NEAR(r.rttvar, 0.05) && NEAR(r.rto, 0.1 + 0.2 + 0.005));
    rc_rtt_sample(&r, 0.2, 0.005);
    CHECK(NEAR(r.rttvar, 0.75 * 0.05 + 0.25 * 0.1));
    CHECK(NEAR(r.srtt, 0.875 * 0.1 + 0.125 * 0.2));
}

static void test_variance_floor_and_bounds(void)
{
    rc_rtt r;
    int i;
    rc_rtt_init(&r, 0.2, 0.03, 1.0);
    for (i = 0; i < 200; i++)
        rc_rtt_sample(&r, 0.05, 0.0);
    CHECK(r.rto >= 0.05 + 0.002 - 1e-9 && r.rto < 0.06);
    for (i = 0; i < 200; i++)
        rc_rtt_sample(&r, 0.001, 0.0);
    CHECK(NEAR(r.rto, 0.03));
    rc_rtt_sample(&r, 59.0, 0.0);
    CHECK(NEAR(r.rto, 1.0));
}

int main(void)
{
    test_initial_rto_is_clamped();
    test_first_and_later_samples();
    test_variance_floor_and_bounds();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
