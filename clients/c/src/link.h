/* link.h - the redundancy controller (PROTOCOL 14.5): what the acks and the RTT say about the
 * path, and so how the stream channel copies (PROTOCOL 11.3, 12.4). A plain struct inside the
 * connection, no storage of its own; the rules and constants are relay_core/redundancy.pyx's,
 * so a C client and the relay read the same path the same way. */
#ifndef RC_LINK_H
#define RC_LINK_H

#include <stdint.h>

/* The modes, first match (the values are relay_client_stats_t.redundancy_mode's). */
enum {
    RC_LINK_CLEAN = 0,              /* no recent loss: no copies */
    RC_LINK_LOSSY = 1,              /* losses independent of each other: a copy in the next
                                     * datagram, later ones only where an ack is overdue */
    RC_LINK_BURSTY = 2,             /* losses come in runs: every datagram carries every unacked
                                     * message until acked */
    RC_LINK_CONGESTED = 3           /* the RTT stands above the path's floor: a queue is filling,
                                     * copies would only lengthen it */
};

typedef struct rc_link {
    /* Loss pattern: our datagrams as the acks judge them, in send order. */
    double loss;                    /* EWMA of "lost" over every judged datagram */
    double loss_after_loss;         /* the same over datagrams judged right after a lost one */
    int previous_lost;
    uint32_t judged;                /* judged so far (capped), for the averages' plain-mean start */
    uint32_t judged_after_loss;
    uint32_t since_loss;            /* judged received in a row since the last one lost */
    /* Delay: the path's floor, and how far samples stand above it. */
    double min_rtt;                 /* least sample of this window and the last (-1: none yet) */
    double window_min;              /* least sample of the current window (-1: none yet) */
    double window_start;
    double queue_delay;             /* the last sample over min_rtt, seconds */
    int high_samples;               /* samples in a row whose queue_delay passed the threshold */
    double congested_until;         /* congested mode holds until then */
    uint64_t congestion_episodes;
    int mode;                       /* RC_LINK_*: as of the last rc_link_update */
    /* Settings (rc_conn_config). */
    uint32_t loss_memory;
    double burst_threshold, congestion_delay, congestion_hold, min_rtt_window;
} rc_link;

void rc_link_init(rc_link *s, uint32_t loss_memory, double burst_threshold,
                  double congestion_delay, double congestion_hold, double min_rtt_window,
                  double now);
/* One of our datagrams judged by the acks (in send order): lost (1) or received (0). */
void rc_link_judged(rc_link *s, int lost);
/* An RTT sample, and the smoothed RTT after it. */
void rc_link_rtt(rc_link *s, double sample, double srtt, double now);
/* The mode for now, also kept in s->mode. */
int rc_link_update(rc_link *s, double now);
/* Mean run of lost datagrams the estimate implies (1: losses independent of each other). */
double rc_link_burst_length(const rc_link *s);

#endif
