/*
 * driver.c - the socket driver (relay_client_open / relay_client_update): one non-blocking
 * UDP socket per client, POSIX or Winsock. The sans-I/O core (client.c) never touches it.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L
#endif

#include "client_internal.h"

#include <string.h>

#ifdef _WIN32
#  include <winsock2.h>
#  include <ws2tcpip.h>
#  include <windows.h>
typedef SOCKET rc_socket;
#  define RC_BAD_SOCKET INVALID_SOCKET
#  define rc_close_socket closesocket
#else
#  include <sys/types.h>
#  include <sys/socket.h>
#  include <netdb.h>
#  include <netinet/in.h>
#  include <fcntl.h>
#  include <poll.h>
#  include <time.h>
#  include <unistd.h>
#  include <errno.h>
typedef int rc_socket;
#  define RC_BAD_SOCKET (-1)
#  define rc_close_socket close
#endif

/* Whether a datagram came from the relay: the family, port and address of the socket address
 * relay_client_open resolved. Anything else is not ours to read (PROTOCOL 8.10: a client
 * answers path challenges from its server's address only). */
static int from_relay(const relay_client_t *client, const struct sockaddr_storage *from)
{
    const struct sockaddr *relay = (const struct sockaddr *)(const void *)client->address;
    if (from->ss_family != relay->sa_family)
        return 0;
    if (relay->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)from;
        const struct sockaddr_in *b = (const struct sockaddr_in *)(const void *)relay;
        return a->sin_port == b->sin_port
               && memcmp(&a->sin_addr, &b->sin_addr, sizeof a->sin_addr) == 0;
    }
    if (relay->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)from;
        const struct sockaddr_in6 *b = (const struct sockaddr_in6 *)(const void *)relay;
        return a->sin6_port == b->sin6_port
               && memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
    }
    return 0;
}

static rc_socket socket_of(const relay_client_t *client)
{
    return (rc_socket)client->socket_handle;
}

double relay_client_time(void)
{
#ifdef _WIN32
    static LARGE_INTEGER frequency;
    LARGE_INTEGER counter;
    if (frequency.QuadPart == 0)
        QueryPerformanceFrequency(&frequency);
    QueryPerformanceCounter(&counter);
    return (double)counter.QuadPart / (double)frequency.QuadPart;
#else
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
#endif
}

static int platform_init(void)
{
#ifdef _WIN32
    static int started;
    if (!started) {
        WSADATA data;
        if (WSAStartup(MAKEWORD(2, 2), &data) != 0)
            return -1;
        started = 1;
    }
#endif
    return 0;
}

static int set_nonblocking(rc_socket s)
{
#ifdef _WIN32
    u_long on = 1;
    return ioctlsocket(s, FIONBIO, &on) == 0 ? 0 : -1;
#else
    int flags = fcntl(s, F_GETFL, 0);
    return flags >= 0 && fcntl(s, F_SETFL, flags | O_NONBLOCK) == 0 ? 0 : -1;
#endif
}

/* A new non-blocking socket of the relay address's family. */
static int open_socket(relay_client_t *client)
{
    const struct sockaddr *address = (const struct sockaddr *)(const void *)client->address;
    rc_socket s = socket(address->sa_family, SOCK_DGRAM, IPPROTO_UDP);
    if (s == RC_BAD_SOCKET)
        return RELAY_ESOCKET;
    if (set_nonblocking(s) != 0) {
        rc_close_socket(s);
        return RELAY_ESOCKET;
    }
    client->socket_handle = (intptr_t)s;
    client->socket_open = 1;
    return RELAY_OK;
}

void rc_driver_close(relay_client_t *client)
{
    if (client->socket_open) {
        rc_close_socket(socket_of(client));
        client->socket_open = 0;
        client->socket_handle = -1;
    }
}

int relay_client_open(relay_client_t *client, const char *host, uint16_t port)
{
    struct addrinfo hints, *found = NULL;
    char service[8];
    int status;
    if (client == NULL || host == NULL)
        return RELAY_EINVAL;
    if (platform_init() != 0)
        return RELAY_ESOCKET;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_protocol = IPPROTO_UDP;
    service[0] = '\0';
    {
        /* port as decimal text without snprintf's locale concerns */
        char digits[6];
        int n = 0, k;
        unsigned value = port;
        do {
            digits[n++] = (char)('0' + value % 10);
            value /= 10;
        } while (value);
        for (k = 0; k < n; k++)
            service[k] = digits[n - 1 - k];
        service[n] = '\0';
    }
    if (getaddrinfo(host, service, &hints, &found) != 0 || found == NULL)
        return RELAY_ESOCKET;
    if (found->ai_addrlen > sizeof client->address) {
        freeaddrinfo(found);
        return RELAY_ESOCKET;
    }
    rc_driver_close(client);
    memcpy(client->address, found->ai_addr, found->ai_addrlen);
    client->address_length = (uint32_t)found->ai_addrlen;
    freeaddrinfo(found);
    status = open_socket(client);
    return status;
}

int relay_client_reopen(relay_client_t *client)
{
    intptr_t old;
    int had, status;
    if (client == NULL)
        return RELAY_EINVAL;
    if (client->address_length == 0)
        return RELAY_ESTATE;
    /* Open the new socket before closing the old one, so the OS gives another port. */
    old = client->socket_handle;
    had = client->socket_open;
    status = open_socket(client);
    if (status != RELAY_OK) {
        client->socket_handle = old;
        client->socket_open = had;
        return status;
    }
    if (had)
        rc_close_socket((rc_socket)old);
    return RELAY_OK;
}

void relay_client_close(relay_client_t *client)
{
    if (client != NULL)
        rc_driver_close(client);
}

int relay_client_update(relay_client_t *client, double now)
{
    uint8_t buffer[RELAY_MAX_DATAGRAM];
    int length, budget;
    if (client == NULL)
        return RELAY_EINVAL;
    if (!client->socket_open)
        return RELAY_ESOCKET;
    for (budget = 0; budget < 4096; budget++) {
        struct sockaddr_storage from;
#ifdef _WIN32
        int from_length = (int)sizeof from;
        int received = recvfrom(socket_of(client), (char *)buffer, (int)sizeof buffer, 0,
                                (struct sockaddr *)&from, &from_length);
#else
        socklen_t from_length = (socklen_t)sizeof from;
        ssize_t received = recvfrom(socket_of(client), buffer, sizeof buffer, 0,
                                    (struct sockaddr *)&from, &from_length);
#endif
        if (received < 0) {
#ifdef _WIN32
            /* WSAECONNRESET: an ICMP port unreachable from an earlier send; keep reading */
            if (WSAGetLastError() == WSAECONNRESET)
                continue;
#else
            if (errno == EINTR || errno == ECONNREFUSED)
                continue;
#endif
            break;
        }
        if (!from_relay(client, &from)) {
            client->datagrams_dropped++;
            continue;
        }
        relay_client_receive(client, buffer, (size_t)received, now);
    }
    {
        double due = relay_client_next_timeout(client);
        if (due >= 0 && due <= now)
            relay_client_handle_timeout(client, now);
    }
    while ((length = relay_client_next_datagram(client, buffer, sizeof buffer, now)) > 0) {
#ifdef _WIN32
        sendto(socket_of(client), (const char *)buffer, length, 0,
               (const struct sockaddr *)(const void *)client->address, (int)client->address_length);
#else
        sendto(socket_of(client), buffer, (size_t)length, 0,
               (const struct sockaddr *)(const void *)client->address,
               (socklen_t)client->address_length);
#endif
        /* a failed send is a lost datagram: the transport repairs it */
    }
    return RELAY_OK;
}

int relay_client_wait(relay_client_t *client, double timeout)
{
    double due, now;
    int milliseconds;
    if (client == NULL)
        return RELAY_EINVAL;
    if (!client->socket_open)
        return RELAY_ESOCKET;
    now = relay_client_time();
    due = relay_client_next_timeout(client);
    if (due >= 0 && due - now < timeout)
        timeout = due - now;
    if (timeout < 0)
        timeout = 0;
    milliseconds = (int)(timeout * 1000.0 + 0.999);
#ifdef _WIN32
    {
        fd_set readable;
        struct timeval tv;
        FD_ZERO(&readable);
        FD_SET(socket_of(client), &readable);
        tv.tv_sec = milliseconds / 1000;
        tv.tv_usec = (milliseconds % 1000) * 1000;
        select(0, &readable, NULL, NULL, &tv);
    }
#else
    {
        struct pollfd descriptor;
        descriptor.fd = socket_of(client);
        descriptor.events = POLLIN;
        descriptor.revents = 0;
        poll(&descriptor, 1, milliseconds);
    }
#endif
    return RELAY_OK;
}
