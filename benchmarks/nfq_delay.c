/* Hold every packet of an NFQUEUE for a fixed delay, then accept it.

   usage: nfq_delay QUEUE_NUM DELAY_MS

   Used by benchmarks/s3_remote.py in the "router" network namespace, whose
   iptables sends every forwarded packet here (the kernel has no netem).
   Each packet is released DELAY_MS after it arrived, whatever else is queued:
   the delay is constant, so arrival order is release order (a FIFO, no
   reordering), and a packet's wait never adds to the next one's (no
   serialisation). Packets are queued with metadata only (no payload copy) and
   GSO packets whole, so the program's cost does not depend on packet size.

   Build: cc -O2 -o nfq_delay nfq_delay.c -lnetfilter_queue (libnetfilter-queue-dev).
   Prints "ready" on stdout once bound. Ends on SIGTERM/SIGINT. */

#define _GNU_SOURCE /* ppoll */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <libnfnetlink/libnfnetlink.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif

#define RING (1u << 20) /* packets held at once: far above what one benchmark has in flight */

struct held { uint32_t id; uint64_t due_ns; };

static struct held ring[RING];
static uint32_t head, tail; /* ring[head..tail) held, oldest first */
static uint64_t delay_ns;
static unsigned long long dropped_full;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data) {
    (void)msg; (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (tail - head >= RING) { /* never expected; accept at once rather than lose it */
        dropped_full++;
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    }
    ring[tail % RING] = (struct held){id, now_ns() + delay_ns};
    tail++;
    return 0;
}

static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s QUEUE_NUM DELAY_MS\n", argv[0]);
        return 2;
    }
    int queue_num = atoi(argv[1]);
    delay_ns = (uint64_t)(atof(argv[2]) * 1e6);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    struct nfq_handle *h = nfq_open();
    if (!h) { perror("nfq_open"); return 1; }
    nfq_unbind_pf(h, AF_INET);
    if (nfq_bind_pf(h, AF_INET) < 0) { perror("nfq_bind_pf"); return 1; }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)queue_num, &on_packet, NULL);
    if (!qh) { perror("nfq_create_queue"); return 1; }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) { perror("nfq_set_mode"); return 1; }
    nfq_set_queue_maxlen(qh, 1u << 18);
    /* GSO packets whole (no software segmentation); ignored by kernels without it */
    nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 64u << 20);
    int fd = nfq_fd(h);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);

    printf("ready\n");
    fflush(stdout);

    static char buf[1 << 16];
    while (!stop) {
        struct timespec wait, *waitp = NULL; /* nothing held: wait for packets only */
        if (head != tail) {
            uint64_t now = now_ns(), due = ring[head % RING].due_ns;
            uint64_t left = due > now ? due - now : 0;
            wait.tv_sec = (time_t)(left / 1000000000u);
            wait.tv_nsec = (long)(left % 1000000000u);
            waitp = &wait;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = ppoll(&pfd, 1, waitp, NULL);
        if (r < 0 && errno != EINTR) { perror("ppoll"); break; }
        if (r > 0 && (pfd.revents & POLLIN)) {
            /* everything readable now, so arrival times are taken when the packets came */
            for (;;) {
                ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (n <= 0) break;
                nfq_handle_packet(h, buf, (int)n);
            }
        }
        uint64_t now = now_ns();
        uint32_t last = 0;
        int any = 0;
        while (head != tail && ring[head % RING].due_ns <= now) {
            last = ring[head % RING].id;
            any = 1;
            head++;
        }
        /* ids rise in arrival order: one batch verdict accepts every id up to `last` */
        if (any) nfq_set_verdict_batch(qh, last, NF_ACCEPT);
    }
    /* release what is still held, then leave */
    if (head != tail) nfq_set_verdict_batch(qh, ring[(tail - 1) % RING].id, NF_ACCEPT);
    nfq_destroy_queue(qh);
    nfq_close(h);
    if (dropped_full) fprintf(stderr, "nfq_delay: %llu packets passed undelayed (ring full)\n", dropped_full);
    return 0;
}
