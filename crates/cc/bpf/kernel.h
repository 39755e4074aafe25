/* The few kernel types rsv.bpf.c uses, each with only the members it touches.
 *
 * Every struct carries preserve_access_index, so clang records a CO-RE relocation for each
 * member access and libbpf moves it to the running kernel's offset (read from its BTF,
 * /sys/kernel/btf/vmlinux) at load time: this header states names, not layouts, and need
 * not follow kernel versions. tcp_congestion_ops is matched member by member, by name, to
 * the kernel's own when libbpf builds the struct_ops value. */
#ifndef RSV_KERNEL_H
#define RSV_KERNEL_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_SK_STORAGE = 24,
};

enum {
	BPF_F_NO_PREALLOC = 1,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

/* The verifier finds a map value's lock by this name in the program's BTF. */
struct bpf_spin_lock {
	__u32 val;
};

enum {
	BPF_SK_STORAGE_GET_F_CREATE = 1,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct sock {
	u32 sk_pacing_status;
	unsigned long sk_pacing_rate;
	unsigned long sk_max_pacing_rate;
};

struct inet_connection_sock {
	u8 icsk_ca_state : 5;
	u64 icsk_ca_priv[13];
};

struct tcp_sock {
	u32 delivered;
	u32 packets_out;
	u32 sacked_out;
	u32 lost_out;
	u32 retrans_out;
	u32 snd_cwnd;
	u32 snd_cwnd_clamp;
	u32 snd_ssthresh;
	u32 srtt_us;
	u32 mss_cache;
};

struct rate_sample {
	u32 prior_delivered;
	long rtt_us;
	int losses;
	u32 acked_sacked;
	bool is_app_limited;
};

struct ack_sample;
struct module;

struct list_head {
	struct list_head *next, *prev;
};

enum tcp_ca_event {
	CA_EVENT_TX_START = 0,
};

struct tcp_congestion_ops {
	u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, u32 ack, u32 acked);
	void (*set_state)(struct sock *sk, u8 new_state);
	void (*cwnd_event)(struct sock *sk, enum tcp_ca_event ev);
	void (*in_ack_event)(struct sock *sk, u32 flags);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	u32 (*min_tso_segs)(struct sock *sk);
	void (*cong_control)(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs);
	u32 (*undo_cwnd)(struct sock *sk);
	u32 (*sndbuf_expand)(struct sock *sk);
	char name[16];
	u32 flags;
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
};

/* include/linux/win_minmax.h: BBR's windowed max-bandwidth filter; s[0] is the best. */
struct minmax_sample {
	u32 t;
	u32 v;
};

struct minmax {
	struct minmax_sample s[3];
};

/* BBRv1's private state (net/ipv4/tcp_bbr.c), kept in icsk_ca_priv. */
struct bbr {
	u32 min_rtt_us;
	u32 min_rtt_stamp;
	u32 probe_rtt_done_stamp; /* jiffies; 0 until PROBE_RTT's hold has begun */
	struct minmax bw;         /* packets per usec << 24 (BW_SCALE) */
	u32 next_rtt_delivered;   /* tp->delivered at which the next round begins */
	u32 mode : 3;
	u32 lt_use_bw : 1;
	u32 full_bw_reached : 1;
	u32 lt_bw;                /* the long-term (policed) rate, same unit */
};

#pragma clang attribute pop

#endif
