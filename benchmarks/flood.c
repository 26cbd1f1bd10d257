/*
 * flood.c - a loopback flooder for benchmarks/attack.py: forged datagrams from many source
 * addresses at the highest rate one thread can send (or a fixed rate), bounded in time and count.
 *
 * Sources: every socket is bound to 0.0.0.0:<ephemeral> (or to --source-ip for the lockout
 * scenario) with IP_PKTINFO; each datagram carries an in_pktinfo cmsg whose ipi_spec_dst is a
 * random 127.a.b.c, so on loopback the relay sees thousands of distinct sources without root.
 *
 * Datagrams: each --datagram HEX:OFFSET:LENGTH is a template (a real packet of the protocol,
 * from tests/vectors) whose bytes [OFFSET, OFFSET+LENGTH) are randomized per datagram (connect
 * ids, cookies, session ids); the templates are sent in turn.
 *
 *   flood --port P [--host 127.0.0.1] --seconds S [--rate PPS] [--max-datagrams N]
 *         [--source-ip A.B.C.D] [--sockets K] --datagram HEX:OFF:LEN ...
 *
 * Prints one JSON line: {"sent": n, "errors": n, "seconds": s, "rate": pps}. Only loopback
 * targets are accepted.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define MAX_TEMPLATES 16
#define MAX_DATAGRAM 1200
#define MAX_SOCKETS 64

typedef struct {
    uint8_t bytes[MAX_DATAGRAM];
    size_t size, random_offset, random_length;
} template_t;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_random(void)
{
    /* xorshift64*: fast, and the flood needs variety, not quality. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static double monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_template(const char *arg, template_t *t)
{
    const char *colon = strchr(arg, ':');
    size_t hex_length = colon ? (size_t)(colon - arg) : strlen(arg);
    if (!colon || hex_length % 2 || hex_length / 2 > MAX_DATAGRAM || hex_length == 0)
        return -1;
    for (size_t i = 0; i < hex_length / 2; i++) {
        unsigned value;
        if (sscanf(arg + 2 * i, "%2x", &value) != 1)
            return -1;
        t->bytes[i] = (uint8_t)value;
    }
    t->size = hex_length / 2;
    if (sscanf(colon + 1, "%zu:%zu", &t->random_offset, &t->random_length) != 2 ||
        t->random_offset + t->random_length > t->size)
        return -1;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: flood --port P --seconds S [--host 127.x.y.z] [--rate PPS] [--max-datagrams N]\n"
                    "             [--source-ip A.B.C.D] [--sockets K] [--seed N] --datagram HEX:OFFSET:LENGTH ...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static template_t templates[MAX_TEMPLATES];
    int template_count = 0, port = 0, socket_count = 16;
    double seconds = 0, rate = 0;
    long long max_datagrams = 100000000LL;
    const char *host = "127.0.0.1", *source_ip = NULL;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            usage();
        if (!strcmp(argv[i], "--port"))
            port = atoi(value);
        else if (!strcmp(argv[i], "--host"))
            host = value;
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(value);
        else if (!strcmp(argv[i], "--rate"))
            rate = atof(value);
        else if (!strcmp(argv[i], "--max-datagrams"))
            max_datagrams = atoll(value);
        else if (!strcmp(argv[i], "--source-ip"))
            source_ip = value;
        else if (!strcmp(argv[i], "--sockets"))
            socket_count = atoi(value);
        else if (!strcmp(argv[i], "--seed"))
            rng_state ^= (uint64_t)strtoull(value, NULL, 10) * 0xD1B54A32D192ED03ull;
        else if (!strcmp(argv[i], "--datagram")) {
            if (template_count == MAX_TEMPLATES || parse_template(value, &templates[template_count]) < 0) {
                fprintf(stderr, "flood: bad --datagram %.60s (HEX:OFFSET:LENGTH, at most %d)\n", value,
                        MAX_TEMPLATES);
                return 2;
            }
            template_count++;
        } else
            usage();
        i++;
    }
    struct sockaddr_in target = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port <= 0 || port > 65535 || seconds <= 0 || seconds > 600 || template_count == 0 ||
        socket_count < 1 || socket_count > MAX_SOCKETS || inet_pton(AF_INET, host, &target.sin_addr) != 1)
        usage();
    if ((ntohl(target.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "flood: only loopback targets (127.0.0.0/8)\n");
        return 2;
    }
    struct in_addr fixed_source = {0};
    if (source_ip && (inet_pton(AF_INET, source_ip, &fixed_source) != 1 ||
                      (ntohl(fixed_source.s_addr) >> 24) != 127)) {
        fprintf(stderr, "flood: --source-ip must be a 127.x.y.z address\n");
        return 2;
    }

    int sockets[MAX_SOCKETS];
    for (int s = 0; s < socket_count; s++) {
        struct sockaddr_in local = {.sin_family = AF_INET};
        local.sin_addr.s_addr = source_ip ? fixed_source.s_addr : htonl(INADDR_ANY);
        sockets[s] = socket(AF_INET, SOCK_DGRAM, 0);
        if (sockets[s] < 0 || bind(sockets[s], (struct sockaddr *)&local, sizeof local) < 0) {
            perror("flood: socket");
            return 1;
        }
        int on = 1;
        setsockopt(sockets[s], IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
    }

    static uint8_t buffers[BATCH][MAX_DATAGRAM];
    static union {
        char space[CMSG_SPACE(sizeof(struct in_pktinfo))];
        struct cmsghdr align;
    } controls[BATCH];
    struct mmsghdr messages[BATCH];
    struct iovec vectors[BATCH];
    long long sent = 0, errors = 0;
    size_t next_template = 0;
    int next_socket = 0;
    double start = monotonic(), deadline = start + seconds;
    while (sent < max_datagrams) {
        double now = monotonic();
        if (now >= deadline)
            break;
        int batch = BATCH;
        if (rate > 0) {
            /* Paced: send what the rate allows by now, then sleep a little. */
            long long due = (long long)((now - start) * rate) - sent;
            if (due <= 0) {
                struct timespec pause = {0, 200000};
                nanosleep(&pause, NULL);
                continue;
            }
            if (due < batch)
                batch = (int)due;
        }
        if (max_datagrams - sent < batch)
            batch = (int)(max_datagrams - sent);
        for (int i = 0; i < batch; i++) {
            const template_t *t = &templates[next_template];
            next_template = (next_template + 1) % (size_t)template_count;
            memcpy(buffers[i], t->bytes, t->size);
            for (size_t k = 0; k < t->random_length; k += 8) {
                uint64_t r = next_random();
                size_t n = t->random_length - k < 8 ? t->random_length - k : 8;
                memcpy(buffers[i] + t->random_offset + k, &r, n);
            }
            vectors[i] = (struct iovec){buffers[i], t->size};
            messages[i].msg_hdr = (struct msghdr){.msg_name = &target, .msg_namelen = sizeof target,
                                                  .msg_iov = &vectors[i], .msg_iovlen = 1};
            if (!source_ip) {
                struct cmsghdr *cmsg = (struct cmsghdr *)controls[i].space;
                cmsg->cmsg_level = IPPROTO_IP;
                cmsg->cmsg_type = IP_PKTINFO;
                cmsg->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
                struct in_pktinfo info = {0};
                uint32_t r = (uint32_t)next_random();
                /* 127.a.b.c with a >= 100 and c >= 1: clear of the 127.0.0.x the players use. */
                info.ipi_spec_dst.s_addr = htonl(0x7F000000u | ((100u + r % 150u) << 16) |
                                                 (((r >> 8) & 0xFFu) << 8) | (1u + (r >> 16) % 254u));
                memcpy(CMSG_DATA(cmsg), &info, sizeof info);
                messages[i].msg_hdr.msg_control = controls[i].space;
                messages[i].msg_hdr.msg_controllen = sizeof controls[i].space;
            }
        }
        int done = sendmmsg(sockets[next_socket], messages, (unsigned)batch, 0);
        next_socket = (next_socket + 1) % socket_count;
        if (done < 0) {
            if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR && errno != ECONNREFUSED) {
                perror("flood: sendmmsg");
                return 1;
            }
            errors++;
            continue;
        }
        sent += done;
    }
    double elapsed = monotonic() - start;
    printf("{\"sent\": %lld, \"errors\": %lld, \"seconds\": %.3f, \"rate\": %.0f}\n", sent, errors, elapsed,
           elapsed > 0 ? sent / elapsed : 0.0);
    return 0;
}
