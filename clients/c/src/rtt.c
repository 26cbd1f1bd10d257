/* rtt.c - PROTOCOL 11.2. */
#include "rtt.h"

static double clamp(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

void rc_rtt_init(rc_rtt *rtt, double rto_initial, double rto_min, double rto_max)
{
    rtt->srtt = 0.0;
    rtt->rttvar = 0.0;
    rtt->rto_min = rto_min;
    rtt->rto_max = rto_max;
    rtt->rto = clamp(rto_initial, rto_min, rto_max);
    rtt->has_sample = 0;
}

void rc_rtt_sample(rc_rtt *rtt, double r, double peer_ack_delay)
{
    double var;
    if (!rtt->has_sample) {
        rtt->srtt = r;
        rtt->rttvar = r / 2.0;
        rtt->has_sample = 1;
    } else {
        double delta = rtt->srtt - r;
        if (delta < 0)
            delta = -delta;
        rtt->rttvar = 0.75 * rtt->rttvar + 0.25 * delta;
        rtt->srtt = 0.875 * rtt->srtt + 0.125 * r;
    }
    var = 4.0 * rtt->rttvar;
    if (var < 0.002)
        var = 0.002;
    rtt->rto = clamp(rtt->srtt + var + peer_ack_delay, rtt->rto_min, rtt->rto_max);
}
