/* link.c - the redundancy controller (PROTOCOL 14.5), as relay_core/redundancy.pyx. */
#include "link.h"

/* EWMA weights: the loss rate over ~64 judged datagrams; the loss rate after a loss over ~8
 * losses (a few seconds at a tick rate of 30 Hz and 10 % loss). */
#define LOSS_ALPHA (1.0 / 64.0)
#define AFTER_LOSS_ALPHA (1.0 / 8.0)
/* RTT samples in a row above the congestion threshold that make the path congested. */
#define CONGESTION_SAMPLES 2
#define JUDGED_CAP 1000000u

void rc_link_init(rc_link *s, uint32_t loss_memory, double burst_threshold,
                  double congestion_delay, double congestion_hold, double min_rtt_window,
                  double now)
{
    s->loss = 0.0;
    s->loss_after_loss = 0.0;
    s->previous_lost = 0;
    s->judged = 0;
    s->judged_after_loss = 0;
    /* A new connection has shown nothing yet: copies until it has proved clean. */
    s->since_loss = 0;
    s->min_rtt = -1.0;
    s->window_min = -1.0;
    s->window_start = now;
    s->queue_delay = 0.0;
    s->high_samples = 0;
    s->congested_until = -1.0;
    s->congestion_episodes = 0;
    s->mode = RC_LINK_LOSSY;
    s->loss_memory = loss_memory;
    s->burst_threshold = burst_threshold;
    s->congestion_delay = congestion_delay;
    s->congestion_hold = congestion_hold;
    s->min_rtt_window = min_rtt_window;
}

/* Each average is a plain mean until it has as many samples as its EWMA remembers, so the two
 * start out comparable (a slow loss rate beside a quick one would make any early loss look
 * bursty). */
void rc_link_judged(rc_link *s, int lost)
{
    double value = lost ? 1.0 : 0.0, weight;
    if (s->judged < JUDGED_CAP)
        s->judged++;
    weight = 1.0 / s->judged;
    s->loss += (weight > LOSS_ALPHA ? weight : LOSS_ALPHA) * (value - s->loss);
    if (s->previous_lost) {
        if (s->judged_after_loss < JUDGED_CAP)
            s->judged_after_loss++;
        weight = 1.0 / s->judged_after_loss;
        s->loss_after_loss += (weight > AFTER_LOSS_ALPHA ? weight : AFTER_LOSS_ALPHA)
                              * (value - s->loss_after_loss);
    }
    s->previous_lost = lost != 0;
    if (lost)
        s->since_loss = 0;
    else if (s->since_loss < s->loss_memory)
        s->since_loss++;
}

void rc_link_rtt(rc_link *s, double sample, double srtt, double now)
{
    double threshold;
    (void)srtt;                     /* as in relay_core: two high samples in a row stand for it */
    if (now - s->window_start >= s->min_rtt_window) {
        /* The floor forgets a path that got longer (a new route) within two windows. */
        if (s->window_min >= 0.0)
            s->min_rtt = s->window_min;
        s->window_min = -1.0;
        s->window_start = now;
    }
    if (s->window_min < 0.0 || sample < s->window_min)
        s->window_min = sample;
    if (s->min_rtt < 0.0 || sample < s->min_rtt)
        s->min_rtt = sample;
    s->queue_delay = sample - s->min_rtt;
    /* Jitter moves single samples around the floor; a filling queue lifts sample after sample
     * past both a fixed margin and the floor itself (a queue longer than the path). */
    threshold = s->congestion_delay > s->min_rtt ? s->congestion_delay : s->min_rtt;
    if (s->queue_delay <= threshold) {
        s->high_samples = 0;
        return;
    }
    s->high_samples++;
    if (s->high_samples >= CONGESTION_SAMPLES) {
        if (s->congested_until < now)
            s->congestion_episodes++;
        s->congested_until = now + s->congestion_hold;
    }
}

/* Congestion outranks loss: copies into a full queue only lengthen it. */
int rc_link_update(rc_link *s, double now)
{
    if (now < s->congested_until)
        s->mode = RC_LINK_CONGESTED;
    else if (s->since_loss >= s->loss_memory)
        s->mode = RC_LINK_CLEAN;
    else if (s->loss_after_loss - s->loss >= s->burst_threshold)
        s->mode = RC_LINK_BURSTY;
    else
        s->mode = RC_LINK_LOSSY;
    return s->mode;
}

/* 1 / (1 - P(lost after a loss)). */
double rc_link_burst_length(const rc_link *s)
{
    return s->loss_after_loss < 0.999 ? 1.0 / (1.0 - s->loss_after_loss) : 1000.0;
}
