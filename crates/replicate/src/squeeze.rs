//! Whether a send compresses its units on the wire: decided per stream, as it goes, from
//! what compression did to the units tried (sans-IO; the agent compresses and times).
//!
//! Compression pays when the stream then moves more of the volume per second: without it
//! the stream moves its wire rate `w` (the pacing share, or what its connections deliver);
//! with it, `w / r` at a ratio `r` (frame bytes over data bytes), but no more than the
//! compressors keep up with (`threads` times one compressor's speed). So a unit is
//! compressed while `min(w / r, threads × speed) ≥ GAIN × w` and `r ≤ WORTH`; with no rate
//! known yet (an unpaced start) the ratio alone decides. The first [`FIRST_PROBES`] units
//! are tried, counted as they are handed out, not as their results come back: a stream
//! hands out a whole window of units (dozens on a long path) before the first compression
//! ends, and counting results tried them all, a window of 1 MiB compressions per stream
//! for nothing on data that does not compress (R2: a third of the source's CPU). While
//! compression is off, one unit in [`PROBE_EVERY`] is tried again, so a volume
//! whose data changes from incompressible to text turns it on, and the other way round.
//! A unit tried and found not to shrink by [`WORTH`] goes as it is.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the user asked for (`rsv sync --compress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Never: every unit as plain iSCSI writes.
    Off,
    /// When it pays, decided as the stream goes.
    #[default]
    Auto,
    /// Every unit that shrinks, whatever the rates.
    On,
}

/// A frame must be at most this share of its data to be worth sending instead.
pub const WORTH: f64 = 0.9;
/// Compression must move the volume this much faster than the plain stream.
pub const GAIN: f64 = 1.1;
/// Units tried at the start of a stream.
pub const FIRST_PROBES: u32 = 4;
/// While off, one unit in this many is tried.
pub const PROBE_EVERY: u32 = 32;
/// Weight of the newest sample in the running ratio and speed.
const ALPHA: f64 = 0.5;
/// zstd's level: its fastest standard one. Higher levels compress text a little better at
/// a fraction of the speed, and a stream that cannot keep up gains nothing.
pub const LEVEL: i32 = 1;

/// A stream's compression decision.
#[derive(Clone, Debug)]
pub struct Adaptive {
    mode: Mode,
    threads: f64,
    /// Running frame/data ratio of the units tried.
    ratio: Option<f64>,
    /// Running data bytes per second of one compression.
    speed: Option<f64>,
    samples: u32,
    /// Of the first probes, those handed out (their samples may not be back yet).
    first_tried: u32,
    /// Units not tried since the last one tried, while off.
    since_probe: u32,
    on: bool,
}

impl Adaptive {
    /// `threads`: compressions that may run at once (the cores the agent may use).
    pub fn new(mode: Mode, threads: usize) -> Adaptive {
        Adaptive {
            mode,
            threads: threads.max(1) as f64,
            ratio: None,
            speed: None,
            samples: 0,
            first_tried: 0,
            since_probe: 0,
            on: mode == Mode::On,
        }
    }

    /// Whether to compress the next unit (to send it so, or to try). Asked as the unit is
    /// handed out, before the result of any compression still running is known.
    pub fn compress_next(&mut self) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::On => true,
            Mode::Auto if self.on => true,
            Mode::Auto if self.first_tried < FIRST_PROBES => {
                self.first_tried += 1;
                true
            }
            // The first probes are out, their samples not all back: wait for them.
            Mode::Auto if self.samples < FIRST_PROBES => false,
            Mode::Auto => {
                self.since_probe += 1;
                if self.since_probe >= PROBE_EVERY {
                    self.since_probe = 0;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// A unit [`Adaptive::compress_next`] chose was not compressed after all (it held only
    /// zeros, sent as such): the probe goes to a later unit.
    pub fn not_tried(&mut self) {
        if self.mode != Mode::Auto || self.on {
            return;
        }
        if self.samples < FIRST_PROBES && self.first_tried > self.samples {
            self.first_tried -= 1;
        } else {
            self.since_probe = PROBE_EVERY - 1;
        }
    }

    /// A unit of `data` bytes was compressed to `frame` bytes in `took`; the stream's
    /// wire rate is `rate` bytes per second, when known.
    pub fn sample(&mut self, data: usize, frame: usize, took: Duration, rate: Option<u64>) {
        if data == 0 {
            return;
        }
        let r = frame as f64 / data as f64;
        let s = data as f64 / took.as_secs_f64().max(1e-6);
        let ewma = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + ALPHA * (new - o)));
        self.ratio = ewma(self.ratio, r);
        self.speed = ewma(self.speed, s);
        self.samples += 1;
        if self.mode == Mode::Auto {
            self.on = self.pays(rate);
        }
    }

    /// Whether compression pays at wire rate `rate`, by what the units tried showed.
    pub fn pays(&self, rate: Option<u64>) -> bool {
        let (Some(r), Some(speed)) = (self.ratio, self.speed) else {
            return false;
        };
        if r > WORTH {
            return false;
        }
        match rate.filter(|&w| w > 0) {
            Some(w) => {
                let w = w as f64;
                (w / r).min(self.threads * speed) >= GAIN * w
            }
            None => true,
        }
    }

    /// Whether units are being compressed now.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The running frame/data ratio of the units tried.
    pub fn ratio(&self) -> Option<f64> {
        self.ratio
    }
}

/// Whether a unit of `data` bytes compressed to `frame` bytes goes as the frame.
pub fn worth_sending(data: usize, frame: usize) -> bool {
    (frame as f64) <= data as f64 * WORTH
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    /// Feeds `n` units of `ratio` compressed at `speed` MB/s; how many were tried.
    fn feed(a: &mut Adaptive, n: u32, ratio: f64, speed: f64, rate: Option<u64>) -> u32 {
        let mut tried = 0;
        for _ in 0..n {
            if a.compress_next() {
                tried += 1;
                let took = Duration::from_secs_f64(1.0 / speed);
                a.sample(MB, (MB as f64 * ratio) as usize, took, rate);
            }
        }
        tried
    }

    #[test]
    fn incompressible_data_is_tried_then_left_alone() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        let tried = feed(&mut a, 4 + 320, 1.0, 500.0, Some(40_000_000));
        assert!(!a.is_on());
        // The first units, then one in PROBE_EVERY.
        assert_eq!(tried, FIRST_PROBES + 320 / PROBE_EVERY);
    }

    #[test]
    fn text_over_a_slow_link_is_compressed() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        let tried = feed(&mut a, 100, 0.4, 300.0, Some(40_000_000));
        assert!(a.is_on());
        assert_eq!(tried, 100);
        assert!((a.ratio().unwrap() - 0.4).abs() < 1e-4);
    }

    #[test]
    fn a_compressor_slower_than_the_link_is_not_used() {
        // 2:1 data, one core compressing 30 MB/s, a 100 MB/s stream: 30 < 110.
        let mut a = Adaptive::new(Mode::Auto, 1);
        feed(&mut a, 50, 0.5, 30.0, Some(100_000_000));
        assert!(!a.is_on());
        // The same on a 20 MB/s stream pays: min(40, 30) ≥ 22.
        let mut a = Adaptive::new(Mode::Auto, 1);
        feed(&mut a, 50, 0.5, 30.0, Some(20_000_000));
        assert!(a.is_on());
        // Two cores double what the compressors keep up with.
        let mut a = Adaptive::new(Mode::Auto, 4);
        feed(&mut a, 50, 0.5, 30.0, Some(100_000_000));
        assert!(a.is_on());
    }

    #[test]
    fn a_small_gain_does_not_pay() {
        let mut a = Adaptive::new(Mode::Auto, 8);
        feed(&mut a, 50, 0.95, 1000.0, Some(10_000_000));
        assert!(!a.is_on());
        // No rate known: the ratio alone.
        let mut a = Adaptive::new(Mode::Auto, 8);
        feed(&mut a, 50, 0.5, 1000.0, None);
        assert!(a.is_on());
    }

    #[test]
    fn a_window_handed_out_before_any_result_tries_only_the_first_probes() {
        // A long path's stream hands out dozens of units before the first compression
        // ends: only FIRST_PROBES of them are tried (all of them were, before).
        let mut a = Adaptive::new(Mode::Auto, 2);
        let window = (0..64).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(window, FIRST_PROBES);
        // Their results: random data. Off, then one unit in PROBE_EVERY.
        for _ in 0..FIRST_PROBES {
            a.sample(MB, MB + 40, Duration::from_millis(2), Some(12_500_000));
        }
        assert!(!a.is_on());
        let later = (0..PROBE_EVERY * 4).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(later, 4);
        // Text: the first window's probes turn it on once their results are back, and
        // every unit is then compressed.
        let mut t = Adaptive::new(Mode::Auto, 2);
        assert_eq!(
            (0..64).filter(|_| t.compress_next()).count() as u32,
            FIRST_PROBES
        );
        for _ in 0..FIRST_PROBES {
            t.sample(MB, MB / 3, Duration::from_millis(2), Some(12_500_000));
        }
        assert!(t.is_on());
        assert_eq!((0..10).filter(|_| t.compress_next()).count(), 10);
    }

    #[test]
    fn a_probe_on_a_unit_of_zeros_goes_to_the_next_unit() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        assert!(a.compress_next());
        a.not_tried();
        let tried = (0..64).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(tried, FIRST_PROBES);
        for _ in 0..FIRST_PROBES {
            a.sample(MB, MB, Duration::from_millis(2), None);
        }
        // Off: the periodic probe lands on zeros, the next unit is tried instead.
        let mut n = 0;
        while !a.compress_next() {
            n += 1;
        }
        assert_eq!(n, PROBE_EVERY - 1);
        a.not_tried();
        assert!(a.compress_next());
    }

    #[test]
    fn the_decision_follows_the_data() {
        let rate = Some(40_000_000);
        let mut a = Adaptive::new(Mode::Auto, 2);
        feed(&mut a, 20, 1.0, 500.0, rate);
        assert!(!a.is_on());
        // The volume turns to text: the next probe finds it (within PROBE_EVERY units).
        feed(&mut a, PROBE_EVERY, 0.3, 500.0, rate);
        assert!(a.is_on());
        // And back to random data: every unit is tried while on, so it turns off within a
        // few units (the running ratio from 0.3: 0.65, 0.83, 0.91).
        feed(&mut a, 2, 1.0, 500.0, rate);
        assert!(a.is_on());
        feed(&mut a, 1, 1.0, 500.0, rate);
        assert!(!a.is_on());
    }

    #[test]
    fn modes_off_and_on() {
        let mut off = Adaptive::new(Mode::Off, 2);
        assert_eq!(feed(&mut off, 100, 0.1, 1000.0, None), 0);
        let mut on = Adaptive::new(Mode::On, 1);
        assert_eq!(feed(&mut on, 10, 1.0, 1.0, Some(1 << 30)), 10);
        assert!(on.is_on());
    }

    #[test]
    fn frames_worth_sending() {
        assert!(worth_sending(MB, MB / 2));
        assert!(!worth_sending(MB, MB * 95 / 100));
        assert!(!worth_sending(MB, MB + 10));
    }
}
