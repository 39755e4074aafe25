// SPDX-License-Identifier: GPL-2.0
/* rsv: Reservoir's TCP congestion control, a struct_ops tcp_congestion_ops built on the
 * kernel's own BBRv1 (called as kfuncs for the model: bandwidth and min-RTT filters, gain
 * cycling) with four changes, each steered per socket from user space through the
 * rsv_settings socket-storage map (crates/cc/src/lib.rs writes it, keyed by the socket's fd):
 *
 *  - start_rate: while BBR is still in STARTUP, pacing is at least start_rate and cwnd at
 *    least twice start_rate x RTT, instead of growing from 10 packets, from the first data
 *    sent after the settings (CA_EVENT_TX_START) or the first ACK, whichever comes
 *    first. A rate too high for today's path stops counting when BBR leaves STARTUP (its
 *    delivery rate stops growing for three rounds), so it costs a few round trips, not the
 *    transfer.
 *  - share_rate: pacing exactly at share_rate, cwnd never below twice share x min RTT, so
 *    the window never holds the share back and the pacing alone sets the rate, while the
 *    ACKs show no queue (RTT within 5/4 of the minimum); with a queue, BBR's own rate
 *    capped at the share, until the queue drains.
 *  - RSV_NO_PROBE_RTT: the min-RTT sample is kept fresh, so this connection never enters
 *    PROBE_RTT (user space says another connection, or a known path, keeps the minimum).
 *  - loss without queue growth (the ACK's RTT within 5/4 of the minimum) does not cut
 *    cwnd below what the current pacing rate needs; BBR's packet conservation in recovery
 *    would. RSV_BBR_LOSS turns this off.
 *
 * Flagged TCP_CONG_NON_RESTRICTED: any process may select it with TCP_CONGESTION. */
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

#define TCP_CONG_NON_RESTRICTED 0x1
#define TCP_CA_RECOVERY 3
#define BBR_STARTUP 0
#define BBR_PROBE_BW 2
#define BBR_PROBE_RTT 3
#define RSV_NO_PROBE_RTT 1
#define RSV_BBR_LOSS 2
#define USEC_PER_SEC 1000000ULL

/* Must match crates/cc/src/lib.rs (RawSettings). */
struct rsv_settings {
	__u64 start_rate; /* bytes/s; 0: none */
	__u64 share_rate; /* bytes/s; 0: none */
	__u32 min_rtt_us; /* the path's minimum RTT if user space knows it; 0: unknown */
	__u32 flags;      /* RSV_* */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rsv_settings);
} rsv_settings SEC(".maps");

extern void bbr_init(struct sock *sk) __ksym;
extern void bbr_main(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs) __ksym;
extern u32 bbr_sndbuf_expand(struct sock *sk) __ksym;
extern u32 bbr_undo_cwnd(struct sock *sk) __ksym;
extern void bbr_cwnd_event(struct sock *sk, enum tcp_ca_event event) __ksym;
extern u32 bbr_ssthresh(struct sock *sk) __ksym;
extern u32 bbr_min_tso_segs(struct sock *sk) __ksym;
extern void bbr_set_state(struct sock *sk, u8 new_state) __ksym;

static __always_inline struct bbr *bbr_of(struct sock *sk)
{
	return (struct bbr *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline struct rsv_settings *settings_of(struct sock *sk)
{
	return bpf_sk_storage_get(&rsv_settings, sk, 0, 0);
}

/* Packets in rate x rtt_us x mult, at least 4, at most the socket's clamp. */
static __always_inline u32 window_for(struct tcp_sock *tp, u64 rate, u32 rtt_us, u32 mult)
{
	u32 mss = tp->mss_cache ? tp->mss_cache : 1448;
	u64 pkts = rate * rtt_us / USEC_PER_SEC * mult / mss;
	u32 clamp = tp->snd_cwnd_clamp;

	if (pkts < 4)
		pkts = 4;
	if (clamp && pkts > clamp)
		pkts = clamp;
	return (u32)pkts;
}

/* The best RTT this socket knows: BBR's filtered minimum, the one user space gave, the
 * smoothed RTT, in that order; 0 when none. */
static __always_inline u32 path_rtt(struct sock *sk, struct rsv_settings *s)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	u32 min_rtt = bbr_of(sk)->min_rtt_us;

	if (min_rtt && min_rtt != ~0U)
		return min_rtt;
	if (s && s->min_rtt_us)
		return s->min_rtt_us;
	return tp->srtt_us >> 3;
}

static __always_inline void raise_cwnd(struct tcp_sock *tp, u32 cwnd)
{
	if (tp->snd_cwnd < cwnd)
		tp->snd_cwnd = cwnd;
}

static __always_inline void apply_start(struct sock *sk, struct rsv_settings *s)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct bbr *bbr = bbr_of(sk);
	u32 rtt;

	if (!s || !s->start_rate || BPF_CORE_READ_BITFIELD(bbr, mode) != BBR_STARTUP)
		return;
	if (sk->sk_pacing_rate < s->start_rate)
		sk->sk_pacing_rate = s->start_rate;
	rtt = path_rtt(sk, s);
	if (rtt)
		raise_cwnd(tp, window_for(tp, s->start_rate, rtt, 2));
}

SEC("struct_ops/rsv_init")
void BPF_PROG(rsv_init, struct sock *sk)
{
	bbr_init(sk);
	apply_start(sk, settings_of(sk));
}

SEC("struct_ops/rsv_cong_control")
void BPF_PROG(rsv_cong_control, struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct rsv_settings *s = settings_of(sk);
	struct bbr *bbr = bbr_of(sk);
	u32 flags = s ? s->flags : 0;
	u32 mode, rtt;
	bool queue;

	if ((flags & RSV_NO_PROBE_RTT) && BPF_CORE_READ_BITFIELD(bbr, mode) != BBR_PROBE_RTT)
		bbr->min_rtt_stamp = (u32)bpf_jiffies64();

	bbr_main(sk, ack, flag, rs);

	apply_start(sk, s);

	mode = BPF_CORE_READ_BITFIELD(bbr, mode);
	rtt = path_rtt(sk, s);
	/* A queue: this ACK's RTT is more than 5/4 of the minimum. */
	queue = rtt && rs->rtt_us > 0 && (u64)rs->rtt_us * 4 > (u64)rtt * 5;
	if (!(flags & RSV_BBR_LOSS) && rtt && rs->rtt_us > 0 && !queue &&
	    (rs->losses > 0 ||
	     BPF_CORE_READ_BITFIELD((struct inet_connection_sock *)sk, icsk_ca_state) >=
		     TCP_CA_RECOVERY))
		raise_cwnd(tp, window_for(tp, sk->sk_pacing_rate, rtt, mode == BBR_PROBE_BW ? 2 : 1));

	/* The share is exact while the path holds it. A share above what the path carries
	 * (user space's estimate too high, another flow arrived) builds a queue: then BBR's
	 * own rate, at most the share, drains it, and the share returns with the minimum
	 * RTT, instead of a standing overflow. */
	if (s && s->share_rate) {
		if (!queue) {
			sk->sk_pacing_rate = s->share_rate;
			if (rtt)
				raise_cwnd(tp, window_for(tp, s->share_rate, rtt, 2));
		} else if (sk->sk_pacing_rate > s->share_rate) {
			sk->sk_pacing_rate = s->share_rate;
		}
	}
}

SEC("struct_ops/rsv_ssthresh")
u32 BPF_PROG(rsv_ssthresh, struct sock *sk)
{
	return bbr_ssthresh(sk);
}

SEC("struct_ops/rsv_undo_cwnd")
u32 BPF_PROG(rsv_undo_cwnd, struct sock *sk)
{
	return bbr_undo_cwnd(sk);
}

SEC("struct_ops/rsv_cwnd_event")
void BPF_PROG(rsv_cwnd_event, struct sock *sk, enum tcp_ca_event event)
{
	bbr_cwnd_event(sk, event);
	/* The first data after an idle spell, e.g. a session's first command after its login
	 * (whose settings came after the login's last ACK): the start is in force from this
	 * packet on, not from the next ACK, a round trip later. An ACK that finds nothing in
	 * flight does not reach cong_control. */
	if (event == CA_EVENT_TX_START)
		apply_start(sk, settings_of(sk));
}

SEC("struct_ops/rsv_set_state")
void BPF_PROG(rsv_set_state, struct sock *sk, u8 new_state)
{
	bbr_set_state(sk, new_state);
}

SEC("struct_ops/rsv_sndbuf_expand")
u32 BPF_PROG(rsv_sndbuf_expand, struct sock *sk)
{
	return bbr_sndbuf_expand(sk);
}

SEC("struct_ops/rsv_min_tso_segs")
u32 BPF_PROG(rsv_min_tso_segs, struct sock *sk)
{
	return bbr_min_tso_segs(sk);
}

SEC(".struct_ops")
struct tcp_congestion_ops rsv = {
	.init = (void *)rsv_init,
	.cong_control = (void *)rsv_cong_control,
	.ssthresh = (void *)rsv_ssthresh,
	.undo_cwnd = (void *)rsv_undo_cwnd,
	.cwnd_event = (void *)rsv_cwnd_event,
	.set_state = (void *)rsv_set_state,
	.sndbuf_expand = (void *)rsv_sndbuf_expand,
	.min_tso_segs = (void *)rsv_min_tso_segs,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = "rsv",
};
