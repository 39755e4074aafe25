//! The link model of one direction, free of I/O and clocks so it can be driven by a fake clock.
//!
//! Order of the stages a packet meets (documented in the crate docs too):
//! 1. random loss (Bernoulli or Gilbert–Elliott), as on a lossy access line in front of the
//!    bottleneck: a lost packet never takes queue space;
//! 2. the drop-tail bottleneck queue, limited in bytes; a packet occupies it from its arrival
//!    until the end of its serialization;
//! 3. serialization at the bottleneck rate: it leaves at `max(now, last_departure) + size*8/rate`;
//! 4. the one-way propagation delay, plus optional jitter that never reorders packets.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// How packets are lost at random.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LossModel {
    /// Each packet independently with probability `p`.
    Bernoulli { p: f64 },
    /// Two-state Markov chain (good, bad) stepped once per packet: `p_gb` moves good→bad,
    /// `p_bg` bad→good; a packet is lost with `loss_g` in the good state, `loss_b` in the bad.
    GilbertElliott {
        p_gb: f64,
        p_bg: f64,
        loss_g: f64,
        loss_b: f64,
    },
}

impl LossModel {
    pub const NONE: LossModel = LossModel::Bernoulli { p: 0.0 };

    /// The long-run fraction of packets lost.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::Bernoulli { p } => p,
            LossModel::GilbertElliott {
                p_gb,
                p_bg,
                loss_g,
                loss_b,
            } => {
                if p_gb + p_bg == 0.0 {
                    return loss_g;
                }
                let bad = p_gb / (p_gb + p_bg);
                (1.0 - bad) * loss_g + bad * loss_b
            }
        }
    }

    /// Parses `P_GB,P_BG,LOSS_G,LOSS_B`, each a fraction or a percentage.
    pub fn parse_ge(s: &str) -> Result<LossModel, units::ParseError> {
        let parts: Vec<&str> = s.split(',').collect();
        if parts.len() != 4 {
            return Err(units::ParseError::new(
                "Gilbert-Elliott model",
                s,
                "want four values P_GB,P_BG,LOSS_G,LOSS_B",
            ));
        }
        let p: Vec<f64> = parts
            .iter()
            .map(|x| units::parse_probability(x))
            .collect::<Result<_, _>>()?;
        Ok(LossModel::GilbertElliott {
            p_gb: p[0],
            p_bg: p[1],
            loss_g: p[2],
            loss_b: p[3],
        })
    }
}

/// Everything that shapes one direction.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirParams {
    /// Bottleneck rate in bit/s; 0 means no rate limit (and then no queue).
    pub rate_bps: u64,
    /// One-way delay in nanoseconds.
    pub delay_ns: u64,
    /// Each packet's delay is moved by a uniform amount in [-jitter, +jitter], never reordering.
    pub jitter_ns: u64,
    pub loss: LossModel,
    /// Drop-tail limit of the bottleneck queue in bytes.
    pub queue_bytes: u64,
    /// The queue limit follows one BDP of the link when rate or delay change.
    pub queue_auto: bool,
}

impl DirParams {
    /// No shaping: no rate limit (so no queue), no delay, jitter or loss.
    pub const NONE: DirParams = DirParams {
        rate_bps: 0,
        delay_ns: 0,
        jitter_ns: 0,
        loss: LossModel::NONE,
        queue_bytes: 0,
        queue_auto: true,
    };

    /// Serialization time of `bytes` at this rate, in ns.
    pub fn serialization_ns(&self, bytes: u64) -> u64 {
        if self.rate_bps == 0 {
            0
        } else {
            ((bytes as u128 * 8 * 1_000_000_000 + self.rate_bps as u128 / 2)
                / self.rate_bps as u128) as u64
        }
    }
}

/// The default bottleneck queue: one bandwidth-delay product of the round trip, but never
/// less than 16 full-size packets so a short link still absorbs a burst.
pub fn default_queue_bytes(rate_bps: u64, rtt_ns: u64, mtu: u32) -> u64 {
    let bdp = (rate_bps as u128 * rtt_ns as u128 / 8 / 1_000_000_000) as u64;
    bdp.max(16 * mtu as u64)
}

/// A small fast generator (SplitMix64); statistical quality is ample for loss decisions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.next_f64() < p)
    }
}

/// The state of a loss model between packets.
#[derive(Clone, Debug)]
pub struct Loss {
    model: LossModel,
    bad: bool,
}

impl Loss {
    pub fn new(model: LossModel) -> Loss {
        Loss { model, bad: false }
    }

    pub fn set_model(&mut self, model: LossModel) {
        if model != self.model {
            self.model = model;
            self.bad = false;
        }
    }

    /// Whether the next packet is lost.
    pub fn lose(&mut self, rng: &mut Rng) -> bool {
        let LossModel::GilbertElliott {
            p_gb,
            p_bg,
            loss_g,
            loss_b,
        } = self.model
        else {
            // Bernoulli: its mean is its one probability.
            return rng.chance(self.model.mean_loss());
        };
        self.bad = if self.bad {
            !rng.chance(p_bg)
        } else {
            rng.chance(p_gb)
        };
        rng.chance(if self.bad { loss_b } else { loss_g })
    }
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCause {
    RandomLoss,
    QueueOverflow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Drop(DropCause),
    /// Hand the packet to the far side at this time (ns, same clock as `now`).
    Deliver(u64),
}

/// One direction of the link: loss, bottleneck queue, serialization, delay.
#[derive(Debug)]
pub struct Shaper {
    params: DirParams,
    loss: Loss,
    rng: Rng,
    /// Departure time (end of serialization) and size of each packet still in the bottleneck.
    bottleneck: VecDeque<(u64, u32)>,
    queued_bytes: u64,
    max_queued_bytes: u64,
    last_departure: u64,
    last_delivery: u64,
}

impl Shaper {
    pub fn new(params: DirParams, seed: u64) -> Shaper {
        Shaper {
            params,
            loss: Loss::new(params.loss),
            rng: Rng::new(seed),
            bottleneck: VecDeque::with_capacity(4096),
            queued_bytes: 0,
            max_queued_bytes: 0,
            last_departure: 0,
            last_delivery: 0,
        }
    }

    pub fn params(&self) -> &DirParams {
        &self.params
    }

    /// New parameters apply to packets arriving from now on; queued packets keep their times.
    pub fn set_params(&mut self, params: DirParams) {
        self.loss.set_model(params.loss);
        self.params = params;
    }

    /// Bytes in the bottleneck queue at `now`, including the packet being serialized.
    pub fn queued_bytes(&mut self, now: u64) -> u64 {
        self.advance(now);
        self.queued_bytes
    }

    pub fn queued_packets(&mut self, now: u64) -> usize {
        self.advance(now);
        self.bottleneck.len()
    }

    /// The largest queue seen since the shaper started.
    pub fn max_queued_bytes(&self) -> u64 {
        self.max_queued_bytes
    }

    fn advance(&mut self, now: u64) {
        while let Some(&(departure, size)) = self.bottleneck.front() {
            if departure > now {
                break;
            }
            self.queued_bytes -= size as u64;
            self.bottleneck.pop_front();
        }
    }

    /// Decides the fate of a packet of `size` bytes arriving at `now`.
    pub fn admit(&mut self, now: u64, size: u32) -> Verdict {
        self.advance(now);
        if self.loss.lose(&mut self.rng) {
            return Verdict::Drop(DropCause::RandomLoss);
        }
        let departure = if self.params.rate_bps == 0 {
            now
        } else {
            if self.queued_bytes + size as u64 > self.params.queue_bytes {
                return Verdict::Drop(DropCause::QueueOverflow);
            }
            let start = now.max(self.last_departure);
            let departure = start + self.params.serialization_ns(size as u64);
            self.last_departure = departure;
            self.bottleneck.push_back((departure, size));
            self.queued_bytes += size as u64;
            self.max_queued_bytes = self.max_queued_bytes.max(self.queued_bytes);
            departure
        };
        let mut delivery = departure + self.params.delay_ns;
        if self.params.jitter_ns > 0 {
            let j = self.params.jitter_ns as f64;
            let offset = (self.rng.next_f64() * 2.0 - 1.0) * j;
            delivery = (delivery as f64 + offset).max(departure as f64) as u64;
        }
        // Jitter and a shortened delay must not overtake packets already on the wire.
        delivery = delivery.max(self.last_delivery);
        self.last_delivery = delivery;
        Verdict::Deliver(delivery)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn params(rate_bps: u64, delay_ns: u64, queue_bytes: u64) -> DirParams {
        DirParams {
            rate_bps,
            delay_ns,
            jitter_ns: 0,
            loss: LossModel::NONE,
            queue_bytes,
            queue_auto: false,
        }
    }

    #[test]
    fn serialization_then_delay() {
        // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms on the wire.
        let mut s = Shaper::new(params(12_000_000, 10 * MS, 1_000_000), 1);
        assert_eq!(s.admit(0, 1500), Verdict::Deliver(11 * MS));
        // Arrives while the first is still serializing: waits for it.
        assert_eq!(s.admit(MS / 2, 1500), Verdict::Deliver(12 * MS));
        assert_eq!(s.queued_bytes(MS / 2), 3000);
        assert_eq!(s.queued_bytes(MS), 1500);
        assert_eq!(s.queued_bytes(2 * MS), 0);
        // An idle link serializes from the arrival time.
        assert_eq!(
            s.admit(5 * MS, 750),
            Verdict::Deliver(5 * MS + MS / 2 + 10 * MS)
        );
    }

    #[test]
    fn back_to_back_burst_leaves_at_line_rate() {
        let rate = 1_000_000_000;
        let mut s = Shaper::new(params(rate, 0, u64::MAX), 1);
        let mut last = 0;
        for _ in 0..1000 {
            match s.admit(0, 1500) {
                Verdict::Deliver(t) => last = t,
                v => panic!("{v:?}"),
            }
        }
        // 1000 * 1500 B at 1 Gbit/s = 12 ms.
        assert_eq!(last, 12 * MS);
    }

    #[test]
    fn drop_tail_queue_in_bytes() {
        // 4500 bytes of queue hold three full packets of a burst; the rest are dropped.
        let mut s = Shaper::new(params(12_000_000, 0, 4500), 1);
        let verdicts: Vec<_> = (0..5).map(|_| s.admit(0, 1500)).collect();
        assert_eq!(verdicts[2], Verdict::Deliver(3 * MS));
        assert_eq!(verdicts[3], Verdict::Drop(DropCause::QueueOverflow));
        assert_eq!(verdicts[4], Verdict::Drop(DropCause::QueueOverflow));
        assert_eq!(s.max_queued_bytes(), 4500);
        // After one packet has left there is room for one more, behind the others.
        assert_eq!(s.admit(MS, 1500), Verdict::Deliver(4 * MS));
        assert_eq!(s.admit(MS, 1500), Verdict::Drop(DropCause::QueueOverflow));
    }

    #[test]
    fn unlimited_rate_is_pure_delay() {
        let mut s = Shaper::new(params(0, 50 * MS, 0), 1);
        assert_eq!(s.admit(7, 1500), Verdict::Deliver(50 * MS + 7));
        assert_eq!(s.queued_bytes(7), 0);
    }

    #[test]
    fn jitter_never_reorders_and_keeps_the_mean() {
        let mut p = params(0, 20 * MS, 0);
        p.jitter_ns = MS;
        let mut s = Shaper::new(p, 42);
        let mut last = 0;
        let mut sum = 0f64;
        let n = 10_000u64;
        for i in 0..n {
            let now = i * 10 * MS;
            let Verdict::Deliver(t) = s.admit(now, 100) else {
                panic!()
            };
            assert!(t >= last);
            assert!(t >= now + 19 * MS && t <= now + 21 * MS);
            last = t;
            sum += (t - now) as f64;
        }
        let mean = sum / n as f64;
        assert!((mean - 20e6).abs() < 0.02e6, "mean delay {mean}");
    }

    #[test]
    fn shortening_the_delay_does_not_reorder() {
        let mut s = Shaper::new(params(0, 50 * MS, 0), 1);
        assert_eq!(s.admit(0, 100), Verdict::Deliver(50 * MS));
        s.set_params(params(0, 10 * MS, 0));
        assert_eq!(s.admit(MS, 100), Verdict::Deliver(50 * MS));
        assert_eq!(s.admit(45 * MS, 100), Verdict::Deliver(55 * MS));
    }

    #[test]
    fn loss_happens_before_the_queue() {
        let mut p = params(12_000_000, 0, 1500);
        p.loss = LossModel::Bernoulli { p: 1.0 };
        let mut s = Shaper::new(p, 1);
        assert_eq!(s.admit(0, 1500), Verdict::Drop(DropCause::RandomLoss));
        assert_eq!(s.queued_bytes(0), 0);
        p.loss = LossModel::NONE;
        s.set_params(p);
        assert_eq!(s.admit(0, 1500), Verdict::Deliver(MS));
    }

    fn measured_loss(model: LossModel, n: u32) -> f64 {
        let mut loss = Loss::new(model);
        let mut rng = Rng::new(7);
        let lost = (0..n).filter(|_| loss.lose(&mut rng)).count();
        lost as f64 / n as f64
    }

    #[test]
    fn bernoulli_rate() {
        let p = measured_loss(LossModel::Bernoulli { p: 0.02 }, 1_000_000);
        // 99.9 % binomial interval: 0.02 ± 3.3 * sqrt(0.02*0.98/1e6).
        assert!((p - 0.02).abs() < 0.00047, "{p}");
    }

    #[test]
    fn gilbert_elliott_steady_state() {
        let model = LossModel::GilbertElliott {
            p_gb: 0.01,
            p_bg: 0.3,
            loss_g: 0.001,
            loss_b: 0.5,
        };
        let expected = model.mean_loss();
        let pi_bad = 0.01 / 0.31;
        assert!((expected - ((1.0 - pi_bad) * 0.001 + pi_bad * 0.5)).abs() < 1e-12);
        let p = measured_loss(model, 2_000_000);
        assert!(
            (p - expected).abs() / expected < 0.03,
            "measured {p}, expected {expected}"
        );
    }

    #[test]
    fn gilbert_elliott_losses_come_in_bursts() {
        let mut loss = Loss::new(LossModel::GilbertElliott {
            p_gb: 0.001,
            p_bg: 0.1,
            loss_g: 0.0,
            loss_b: 1.0,
        });
        let mut rng = Rng::new(3);
        let seq: Vec<bool> = (0..1_000_000).map(|_| loss.lose(&mut rng)).collect();
        let lost = seq.iter().filter(|&&l| l).count() as f64;
        let bursts = seq.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        // Mean burst length is 1/p_bg = 10 packets.
        let mean_burst = lost / bursts;
        assert!((mean_burst - 10.0).abs() < 1.0, "{mean_burst}");
    }

    #[test]
    fn parse_gilbert_elliott() {
        assert_eq!(
            LossModel::parse_ge("1%,30%,0,50%").unwrap(),
            LossModel::GilbertElliott {
                p_gb: 0.01,
                p_bg: 0.3,
                loss_g: 0.0,
                loss_b: 0.5
            }
        );
        assert!(LossModel::parse_ge("1%,30%").is_err());
        assert!(LossModel::parse_ge("1%,30%,x,1").is_err());
    }

    #[test]
    fn default_queue_is_one_bdp() {
        assert_eq!(default_queue_bytes(100_000_000, 100 * MS, 1500), 1_250_000);
        assert_eq!(default_queue_bytes(1_000_000, MS, 1500), 24_000);
    }
}
