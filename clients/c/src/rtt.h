/* rtt.h - RTT estimate and RTO (PROTOCOL 11.2, RFC 6298 gains). */
#ifndef RC_RTT_H
#define RC_RTT_H

typedef struct rc_rtt {
    double srtt, rttvar, rto;
    double rto_min, rto_max;
    int has_sample;
} rc_rtt;

void rc_rtt_init(rc_rtt *rtt, double rto_initial, double rto_min, double rto_max);
/* One sample r (seconds); peer_ack_delay: the peer's announced ack delay (seconds). */
void rc_rtt_sample(rc_rtt *rtt, double r, double peer_ack_delay);

#endif
