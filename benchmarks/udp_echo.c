/*
 * udp_echo.c: the machine's UDP ceiling for benchmarks/capacity.py.
 *
 * A recvmmsg/sendmmsg echo on loopback, and a closed-loop load for it, both in plain C so that
 * neither Python nor the relay's logic is in the way: what one core can echo is the most a
 * relay could ever forward on it.
 *
 *   udp_echo serve [--port P] [--seconds S] [--batch B] [--reply-size N]
 *       Binds 127.0.0.1:P (0: any free port) and prints "READY <port>". Every datagram is
 *       answered to its sender, N bytes long (0: as long as the request; a longer reply is the
 *       request padded with zeros), batches of up to B (default 64) each way. Exits after S
 *       seconds (default 60, at most 600) or on SIGTERM/SIGINT, printing one JSON line:
 *       echoes, bytes in and out, its CPU seconds.
 *
 *   udp_echo load [--port P] [--sockets K] [--window W] [--size N] [--seconds T] [--warmup U]
 *       K sockets (default 32), each keeping W datagrams of N bytes (defaults 8, 64) in flight:
 *       every reply is answered with a new request. After U seconds (default 0.5) it prints
 *       "WINDOW" and counts for T seconds (default 3, at most 120), then prints one JSON line:
 *       echoes received in the window, echoes/s, datagrams lost (a socket that hears nothing
 *       for 200 ms has lost its window and is re-primed), replies that did not come from the
 *       socket's own requests (corrupt), and its own CPU seconds.
 *
 *   udp_echo load --sources N [--sockets K] [--window W] ...
 *       The same with the address mix of benchmarks/loadgen_c: N flows, each sending from its
 *       own source address 127.a.b.c (IP_PKTINFO, as loadgen_c's players), spread over K
 *       sockets (default 8) bound to 0.0.0.0, each flow keeping W requests (default 1) in
 *       flight. The echo then answers as many distinct peers as a relay serving N players,
 *       and the kernel's work per datagram grows with them.
 *
 * Loopback only: both ends use 127.0.0.1. Build: cc -O2 -o udp_echo udp_echo.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCH 256
#define BUF_SIZE 2048
#define MAGIC 0x4F484345u /* "ECHO" */

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(double *user, double *sys) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    *sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    return *user + *sys;
}

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return fallback;
}

static void big_buffers(int fd) {
    int size = 4 * 1024 * 1024;
    /* SO_RCVBUFFORCE needs CAP_NET_ADMIN; fall back to what rmem_max allows. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

static int serve(int argc, char **argv) {
    int port = atoi(arg(argc, argv, "--port", "0"));
    double seconds = atof(arg(argc, argv, "--seconds", "60"));
    int batch = atoi(arg(argc, argv, "--batch", "64"));
    int reply_size = atoi(arg(argc, argv, "--reply-size", "0"));
    if (seconds <= 0 || seconds > 600) seconds = 600;
    if (batch < 1) batch = 1;
    if (batch > MAX_BATCH) batch = MAX_BATCH;
    if (reply_size < 0 || reply_size > BUF_SIZE) reply_size = 0;

    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { perror("socket"); return 2; }
    big_buffers(fd);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { perror("bind"); return 2; }
    socklen_t len = sizeof addr;
    getsockname(fd, (struct sockaddr *)&addr, &len);
    struct timeval tv = {0, 100000}; /* wake up every 100 ms to check the deadline */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    static char bufs[MAX_BATCH][BUF_SIZE];
    static struct sockaddr_in peers[MAX_BATCH];
    static struct iovec iov[MAX_BATCH];
    static struct mmsghdr msgs[MAX_BATCH];
    memset(bufs, 0, sizeof bufs);

    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    printf("READY %d\n", ntohs(addr.sin_port));
    fflush(stdout);

    unsigned long long echoes = 0, bytes_in = 0, bytes_out = 0, send_errors = 0, calls = 0;
    double started = now_s(), deadline = started + seconds;
    while (!stop_requested && now_s() < deadline) {
        for (int i = 0; i < batch; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = BUF_SIZE;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &peers[i];
            msgs[i].msg_hdr.msg_namelen = sizeof peers[i];
            msgs[i].msg_hdr.msg_control = NULL;
            msgs[i].msg_hdr.msg_controllen = 0;
            msgs[i].msg_hdr.msg_flags = 0;
        }
        int n = recvmmsg(fd, msgs, (unsigned)batch, MSG_WAITFORONE, NULL);
        if (n <= 0) {
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                perror("recvmmsg");
                return 2;
            }
            continue;
        }
        calls++;
        for (int i = 0; i < n; i++) {
            unsigned got = msgs[i].msg_len;
            bytes_in += got;
            iov[i].iov_len = reply_size > 0 ? (size_t)reply_size : got;
            if (reply_size > (int)got) memset(bufs[i] + got, 0, (size_t)reply_size - got);
            msgs[i].msg_hdr.msg_flags = 0;
        }
        int done = 0;
        while (done < n) {
            int sent = sendmmsg(fd, msgs + done, (unsigned)(n - done), 0);
            if (sent < 0) {
                if (errno == EINTR) continue;
                send_errors++;
                done++; /* skip the datagram that failed, as UDP would lose it */
                continue;
            }
            for (int i = done; i < done + sent; i++) bytes_out += iov[i].iov_len;
            echoes += (unsigned long long)sent;
            done += sent;
        }
    }
    double user, sys;
    cpu_s(&user, &sys);
    printf("{\"echoes\": %llu, \"bytes_in\": %llu, \"bytes_out\": %llu, \"send_errors\": %llu, "
           "\"recv_calls\": %llu, \"cpu_user\": %.3f, \"cpu_sys\": %.3f, \"wall\": %.3f}\n",
           echoes, bytes_in, bytes_out, send_errors, calls, user, sys, now_s() - started);
    fflush(stdout);
    close(fd);
    return 0;
}

/* Point msgs[0..MAX_BATCH) at the receive buffers in[], with a control buffer each (of
 * control_size bytes from controls) when controls is not NULL, for one recvmmsg. */
static void arm_receive(struct mmsghdr *msgs, struct iovec *iov, char (*in)[BUF_SIZE],
                        char *controls, size_t control_size) {
    for (int i = 0; i < MAX_BATCH; i++) {
        iov[i].iov_base = in[i];
        iov[i].iov_len = BUF_SIZE;
        memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        if (controls) {
            msgs[i].msg_hdr.msg_control = controls + i * control_size;
            msgs[i].msg_hdr.msg_controllen = control_size;
        }
    }
}

static int load(int argc, char **argv) {
    int port = atoi(arg(argc, argv, "--port", "0"));
    int nsock = atoi(arg(argc, argv, "--sockets", "32"));
    int window = atoi(arg(argc, argv, "--window", "8"));
    int size = atoi(arg(argc, argv, "--size", "64"));
    double seconds = atof(arg(argc, argv, "--seconds", "3"));
    double warmup = atof(arg(argc, argv, "--warmup", "0.5"));
    if (port <= 0 || port > 65535) { fprintf(stderr, "load: --port is required\n"); return 2; }
    if (nsock < 1) nsock = 1;
    if (nsock > 1024) nsock = 1024;
    if (window < 1) window = 1;
    if (window > MAX_BATCH) window = MAX_BATCH;
    if (size < 8) size = 8;
    if (size > BUF_SIZE) size = BUF_SIZE;
    if (seconds <= 0 || seconds > 120) seconds = 120;
    if (warmup < 0 || warmup > 30) warmup = 0;

    struct sockaddr_in server = {0};
    server.sin_family = AF_INET;
    server.sin_port = htons((uint16_t)port);
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    int ep = epoll_create1(0);
    int *fds = calloc((size_t)nsock, sizeof(int));
    double *last_heard = calloc((size_t)nsock, sizeof(double));
    long *outstanding = calloc((size_t)nsock, sizeof(long));
    if (!fds || !last_heard || !outstanding || ep < 0) { perror("setup"); return 2; }

    static char out[MAX_BATCH][BUF_SIZE];
    static char in[MAX_BATCH][BUF_SIZE];
    static struct iovec oiov[MAX_BATCH], iiov[MAX_BATCH];
    static struct mmsghdr omsg[MAX_BATCH], imsg[MAX_BATCH];
    memset(out, 0, sizeof out);

    double t0 = now_s();
    for (int s = 0; s < nsock; s++) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0) { perror("socket"); return 2; }
        big_buffers(fd);
        if (connect(fd, (struct sockaddr *)&server, sizeof server) != 0) { perror("connect"); return 2; }
        fds[s] = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)s};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        last_heard[s] = t0;
    }

    /* Send `count` requests on socket s. */
#define SEND_REQUESTS(s, count)                                                              \
    do {                                                                                     \
        int want_ = (count), done_ = 0;                                                      \
        for (int i_ = 0; i_ < want_; i_++) {                                                 \
            uint32_t head_[2] = {MAGIC, (uint32_t)(s)};                                      \
            memcpy(out[i_], head_, sizeof head_);                                            \
            oiov[i_].iov_base = out[i_];                                                     \
            oiov[i_].iov_len = (size_t)size;                                                 \
            memset(&omsg[i_], 0, sizeof omsg[i_]);                                           \
            omsg[i_].msg_hdr.msg_iov = &oiov[i_];                                            \
            omsg[i_].msg_hdr.msg_iovlen = 1;                                                 \
        }                                                                                    \
        while (done_ < want_) {                                                              \
            int r_ = sendmmsg(fds[s], omsg + done_, (unsigned)(want_ - done_), 0);           \
            if (r_ < 0) {                                                                    \
                if (errno == EINTR) continue;                                                \
                break; /* EAGAIN or an ICMP error: those requests are lost */                \
            }                                                                                \
            done_ += r_;                                                                     \
            sent_total += (unsigned long long)r_;                                            \
        }                                                                                    \
        outstanding[s] += done_;                                                             \
    } while (0)

    unsigned long long sent_total = 0, received = 0, corrupt = 0, lost = 0;
    unsigned long long window_received = 0, window_lost = 0, window_corrupt = 0;
    for (int s = 0; s < nsock; s++) SEND_REQUESTS(s, window);

    double window_start = t0 + warmup, window_end = window_start + seconds;
    int in_window = 0;
    double cpu_at_start = 0, user, sys;
    struct epoll_event events[1024];
    for (;;) {
        double now = now_s();
        if (!in_window && now >= window_start) {
            in_window = 1;
            window_received = received;
            window_lost = lost;
            window_corrupt = corrupt;
            cpu_at_start = cpu_s(&user, &sys);
            printf("WINDOW\n");
            fflush(stdout);
        }
        if (now >= window_end) break;
        int n = epoll_wait(ep, events, 1024, 10);
        now = now_s();
        for (int e = 0; e < n; e++) {
            int s = (int)events[e].data.u32;
            arm_receive(imsg, iiov, in, NULL, 0);
            int got = recvmmsg(fds[s], imsg, MAX_BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0) continue;
            int good = 0;
            for (int i = 0; i < got; i++) {
                uint32_t head[2] = {0, 0};
                if (imsg[i].msg_len >= 8) memcpy(head, in[i], sizeof head);
                if (head[0] == MAGIC && head[1] == (uint32_t)s) good++;
                else corrupt++;
            }
            received += (unsigned long long)good;
            outstanding[s] -= got;
            if (outstanding[s] < 0) outstanding[s] = 0;
            last_heard[s] = now;
            SEND_REQUESTS(s, got);
        }
        /* A socket that heard nothing for 200 ms lost its requests: count them, start again. */
        for (int s = 0; s < nsock; s++) {
            if (now - last_heard[s] > 0.2) {
                lost += (unsigned long long)outstanding[s];
                outstanding[s] = 0;
                last_heard[s] = now;
                SEND_REQUESTS(s, window);
            }
        }
    }
    double cpu = cpu_s(&user, &sys) - cpu_at_start;
    unsigned long long echoes = received - window_received;
    printf("{\"echoes\": %llu, \"seconds\": %.3f, \"echoes_per_s\": %.1f, \"lost\": %llu, "
           "\"corrupt\": %llu, \"sent\": %llu, \"sockets\": %d, \"window\": %d, \"size\": %d, "
           "\"load_cpu\": %.3f}\n",
           echoes, seconds, echoes / seconds, lost - window_lost, corrupt - window_corrupt,
           sent_total, nsock, window, size, cpu);
    fflush(stdout);
    return 0;
}

/* loadgen_c's player_address: flow i sends from 127.a.b.c. */
static uint32_t flow_address(uint32_t index) {
    uint32_t c = 1 + index % 254, rest = index / 254;
    return (127u << 24) | ((1 + rest / 256) << 16) | ((rest % 256) << 8) | c;
}

static int load_sources(int argc, char **argv, int nflows) {
    int port = atoi(arg(argc, argv, "--port", "0"));
    int nsock = atoi(arg(argc, argv, "--sockets", "8"));
    int window = atoi(arg(argc, argv, "--window", "1"));
    int size = atoi(arg(argc, argv, "--size", "64"));
    double seconds = atof(arg(argc, argv, "--seconds", "3"));
    double warmup = atof(arg(argc, argv, "--warmup", "0.5"));
    if (port <= 0 || port > 65535) { fprintf(stderr, "load: --port is required\n"); return 2; }
    if (nflows > 65000) nflows = 65000;
    if (nsock < 1) nsock = 1;
    if (nsock > 64) nsock = 64;
    if (window < 1) window = 1;
    if (window > 16) window = 16;
    if (size < 8) size = 8;
    if (size > BUF_SIZE) size = BUF_SIZE;
    if (seconds <= 0 || seconds > 120) seconds = 120;
    if (warmup < 0 || warmup > 30) warmup = 0;

    struct sockaddr_in server = {0};
    server.sin_family = AF_INET;
    server.sin_port = htons((uint16_t)port);
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    int ep = epoll_create1(0);
    int *fds = calloc((size_t)nsock, sizeof(int));
    double *last_heard = calloc((size_t)nsock, sizeof(double));
    long *outstanding = calloc((size_t)nsock, sizeof(long));
    if (!fds || !last_heard || !outstanding || ep < 0) { perror("setup"); return 2; }

    static char out[MAX_BATCH][BUF_SIZE];
    static char in[MAX_BATCH][BUF_SIZE];
    static struct iovec oiov[MAX_BATCH], iiov[MAX_BATCH];
    static struct mmsghdr omsg[MAX_BATCH], imsg[MAX_BATCH];
    static union { char bytes[CMSG_SPACE(sizeof(struct in_pktinfo))]; struct cmsghdr align; } ctl[MAX_BATCH];
    static union { char bytes[CMSG_SPACE(sizeof(struct in_pktinfo))]; struct cmsghdr align; } ictl[MAX_BATCH];
    memset(out, 0, sizeof out);

    double t0 = now_s();
    for (int s = 0; s < nsock; s++) {
        int on = 1, big = 8 << 20;
        struct sockaddr_in any = {0};
        any.sin_family = AF_INET;
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on) != 0) {
            perror("socket with IP_PKTINFO"); return 2;
        }
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) != 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
        if (bind(fd, (struct sockaddr *)&any, sizeof any) != 0) { perror("bind"); return 2; }
        fds[s] = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)s};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        last_heard[s] = t0;
    }

    unsigned long long sent_total = 0, received = 0, corrupt = 0, lost = 0;
    /* Send one request for each of the `count` flows in flows[] on socket s. */
    uint32_t flows[MAX_BATCH];
#define SEND_FLOWS(s, count)                                                                 \
    do {                                                                                     \
        int want_ = (count), done_ = 0;                                                      \
        for (int i_ = 0; i_ < want_; i_++) {                                                 \
            uint32_t head_[2] = {MAGIC, flows[i_]};                                          \
            struct cmsghdr *c_;                                                              \
            struct in_pktinfo info_;                                                         \
            memcpy(out[i_], head_, sizeof head_);                                            \
            oiov[i_].iov_base = out[i_];                                                     \
            oiov[i_].iov_len = (size_t)size;                                                 \
            memset(&omsg[i_], 0, sizeof omsg[i_]);                                           \
            omsg[i_].msg_hdr.msg_name = &server;                                             \
            omsg[i_].msg_hdr.msg_namelen = sizeof server;                                    \
            omsg[i_].msg_hdr.msg_iov = &oiov[i_];                                            \
            omsg[i_].msg_hdr.msg_iovlen = 1;                                                 \
            omsg[i_].msg_hdr.msg_control = ctl[i_].bytes;                                    \
            omsg[i_].msg_hdr.msg_controllen = sizeof ctl[i_].bytes;                          \
            c_ = CMSG_FIRSTHDR(&omsg[i_].msg_hdr);                                           \
            c_->cmsg_level = IPPROTO_IP;                                                     \
            c_->cmsg_type = IP_PKTINFO;                                                      \
            c_->cmsg_len = CMSG_LEN(sizeof info_);                                           \
            memset(&info_, 0, sizeof info_);                                                 \
            info_.ipi_spec_dst.s_addr = htonl(flow_address(flows[i_]));                      \
            memcpy(CMSG_DATA(c_), &info_, sizeof info_);                                     \
        }                                                                                    \
        while (done_ < want_) {                                                              \
            int r_ = sendmmsg(fds[s], omsg + done_, (unsigned)(want_ - done_), 0);           \
            if (r_ < 0) {                                                                    \
                if (errno == EINTR) continue;                                                \
                break; /* EAGAIN or an ICMP error: those requests are lost */                \
            }                                                                                \
            done_ += r_;                                                                     \
            sent_total += (unsigned long long)r_;                                            \
        }                                                                                    \
        outstanding[s] += done_;                                                             \
    } while (0)
    /* Every flow of socket s (flow f belongs to socket f % nsock), window requests each. */
#define PRIME(s)                                                                             \
    do {                                                                                     \
        int n_ = 0;                                                                          \
        for (int f_ = (s); f_ < nflows; f_ += nsock) {                                       \
            for (int w_ = 0; w_ < window; w_++) {                                            \
                flows[n_++] = (uint32_t)f_;                                                  \
                if (n_ == MAX_BATCH) { SEND_FLOWS(s, n_); n_ = 0; }                          \
            }                                                                                \
        }                                                                                    \
        if (n_) SEND_FLOWS(s, n_);                                                           \
    } while (0)

    unsigned long long window_received = 0, window_lost = 0, window_corrupt = 0;
    for (int s = 0; s < nsock; s++) PRIME(s);

    double window_start = t0 + warmup, window_end = window_start + seconds;
    int in_window = 0;
    double cpu_at_start = 0, user, sys;
    struct epoll_event events[64];
    for (;;) {
        double now = now_s();
        if (!in_window && now >= window_start) {
            in_window = 1;
            window_received = received;
            window_lost = lost;
            window_corrupt = corrupt;
            cpu_at_start = cpu_s(&user, &sys);
            printf("WINDOW\n");
            fflush(stdout);
        }
        if (now >= window_end) break;
        int n = epoll_wait(ep, events, 64, 10);
        now = now_s();
        for (int e = 0; e < n; e++) {
            int s = (int)events[e].data.u32;
            arm_receive(imsg, iiov, in, ictl[0].bytes, sizeof ictl[0]);
            int got = recvmmsg(fds[s], imsg, MAX_BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0) continue;
            int good = 0;
            for (int i = 0; i < got; i++) {
                /* A reply is good when it is for one of this socket's flows and came back to
                 * that flow's own address (the echo answered the source it saw). */
                uint32_t head[2] = {0, 0}, to = 0;
                struct cmsghdr *c;
                if (imsg[i].msg_len >= 8) memcpy(head, in[i], sizeof head);
                for (c = CMSG_FIRSTHDR(&imsg[i].msg_hdr); c; c = CMSG_NXTHDR(&imsg[i].msg_hdr, c)) {
                    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                        struct in_pktinfo info;
                        memcpy(&info, CMSG_DATA(c), sizeof info);
                        to = ntohl(info.ipi_addr.s_addr);
                    }
                }
                if (head[0] == MAGIC && head[1] < (uint32_t)nflows && head[1] % (uint32_t)nsock == (uint32_t)s
                        && to == flow_address(head[1]))
                    flows[good++] = head[1];
                else
                    corrupt++;
            }
            received += (unsigned long long)good;
            outstanding[s] -= got;
            if (outstanding[s] < 0) outstanding[s] = 0;
            last_heard[s] = now;
            SEND_FLOWS(s, good);
        }
        /* A socket that heard nothing for 200 ms lost its requests: count them, start again. */
        for (int s = 0; s < nsock; s++) {
            if (now - last_heard[s] > 0.2) {
                lost += (unsigned long long)outstanding[s];
                outstanding[s] = 0;
                last_heard[s] = now;
                PRIME(s);
            }
        }
    }
    double cpu = cpu_s(&user, &sys) - cpu_at_start;
    unsigned long long echoes = received - window_received;
    printf("{\"echoes\": %llu, \"seconds\": %.3f, \"echoes_per_s\": %.1f, \"lost\": %llu, "
           "\"corrupt\": %llu, \"sent\": %llu, \"sockets\": %d, \"window\": %d, \"size\": %d, "
           "\"sources\": %d, \"load_cpu\": %.3f}\n",
           echoes, seconds, echoes / seconds, lost - window_lost, corrupt - window_corrupt,
           sent_total, nsock, window, size, nflows, cpu);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) return serve(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "load") == 0) {
        int sources = atoi(arg(argc, argv, "--sources", "0"));
        return sources > 0 ? load_sources(argc, argv, sources) : load(argc, argv);
    }
    fprintf(stderr, "usage: udp_echo serve|load [options] (see the comment at the top of udp_echo.c)\n");
    return 2;
}
