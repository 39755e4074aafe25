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
 *  - probe_rate: with a start_rate and no share, the start's first round of data (start_rate
 *    x RTT, what the start sends before its first ACK today) leaves at probe_rate instead,
 *    and its ACKs are timed: they come at the bottleneck's rate (this connection's share
 *    of it) when the train was faster than that. From then on, while BBR is in STARTUP, the
 *    start is that rate (see "The probed start" below).
 *  - share_rate: pacing exactly at share_rate, cwnd never below twice share x min RTT, so
 *    the window never holds the share back and the pacing alone sets the rate, while the
 *    ACKs show no queue (RTT within 5/4 of the minimum); with a queue, BBR's own rate
 *    capped at the share, until the queue drains.
 *  - RSV_NO_PROBE_RTT: the min-RTT sample is kept fresh, so this connection never enters
 *    PROBE_RTT (user space says another connection, or a known path, keeps the minimum).
 *  - group: the connections of one session share a group id, and their PROBE_RTT is
 *    coordinated through the rsv_groups map (see "PROBE_RTT by group" below): a minimum
 *    a member (this one or another) confirmed lately is fresh, and one member probes at a
 *    time; a probe holds half a BDP in flight, not four packets (see "PROBE_RTT at half
 *    a BDP").
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
/* The name sockets select: build.rs passes RSV_CC_NAME (`rsv` unless set at build time). */
#ifndef RSV_CC_NAME
#define RSV_CC_NAME "rsv"
#endif

/* Must match crates/cc/src/lib.rs (RawSettings). */
struct rsv_settings {
	__u64 start_rate; /* bytes/s; 0: none */
	__u64 share_rate; /* bytes/s; 0: none */
	__u32 min_rtt_us; /* the path's minimum RTT if user space knows it; 0: unknown */
	__u32 flags;      /* RSV_* */
	__u32 group;      /* the session's group, for PROBE_RTT; 0: none */
	__u32 probe_rate; /* bytes/s the start's first round is sent at; 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rsv_settings);
} rsv_settings SEC(".maps");

/* PROBE_RTT by group.
 *
 * BBR enters PROBE_RTT (cwnd 4 for at least 200 ms and a round trip) when its min-RTT
 * sample is 10 s old. The connections of a session start together, so their samples age
 * together and the whole session drains at once. Here, for a socket with a group (not
 * RSV_NO_PROBE_RTT), the program decides shortly before BBR would (RSV_DUE_NS after the
 * sample was taken, measured in ktime ns from when this program saw BBR set it), on each
 * ACK while it is due:
 *  (a) skip: a member, this socket itself or another, saw, less than RSV_DUE_NS ago, an
 *      RTT at most 9/8 of this socket's minimum (each member publishes its samples that
 *      are within 9/8 of its own minimum, in its slot of the group): the minimum is fresh,
 *      the queue as good as empty then; BBR's sample is renewed and this socket is due
 *      again RSV_DUE_NS after that sample. A socket's own samples count (as BBRv3's do):
 *      most sessions have one connection, and on a long path its PROBE_RTT emptied the
 *      pipe for 200 ms and two round trips (0.8 s at 300 ms, three in a 30-s run) while
 *      its own ACKs showed the minimum in every gain cycle's drain phase;
 *  (b) defer: another member holds the group's token (it is probing): BBR's sample is
 *      renewed on every ACK, and the socket stays due;
 *  (c) probe: it takes the token until PROBE_RTT's 200 ms and two round trips have
 *      passed (released earlier when it leaves PROBE_RTT, or when the socket goes), and
 *      lets BBR's filter expire now.
 * A minimum nobody confirms is still probed, one member after the other, so a base RTT
 * that grew is learnt; a lower one BBR takes at once, as always. Sockets without a group
 * run BBR's own PROBE_RTT. Counters (per group and per socket) say what happened; the
 * group's max_probing is the most members in PROBE_RTT at once. */
#define RSV_GROUP_SLOTS 8
#define NSEC_PER_SEC 1000000000ULL
#define NSEC_PER_USEC 1000ULL
#define RSV_MIN_RTT_WIN_NS (10 * NSEC_PER_SEC) /* BBR's bbr_min_rtt_win_sec */
#define RSV_DUE_NS (RSV_MIN_RTT_WIN_NS - NSEC_PER_SEC / 10)
#define RSV_PROBE_NS (NSEC_PER_SEC / 5) /* BBR's bbr_probe_rtt_mode_ms */
#define RSV_PUBLISH_NS (NSEC_PER_SEC / 32)
#define RSV_MAX_GROUPS 4096
#define BW_SCALE 24 /* BBR's bandwidth unit: packets per usec << 24 */

/* Must match crates/cc/src/lib.rs (RawGroup). */
struct rsv_group {
	struct bpf_spin_lock lock;
	__u32 members;
	__u32 probing;     /* members in PROBE_RTT now */
	__u32 max_probing; /* the most at once */
	__u32 token;       /* the holder's id; 0: none */
	__u32 next_slot;
	__u64 token_until; /* ktime ns */
	__u64 probes;      /* PROBE_RTTs entered by members */
	__u64 skipped;     /* (a) */
	__u64 deferred;    /* (b), once a due spell */
	__u32 low_rtt_us[RSV_GROUP_SLOTS]; /* each slot's latest sample near its minimum */
	__u64 low_ns[RSV_GROUP_SLOTS];     /* and when (ktime ns); 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RSV_MAX_GROUPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct rsv_group);
} rsv_groups SEC(".maps");

/* The program's own state of a socket (user space reads its counters). Must match
 * crates/cc/src/lib.rs (RawSockState). */
struct rsv_sock {
	__u64 stamp_ns;   /* when BBR's min_rtt_stamp took its current value, as seen here */
	__u64 probes;     /* PROBE_RTTs entered */
	__u64 skipped;
	__u64 deferred;
	__u32 seen_stamp; /* BBR's min_rtt_stamp as last seen */
	__u32 group;      /* the group joined; 0: none */
	__u32 id;         /* this socket's token id */
	__u32 slot;
	__u8 mode;        /* BBR's mode after the last ACK */
	__u8 holds_token;
	__u8 deferring;   /* this due spell's deferral is counted */
	__u8 probe;       /* RSV_PROBE_*: the probed start's phase */
	__u8 pad[4];
	__u64 probe_t1_ns;  /* the first ACK of the probed flight (ktime ns) */
	__u64 found_rate;   /* bytes/s the probed flight's ACKs came at; 0: none */
	__u32 probe_d1;     /* tp->delivered at that ACK */
	__u32 probe_rest;   /* the flight's packets not yet delivered at that ACK */
	__u32 probe_pkts;   /* packets timed */
	__u32 probe_us;     /* over this many microseconds */
	__u64 hold_until_ns;  /* PROBE_RTT at half a BDP: its 200 ms end here (ktime ns); 0: none */
	__u32 hold_delivered; /* tp->delivered when the hold began: its round ends past it */
	__u32 holds;          /* PROBE_RTTs held at half a BDP */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rsv_sock);
} rsv_state SEC(".maps");

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

/* --- PROBE_RTT by group (see the top of the file) ------------------------------------ */

static __always_inline u32 mode_of(struct bbr *bbr)
{
	return BPF_CORE_READ_BITFIELD(bbr, mode);
}

/* The state starts with BBR's: its min-RTT stamp as taken now. */
static __always_inline void state_start(struct sock *sk, struct rsv_sock *st)
{
	struct bbr *bbr = bbr_of(sk);

	if (!st->id)
		st->id = bpf_get_prandom_u32() | 1;
	st->seen_stamp = bbr->min_rtt_stamp;
	st->stamp_ns = bpf_ktime_get_ns();
	st->mode = mode_of(bbr);
	st->holds_token = 0;
	st->deferring = 0;
}

static __always_inline void group_leave(struct rsv_sock *st)
{
	u32 key = st->group;
	u32 id = st->id, left;
	bool probing = st->mode == BBR_PROBE_RTT;
	struct rsv_group *g;

	if (!key)
		return;
	st->group = 0;
	st->holds_token = 0;
	g = bpf_map_lookup_elem(&rsv_groups, &key);
	if (!g)
		return;
	bpf_spin_lock(&g->lock);
	if (probing && g->probing)
		g->probing--;
	if (g->token == id)
		g->token = 0;
	if (g->members)
		g->members--;
	left = g->members;
	bpf_spin_unlock(&g->lock);
	if (!left)
		bpf_map_delete_elem(&rsv_groups, &key);
}

/* The socket's group entry, joined (and the old one left) when its settings name another;
 * NULL without a group, or when the map is full (then BBR's own PROBE_RTT). */
static __always_inline struct rsv_group *group_join(struct rsv_sock *st, u32 key)
{
	bool probing = st->mode == BBR_PROBE_RTT;
	struct rsv_group *g;
	u32 slot;

	if (st->group != key)
		group_leave(st);
	if (!key)
		return NULL;
	g = bpf_map_lookup_elem(&rsv_groups, &key);
	if (g && st->group == key)
		return g;
	if (!g) {
		struct rsv_group fresh = {};

		bpf_map_update_elem(&rsv_groups, &key, &fresh, BPF_NOEXIST);
		g = bpf_map_lookup_elem(&rsv_groups, &key);
		if (!g)
			return NULL;
	}
	bpf_spin_lock(&g->lock);
	g->members++;
	slot = g->next_slot++;
	if (probing) {
		g->probing++;
		if (g->probing > g->max_probing)
			g->max_probing = g->probing;
	}
	bpf_spin_unlock(&g->lock);
	st->slot = slot & (RSV_GROUP_SLOTS - 1);
	st->group = key;
	return g;
}

/* The time a probe holds the group's token past its last ACK: PROBE_RTT's 200 ms and two
 * round trips (the drain to 4 packets, and the round it then lasts). */
static __always_inline u64 probe_hold_ns(struct bbr *bbr)
{
	u64 rtt = bbr->min_rtt_us;

	if (!rtt || rtt > USEC_PER_SEC)
		rtt = USEC_PER_SEC;
	return RSV_PROBE_NS + 2 * rtt * NSEC_PER_USEC;
}

/* Before bbr_main: when BBR's minimum is about to expire, skip, defer or probe. */
static __always_inline void coordinate(struct sock *sk, struct rsv_sock *st,
				       struct rsv_group *g, u64 now)
{
	struct bbr *bbr = bbr_of(sk);
	u32 min_rtt = bbr->min_rtt_us;
	u32 jiffies = (u32)bpf_jiffies64();
	u64 fresh = 0, until = now + probe_hold_ns(bbr);
	bool defer = false, counted = st->deferring;
	int i;

	if (st->mode == BBR_PROBE_RTT || now < st->stamp_ns + RSV_DUE_NS)
		return;
	if (min_rtt && min_rtt != ~0U) {
		u64 near = (u64)min_rtt * 9 / 8;

#pragma unroll
		for (i = 0; i < RSV_GROUP_SLOTS; i++) {
			u64 t = g->low_ns[i];

			if (!t || t + RSV_DUE_NS <= now)
				continue;
			if (g->low_rtt_us[i] <= near && t > fresh)
				fresh = t;
		}
	}
	if (fresh) {
		/* (a) A member confirmed the minimum: it is fresh as of its sample. */
		bbr->min_rtt_stamp = jiffies;
		st->seen_stamp = jiffies;
		st->stamp_ns = fresh;
		st->deferring = 0;
		st->skipped++;
		bpf_spin_lock(&g->lock);
		g->skipped++;
		bpf_spin_unlock(&g->lock);
		return;
	}
	bpf_spin_lock(&g->lock);
	if (g->token && g->token != st->id && g->token_until > now) {
		defer = true;
		if (!counted)
			g->deferred++;
	} else {
		g->token = st->id;
		g->token_until = until;
	}
	bpf_spin_unlock(&g->lock);
	if (defer) {
		/* (b) Another member probes: BBR waits, this socket stays due. */
		bbr->min_rtt_stamp = jiffies;
		st->seen_stamp = jiffies;
		if (!counted) {
			st->deferring = 1;
			st->deferred++;
		}
		return;
	}
	/* (c) This one probes: BBR's filter expires now (a stamp older than ten seconds at any
	 * HZ), and BBR enters PROBE_RTT in this bbr_main. */
	st->holds_token = 1;
	st->deferring = 0;
	bbr->min_rtt_stamp = jiffies - 0x40000000;
	st->seen_stamp = jiffies - 0x40000000;
}

/* After bbr_main: what BBR did (a new minimum, PROBE_RTT entered or left), the token, and
 * this ACK's RTT for the other members when it is near this socket's minimum. */
static __always_inline void observe(struct sock *sk, struct rsv_sock *st, struct rsv_group *g,
				    const struct rate_sample *rs, u64 now)
{
	struct bbr *bbr = bbr_of(sk);
	u32 mode = mode_of(bbr), prev = st->mode, min_rtt = bbr->min_rtt_us;
	u32 stamp = bbr->min_rtt_stamp, id = st->id;
	bool entered = mode == BBR_PROBE_RTT && prev != BBR_PROBE_RTT;
	bool left = mode != BBR_PROBE_RTT && prev == BBR_PROBE_RTT;
	bool holds = st->holds_token;
	bool release = holds && mode != BBR_PROBE_RTT;
	u64 until = now + probe_hold_ns(bbr);
	long rtt_us = rs->rtt_us;

	if (stamp != st->seen_stamp) {
		st->seen_stamp = stamp;
		st->stamp_ns = now;
	}
	st->mode = mode;
	if (entered) {
		st->probes++;
		st->deferring = 0;
	}
	if (release)
		st->holds_token = 0;
	if (!g)
		return;
	if (entered || left || holds) {
		bpf_spin_lock(&g->lock);
		if (entered) {
			g->probes++;
			g->probing++;
			if (g->probing > g->max_probing)
				g->max_probing = g->probing;
		}
		if (left && g->probing)
			g->probing--;
		if (g->token == id) {
			if (release)
				g->token = 0;
			else if (g->token_until < until)
				g->token_until = until; /* held while its ACKs come */
		}
		bpf_spin_unlock(&g->lock);
	}
	if (rtt_us > 0 && min_rtt && min_rtt != ~0U && (u64)rtt_us * 8 <= (u64)min_rtt * 9) {
		u32 slot = st->slot & (RSV_GROUP_SLOTS - 1);

		if (g->low_ns[slot] + RSV_PUBLISH_NS <= now || (u32)rtt_us < g->low_rtt_us[slot]) {
			g->low_rtt_us[slot] = (u32)rtt_us;
			g->low_ns[slot] = now;
		}
	}
}

/* --- PROBE_RTT at half a BDP ------------------------------------------------------------
 *
 * BBRv1 drains to four packets in PROBE_RTT and holds them for 200 ms and a round trip once
 * in flight is that low: the pipe stays empty for about two round trips and fills again in
 * a third (at 300 ms, close to a second of the link lost per probe). BBRv2 and v3 (the
 * IETF's BBR draft) hold half of the estimated BDP instead: that is less than the pipe
 * holds, so the bottleneck's queue empties and the RTT samples show the minimum, while the
 * link still carries about half its rate. So here, on every socket in PROBE_RTT (BBR's own,
 * or a group member's turn):
 *  - cwnd at least half of bw x min_rtt (at least 4), after bbr_main set it to four;
 *  - once in flight is down to that, the hold begins: RSV_PROBE_NS (ktime) and a round (an
 *    ACK of a packet sent after it began: BBR's round, whose count restarts there). BBR
 *    itself starts its hold only at four packets in flight, so its probe_rtt_done_stamp is
 *    set here, kept one jiffy ahead of now on every ACK until both have passed (no HZ is
 *    needed), then one behind, and BBR leaves PROBE_RTT on that ACK as after its own hold
 *    (its window restored, min_rtt_stamp renewed).
 * The minimum BBR took on entering (its filter had expired: that ACK's RTT, at most a full
 * queue above the true one) makes half a BDP of at most the true BDP with the lab's
 * one-BDP queue: the queue still drains. A hold BBR began itself (in flight fell to four
 * first: an application-limited socket) is BBR's, with the window raised the same. */
static __always_inline u32 in_flight(struct tcp_sock *tp)
{
	u32 out = tp->packets_out + tp->retrans_out;
	u32 gone = tp->sacked_out + tp->lost_out;

	return out > gone ? out - gone : 0;
}

/* Half of BBR's bw x min_rtt, in packets; at least 4. */
static __always_inline u32 half_bdp(struct bbr *bbr, u32 min_rtt)
{
	u64 bw = BPF_CORE_READ_BITFIELD(bbr, lt_use_bw) ? bbr->lt_bw : bbr->bw.s[0].v;
	u64 pkts = ((bw * min_rtt) >> BW_SCALE) / 2;

	if (pkts < 4)
		pkts = 4;
	if (pkts > 0x7fffffff)
		pkts = 0x7fffffff;
	return (u32)pkts;
}

/* Before bbr_main: keep BBR's hold from ending before this one's, end it once this one's has. */
static __always_inline void hold_before(struct sock *sk, struct rsv_sock *st,
					const struct rate_sample *rs, u64 now)
{
	struct bbr *bbr = bbr_of(sk);
	u32 jiffies = (u32)bpf_jiffies64();
	u32 stamp;

	if (!st->hold_until_ns)
		return;
	if (mode_of(bbr) != BBR_PROBE_RTT) {
		st->hold_until_ns = 0;
		return;
	}
	if (now >= st->hold_until_ns && rs->prior_delivered &&
	    (s32)(rs->prior_delivered - st->hold_delivered) >= 0)
		stamp = jiffies - 1;
	else
		stamp = jiffies + 1;
	bbr->probe_rtt_done_stamp = stamp ? stamp : 1;
}

/* After bbr_main: the window of the probe, and its hold's start. */
static __always_inline void hold_after(struct sock *sk, struct rsv_sock *st, u64 now)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct bbr *bbr = bbr_of(sk);
	u32 min_rtt = bbr->min_rtt_us, want, jiffies;

	if (mode_of(bbr) != BBR_PROBE_RTT) {
		st->hold_until_ns = 0;
		return;
	}
	if (!min_rtt || min_rtt == ~0U)
		return;
	want = half_bdp(bbr, min_rtt);
	raise_cwnd(tp, want);
	if (st->hold_until_ns || bbr->probe_rtt_done_stamp || in_flight(tp) > want)
		return;
	jiffies = (u32)bpf_jiffies64() + 1;
	st->hold_until_ns = now + RSV_PROBE_NS;
	st->hold_delivered = tp->delivered;
	st->holds++;
	bbr->next_rtt_delivered = tp->delivered;
	bbr->probe_rtt_done_stamp = jiffies ? jiffies : 1;
}

/* --- The probed start --------------------------------------------------------------------
 *
 * BBR's delivery-rate samples (tcp_rate.c) cannot show a path's rate in the first round:
 * each sample divides what was delivered by at least the time since the ACK before its
 * packet left, and never less than the min RTT; every packet of a first flight left
 * before any ACK, so its samples are the flight's size over a round trip, i.e. the start
 * rate, whatever the path carries. The time between the flight's own ACKs does show it:
 * a train sent faster than the bottleneck leaves it spaced at the bottleneck's rate, and
 * its ACKs come back so spaced. So, for a socket with a start_rate, a probe_rate and no
 * share:
 *  SENDING (armed at the first data after idle, CA_EVENT_TX_START, in STARTUP): the
 *    window is the start's first round, start_rate x RTT (what the start sends before
 *    its first ACK when paced at start_rate), and it leaves at probe_rate;
 *  TIMING (from the flight's first ACK that delivers data): what is delivered from then
 *    on, over the time since. Once 3/4 of the rest of the flight is delivered (before a
 *    delayed ACK of its tail could stretch the time), or a round trip has passed with at
 *    least 8 packets (a train that takes longer than a round trip to drain: the path is
 *    slower than the start), that rate, at most probe_rate (ACKs bunched on the way back
 *    must not make it faster than what was sent), is found_rate; pacing drops from
 *    probe_rate to it here, since BBR in STARTUP only ever raises pacing;
 *  DONE: while BBR is in STARTUP the start is found_rate where it is above start_rate:
 *    pacing at least it, cwnd at least twice it x RTT, so that the second round fills the
 *    pipe. BBR's own samples of that round then carry the rate, and it leaves STARTUP as
 *    ever (three rounds without 25 % growth; the first round's samples are app-limited,
 *    the socket having idled before them, and BBR does not count such a round).
 * A flight too small to time (a login PDU, a short command: fewer than RSV_PROBE_MIN
 * packets) sets it back to wait for the next start from idle, paced at start_rate.
 *
 * Why sending the flight fast is safe, and where it is not: the flight is the data the
 * start sends in its first round anyway. Sent at R into a slower bottleneck C it queues
 * there at most N x (1 - C/R) packets of the N, once, drained in N/C. Where the queue
 * holds N (one BDP at the start rate or more: the lab's and R0's one-BDP queues, at 20
 * Mbit/s and faster for the unknown path's 20 Mbit/s start) nothing is lost; a queue
 * shallower than the flight drops its tail, retransmitted as any loss, and the ACKs of
 * what passed still come at the bottleneck's rate. Each connection times its own share:
 * connections that start together find C shared among them; one that starts later,
 * beside others already at full rate, finds less (its ACKs share the queue with theirs),
 * and a rate found too high is dropped with STARTUP as a remembered one is. */
#define RSV_PROBE_NONE 0
#define RSV_PROBE_SENDING 1
#define RSV_PROBE_TIMING 2
#define RSV_PROBE_DONE 3
#define RSV_PROBE_MIN 16

static __always_inline bool probed_start(struct rsv_settings *s)
{
	return s && s->probe_rate && s->start_rate && !s->share_rate;
}

/* The probed round: the start's first round (start_rate x RTT), and never fewer than
 * twice RSV_PROBE_MIN packets, so that a short path's round is still long enough to time
 * (46 KB, which any queue holds). */
static __always_inline u32 probe_window(struct tcp_sock *tp, struct rsv_settings *s, u32 rtt)
{
	u32 w = window_for(tp, s->start_rate, rtt, 1);
	u32 least = 2 * RSV_PROBE_MIN;

	if (tp->snd_cwnd_clamp && least > tp->snd_cwnd_clamp)
		least = tp->snd_cwnd_clamp;
	return w > least ? w : least;
}

/* The start in force while BBR is in STARTUP: at init, at the first data after idle and
 * on every ACK. */
static __always_inline void apply_start(struct sock *sk, struct rsv_settings *s,
					struct rsv_sock *st)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	u8 phase = st ? st->probe : RSV_PROBE_NONE;
	u64 rate, pace;
	u32 rtt;

	if (!s || !s->start_rate || mode_of(bbr_of(sk)) != BBR_STARTUP)
		return;
	rate = s->start_rate;
	pace = rate;
	rtt = path_rtt(sk, s);
	if (probed_start(s) && (phase == RSV_PROBE_SENDING || phase == RSV_PROBE_TIMING)) {
		/* The first round's data, sent as a train. */
		if (s->probe_rate > rate)
			pace = s->probe_rate;
		if (sk->sk_pacing_rate < pace)
			sk->sk_pacing_rate = pace;
		if (rtt)
			raise_cwnd(tp, probe_window(tp, s, rtt));
		return;
	} else if (st && phase == RSV_PROBE_DONE && st->found_rate > rate) {
		rate = st->found_rate;
		pace = rate;
	}
	if (sk->sk_pacing_rate < pace)
		sk->sk_pacing_rate = pace;
	if (rtt)
		raise_cwnd(tp, window_for(tp, rate, rtt, 2));
}

/* At the first data after idle: the train goes with it. Once per socket, in STARTUP.
 * The window is set to the round exactly (nothing is in flight here): a start already
 * raised, e.g. to twice start_rate x RTT while the login's small rounds went, must not
 * make the train longer than the round. */
static __always_inline void probe_arm(struct sock *sk, struct rsv_settings *s,
				      struct rsv_sock *st)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct bbr *bbr = bbr_of(sk);
	u32 rtt;

	if (!st || st->probe != RSV_PROBE_NONE || !probed_start(s))
		return;
	if (mode_of(bbr) != BBR_STARTUP || BPF_CORE_READ_BITFIELD(bbr, full_bw_reached))
		return;
	rtt = path_rtt(sk, s);
	if (!rtt)
		return;
	st->probe = RSV_PROBE_SENDING;
	tp->snd_cwnd = probe_window(tp, s, rtt);
}

/* After bbr_main, on each ACK: time the train's ACKs. */
static __always_inline void probe_time(struct sock *sk, struct rsv_settings *s,
				       struct rsv_sock *st, const struct rate_sample *rs, u64 now)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	u32 delivered = tp->delivered, got, rest, mss;
	u64 elapsed_us, rtt_us, rate;

	if (st->probe != RSV_PROBE_SENDING && st->probe != RSV_PROBE_TIMING)
		return;
	if (!probed_start(s) || mode_of(bbr_of(sk)) != BBR_STARTUP) {
		/* A share came, or BBR left STARTUP: no start to find any more. */
		st->probe = RSV_PROBE_DONE;
		return;
	}
	if (!rs->acked_sacked)
		return;
	if (st->probe == RSV_PROBE_SENDING) {
		rest = tp->packets_out;
		rest = rest > tp->sacked_out ? rest - tp->sacked_out : 0;
		if (rest + rs->acked_sacked < RSV_PROBE_MIN) {
			st->probe = RSV_PROBE_NONE;
			sk->sk_pacing_rate = s->start_rate;
			return;
		}
		st->probe = RSV_PROBE_TIMING;
		st->probe_t1_ns = now;
		st->probe_d1 = delivered;
		st->probe_rest = rest;
		return;
	}
	got = delivered - st->probe_d1;
	elapsed_us = (now - st->probe_t1_ns) / NSEC_PER_USEC;
	rtt_us = path_rtt(sk, s);
	if ((u64)got * 4 < (u64)st->probe_rest * 3) {
		if (!rtt_us || elapsed_us < rtt_us)
			return;
		if (got < 8 && elapsed_us < 2 * rtt_us)
			return;
	}
	st->probe = RSV_PROBE_DONE;
	if (got < 8 || !elapsed_us) {
		/* Nothing to time: the plain start. */
		sk->sk_pacing_rate = s->start_rate;
		return;
	}
	if (got > (1U << 24))
		got = 1U << 24;
	mss = tp->mss_cache ? tp->mss_cache : 1448;
	rate = (u64)got * mss * USEC_PER_SEC / elapsed_us;
	if (rate > s->probe_rate)
		rate = s->probe_rate;
	st->found_rate = rate;
	st->probe_pkts = got;
	st->probe_us = elapsed_us > 0xffffffffULL ? 0xffffffffU : (u32)elapsed_us;
	sk->sk_pacing_rate = rate > s->start_rate ? rate : s->start_rate;
}

SEC("struct_ops/rsv_init")
void BPF_PROG(rsv_init, struct sock *sk)
{
	struct rsv_sock *st;

	bbr_init(sk);
	st = bpf_sk_storage_get(&rsv_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st)
		state_start(sk, st);
	apply_start(sk, settings_of(sk), st);
}

SEC("struct_ops/rsv_release")
void BPF_PROG(rsv_release, struct sock *sk)
{
	struct rsv_sock *st = bpf_sk_storage_get(&rsv_state, sk, 0, 0);

	if (st)
		group_leave(st);
}

SEC("struct_ops/rsv_cong_control")
void BPF_PROG(rsv_cong_control, struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct rsv_settings *s = settings_of(sk);
	struct bbr *bbr = bbr_of(sk);
	u32 flags = s ? s->flags : 0;
	struct rsv_group *g = NULL;
	struct rsv_sock *st;
	u64 now = bpf_ktime_get_ns();
	u32 mode, rtt;
	bool queue, probing;

	st = bpf_sk_storage_get(&rsv_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st) {
		if (!st->id)
			state_start(sk, st);
		g = group_join(st, s ? s->group : 0);
	}

	if ((flags & RSV_NO_PROBE_RTT) && BPF_CORE_READ_BITFIELD(bbr, mode) != BBR_PROBE_RTT)
		bbr->min_rtt_stamp = (u32)bpf_jiffies64();
	else if (st && g)
		coordinate(sk, st, g, now);

	if (st)
		hold_before(sk, st, rs, now);

	bbr_main(sk, ack, flag, rs);

	if (st) {
		observe(sk, st, g, rs, now);
		probe_time(sk, s, st, rs, now);
		hold_after(sk, st, now);
	}

	apply_start(sk, s, st);

	probing = st && (st->probe == RSV_PROBE_SENDING || st->probe == RSV_PROBE_TIMING);
	mode = BPF_CORE_READ_BITFIELD(bbr, mode);
	rtt = path_rtt(sk, s);
	/* A queue: this ACK's RTT is more than 5/4 of the minimum. */
	queue = rtt && rs->rtt_us > 0 && (u64)rs->rtt_us * 4 > (u64)rtt * 5;
	/* Not while the probed round goes: its pacing is the probe's, not a rate the path
	 * was shown to carry, and a window of it would be a burst the bottleneck drops. */
	if (!(flags & RSV_BBR_LOSS) && rtt && rs->rtt_us > 0 && !queue && !probing &&
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
	if (event == CA_EVENT_TX_START) {
		struct rsv_settings *s = settings_of(sk);
		struct rsv_sock *st = bpf_sk_storage_get(&rsv_state, sk, 0, 0);

		probe_arm(sk, s, st);
		apply_start(sk, s, st);
	}
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
	.release = (void *)rsv_release,
	.cong_control = (void *)rsv_cong_control,
	.ssthresh = (void *)rsv_ssthresh,
	.undo_cwnd = (void *)rsv_undo_cwnd,
	.cwnd_event = (void *)rsv_cwnd_event,
	.set_state = (void *)rsv_set_state,
	.sndbuf_expand = (void *)rsv_sndbuf_expand,
	.min_tso_segs = (void *)rsv_min_tso_segs,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = RSV_CC_NAME,
};
