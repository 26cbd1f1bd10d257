/* test_link.c - the redundancy controller (PROTOCOL 14.5) alone: what it reads from the acks
 * and the RTT, and the mode it picks. The cases of tests/core/test_redundancy_controller.py
 * that apply to the controller itself; tests/clients/test_c_link.py checks it step for step
 * against relay_core's. */
#include "link.h"

#include <stdio.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)
#define NEAR(a, b) ((a) - (b) < 1e-9 && (b) - (a) < 1e-9)

/* relay_core's defaults (EndpointConfig). */
static void make(rc_link *s, uint32_t loss_memory)
{
    rc_link_init(s, loss_memory, 0.2, 0.05, 5.0, 10.0, 0.0);
}

/* xorshift32: a fixed, seeded loss pattern. */
static uint32_t rng_state;
static int lost_with(double p)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (rng_state >> 8) * (1.0 / 16777216.0) < p;
}

static void test_averages_start_as_plain_means(void)
{
    rc_link s;
    make(&s, 128);
    CHECK(s.mode == RC_LINK_LOSSY && rc_link_update(&s, 0.0) == RC_LINK_LOSSY);
    CHECK(NEAR(rc_link_burst_length(&s), 1.0));
    rc_link_judged(&s, 1);
    CHECK(NEAR(s.loss, 1.0) && NEAR(s.loss_after_loss, 0.0));
    rc_link_judged(&s, 0);
    CHECK(NEAR(s.loss, 0.5) && NEAR(s.loss_after_loss, 0.0));
    rc_link_judged(&s, 1);
    rc_link_judged(&s, 1);
    CHECK(NEAR(s.loss, 0.75) && NEAR(s.loss_after_loss, 0.5));     /* after a loss: 0, 1 */
    CHECK(NEAR(rc_link_burst_length(&s), 2.0));
}

static void test_independent_losses_are_lossy_and_runs_of_losses_are_bursty(void)
{
    rc_link independent, bursty;
    int i, k;
    make(&independent, 128);
    rng_state = 9;
    for (i = 0; i < 3000; i++)
        rc_link_judged(&independent, lost_with(0.1));
    CHECK(rc_link_update(&independent, 0.0) == RC_LINK_LOSSY);
    CHECK(independent.loss > 0.07 && independent.loss < 0.13);
    CHECK(rc_link_burst_length(&independent) < 1.3);

    /* The same average loss in runs of three: every loss is followed by two more. */
    make(&bursty, 128);
    for (i = 0; i < 100; i++)
        for (k = 0; k < 30; k++)
            rc_link_judged(&bursty, k < 3);
    CHECK(rc_link_update(&bursty, 0.0) == RC_LINK_BURSTY);
    CHECK(rc_link_burst_length(&bursty) > 2.5 && rc_link_burst_length(&bursty) <= 3.0);
}

static void test_heavy_independent_loss_is_not_taken_for_bursts(void)
{
    rc_link s;
    int i;
    make(&s, 128);
    rng_state = 8;
    for (i = 0; i < 3000; i++)
        rc_link_judged(&s, lost_with(0.4));
    CHECK(rc_link_update(&s, 0.0) == RC_LINK_LOSSY);
}

static void test_a_path_that_stops_losing_becomes_clean_after_loss_memory_datagrams(void)
{
    rc_link s;
    int i;
    make(&s, 32);
    rc_link_judged(&s, 1);
    rc_link_judged(&s, 0);
    rc_link_judged(&s, 0);
    rc_link_judged(&s, 1);
    for (i = 0; i < 31; i++)
        rc_link_judged(&s, 0);
    CHECK(rc_link_update(&s, 0.0) == RC_LINK_LOSSY);
    rc_link_judged(&s, 0);
    CHECK(rc_link_update(&s, 0.0) == RC_LINK_CLEAN && s.mode == RC_LINK_CLEAN);
    for (i = 0; i < 100; i++)
        rc_link_judged(&s, 0);
    CHECK(s.since_loss == 32);                                      /* capped at loss_memory */
    rc_link_judged(&s, 1);
    CHECK(rc_link_update(&s, 0.0) == RC_LINK_LOSSY);
}

static void test_a_filling_queue_is_congestion_and_jitter_or_a_long_path_is_not(void)
{
    rc_link s, long_path;
    int k;
    make(&s, 128);
    for (k = 0; k < 50; k++)                /* a 40 ms path with +-20 ms of jitter */
        rc_link_rtt(&s, 0.040 + (k % 5) * 0.01, 0.050, k * 0.03);
    CHECK(rc_link_update(&s, 1.5) != RC_LINK_CONGESTED && NEAR(s.min_rtt, 0.04));
    rc_link_rtt(&s, 0.200, 0.070, 1.6);     /* one late sample: a spike, not a queue */
    CHECK(rc_link_update(&s, 1.6) != RC_LINK_CONGESTED);
    rc_link_rtt(&s, 0.045, 0.060, 1.63);
    rc_link_rtt(&s, 0.180, 0.080, 1.66);    /* samples in a row well above the floor */
    CHECK(rc_link_update(&s, 1.66) != RC_LINK_CONGESTED);
    rc_link_rtt(&s, 0.190, 0.100, 1.69);
    CHECK(rc_link_update(&s, 1.7) == RC_LINK_CONGESTED && NEAR(s.queue_delay, 0.15));
    CHECK(s.congestion_episodes == 1);
    /* Congestion outranks a clean loss record. */
    s.since_loss = s.loss_memory;
    CHECK(rc_link_update(&s, 1.69 + 4.9) == RC_LINK_CONGESTED);
    /* Held congestion_hold after the last sign. */
    CHECK(rc_link_update(&s, 1.69 + 5.1) == RC_LINK_CLEAN);

    make(&long_path, 128);
    for (k = 0; k < 200; k++)               /* 340 +- 20 ms, steady */
        rc_link_rtt(&long_path, 0.330 + (k % 3) * 0.01, 0.340, k * 0.03);
    CHECK(rc_link_update(&long_path, 6.0) != RC_LINK_CONGESTED && NEAR(long_path.min_rtt, 0.33));
    CHECK(long_path.congestion_episodes == 0);
}

static void test_a_queue_longer_than_a_long_path_is_congestion(void)
{
    rc_link s;
    make(&s, 128);
    rc_link_rtt(&s, 0.200, 0.200, 0.0);
    rc_link_rtt(&s, 0.390, 0.224, 0.1);     /* 190 ms over a 200 ms floor: not yet a queue */
    rc_link_rtt(&s, 0.395, 0.245, 0.2);
    CHECK(rc_link_update(&s, 0.2) != RC_LINK_CONGESTED && s.high_samples == 0);
    rc_link_rtt(&s, 0.420, 0.270, 0.3);
    rc_link_rtt(&s, 0.430, 0.290, 0.4);
    CHECK(rc_link_update(&s, 0.4) == RC_LINK_CONGESTED);
}

static void test_the_rtt_floor_follows_a_path_that_got_longer_within_two_windows(void)
{
    rc_link s;
    int k;
    make(&s, 128);
    for (k = 0; k < 100; k++)
        rc_link_rtt(&s, 0.040, 0.040, k * 0.1);
    for (k = 100; k < 320; k++)
        rc_link_rtt(&s, 0.300, 0.300, k * 0.1);
    CHECK(NEAR(s.min_rtt, 0.3));
    CHECK(rc_link_update(&s, 32.0) != RC_LINK_CONGESTED || s.queue_delay < 0.05);
}

int main(void)
{
    test_averages_start_as_plain_means();
    test_independent_losses_are_lossy_and_runs_of_losses_are_bursty();
    test_heavy_independent_loss_is_not_taken_for_bursts();
    test_a_path_that_stops_losing_becomes_clean_after_loss_memory_datagrams();
    test_a_filling_queue_is_congestion_and_jitter_or_a_long_path_is_not();
    test_a_queue_longer_than_a_long_path_is_congestion();
    test_the_rtt_floor_follows_a_path_that_got_longer_within_two_windows();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
