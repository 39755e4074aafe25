//! The path cache: the rate a long path carried in an earlier session with the same peer,
//! remembered with its age, so that the next session starts near it instead of from ten
//! packets (issue 21, "a start informed by what is known"; `docs/congestion.md`).
//!
//! Sans-IO: [`PathCache`] parses, prints, merges and answers; [`load`] and [`save`] are
//! the file I/O at the edge. The file is plain text, one peer a line:
//!
//! ```text
//! # reservoir path cache v1: peer rate_bytes_per_s min_rtt_us saved_unix_s
//! 10.0.0.2 12500000 100250 1764061200
//! ```
//!
//! Only long paths are kept ([`MIN_RTT`]): below it a session's start costs nothing worth
//! remembering, and loopback and LAN runs (tests among them) never meet a remembered rate.
//! An entry older than [`MAX_AGE`] is not recalled. A rate that is too high for today's
//! path costs a few round trips, not the transfer: it is only a start (`rsv` drops it
//! when BBR leaves STARTUP) and the sizes planned from it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Paths with a shorter minimum RTT are neither remembered nor recalled.
pub const MIN_RTT: Duration = Duration::from_millis(10);
/// An entry older than this is not recalled (and is dropped at the next save).
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Peers kept; the oldest entries go first.
pub const CAPACITY: usize = 256;

const HEADER: &str = "# reservoir path cache v1: peer rate_bytes_per_s min_rtt_us saved_unix_s";

/// What a session learnt of its path to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathEntry {
    /// The rate the session moved while it had work queued, bytes per second (payload).
    pub rate: u64,
    /// The path's minimum RTT, microseconds.
    pub min_rtt_us: u32,
    /// When it was learnt, seconds since the Unix epoch.
    pub saved: u64,
}

impl PathEntry {
    /// Its age at `now` (seconds since the epoch); an entry from the future is new.
    pub fn age(&self, now: u64) -> Duration {
        Duration::from_secs(now.saturating_sub(self.saved))
    }
}

/// Peers and what was learnt of the path to each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathCache {
    entries: BTreeMap<String, PathEntry>,
}

impl PathCache {
    /// Reads the file's text. Lines it cannot read (another version, a torn write) are
    /// skipped: the cache is advice, never a reason to fail a session.
    pub fn parse(text: &str) -> PathCache {
        let mut c = PathCache::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let [peer, rate, rtt, saved] = f[..] else {
                continue;
            };
            let (Ok(rate), Ok(min_rtt_us), Ok(saved)) = (rate.parse(), rtt.parse(), saved.parse())
            else {
                continue;
            };
            if rate == 0 {
                continue;
            }
            c.put(
                peer,
                PathEntry {
                    rate,
                    min_rtt_us,
                    saved,
                },
            );
        }
        c
    }

    /// The file's text, newest entries last.
    pub fn print(&self) -> String {
        let mut rows: Vec<(&String, &PathEntry)> = self.entries.iter().collect();
        rows.sort_by_key(|(p, e)| (e.saved, p.as_str()));
        let mut s = String::from(HEADER);
        s.push('\n');
        for (peer, e) in rows {
            s.push_str(&format!("{peer} {} {} {}\n", e.rate, e.min_rtt_us, e.saved));
        }
        s
    }

    /// What is known of the path to `peer` at `now`, if it is a long path learnt within
    /// [`MAX_AGE`].
    pub fn recall(&self, peer: &str, now: u64) -> Option<PathEntry> {
        self.entries
            .get(peer)
            .copied()
            .filter(|e| e.age(now) <= MAX_AGE && long_path(e.min_rtt_us))
    }

    /// Keeps `e` for `peer` if the path is long and `e` is newer than what is known;
    /// returns whether it was kept.
    pub fn remember(&mut self, peer: &str, e: PathEntry) -> bool {
        if e.rate == 0 || !long_path(e.min_rtt_us) || peer.is_empty() || peer.contains(' ') {
            return false;
        }
        self.put(peer, e)
    }

    fn put(&mut self, peer: &str, e: PathEntry) -> bool {
        if self
            .entries
            .get(peer)
            .is_some_and(|old| old.saved > e.saved)
        {
            return false;
        }
        self.entries.insert(peer.to_owned(), e);
        while self.entries.len() > CAPACITY {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(p, e)| (e.saved, p.as_str()))
                .map(|(p, _)| p.clone());
            if let Some(p) = oldest {
                self.entries.remove(&p);
            }
        }
        true
    }

    /// Takes from `other` every entry newer than this one's (another process saved the file
    /// meanwhile), and drops what is older than [`MAX_AGE`] at `now`.
    pub fn merge(&mut self, other: &PathCache, now: u64) {
        for (p, e) in &other.entries {
            self.put(p, *e);
        }
        self.entries.retain(|_, e| e.age(now) <= MAX_AGE);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn long_path(min_rtt_us: u32) -> bool {
    u128::from(min_rtt_us) >= MIN_RTT.as_micros()
}

/// Where the cache lives: `RSV_PATH_CACHE` (`off` or empty: nowhere), else
/// `$XDG_CACHE_HOME/reservoir/paths`, else `$HOME/.cache/reservoir/paths`.
pub fn default_file() -> Option<PathBuf> {
    file_from(|k| std::env::var_os(k))
}

fn file_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(v) = var("RSV_PATH_CACHE") {
        return (!v.is_empty() && v != "off").then(|| PathBuf::from(v));
    }
    let base = var("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            var("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("reservoir").join("paths"))
}

/// The cache in `file`; empty when there is none yet.
pub fn load(file: &Path) -> io::Result<PathCache> {
    match std::fs::read_to_string(file) {
        Ok(t) => Ok(PathCache::parse(&t)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(PathCache::default()),
        Err(e) => Err(e),
    }
}

/// Remembers `e` for `peer` in `file`: read, merged, written to a temporary file and
/// renamed over it, so that a reader never sees half a file and two savers at once lose
/// at most one another's newest line.
pub fn save(file: &Path, peer: &str, e: PathEntry, now: u64) -> io::Result<bool> {
    let mut c = PathCache::default();
    if !c.remember(peer, e) {
        return Ok(false);
    }
    let on_disk = load(file)?;
    let mut merged = on_disk;
    merged.merge(&c, now);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // One temporary name per save: sessions of one process (`rsv sync`'s many) may save
    // at once.
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = file.with_extension(format!("tmp.{}.{n}", std::process::id()));
    std::fs::write(&tmp, merged.print())?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(true)
}

/// Seconds since the Unix epoch now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(rate: u64, rtt_ms: u32, saved: u64) -> PathEntry {
        PathEntry {
            rate,
            min_rtt_us: rtt_ms * 1000,
            saved,
        }
    }

    #[test]
    fn remembers_long_paths_only_and_recalls_them_while_young() {
        let mut c = PathCache::default();
        assert!(!c.remember("127.0.0.1", e(5_000_000_000, 0, 100)));
        assert!(!c.remember("10.0.0.9", e(1_000_000, 9, 100)));
        assert!(c.remember("10.0.0.2", e(12_500_000, 100, 100)));
        assert_eq!(c.len(), 1);
        assert_eq!(c.recall("10.0.0.2", 100).unwrap().rate, 12_500_000);
        let day = MAX_AGE.as_secs();
        assert!(c.recall("10.0.0.2", 100 + day).is_some());
        assert!(c.recall("10.0.0.2", 101 + day).is_none());
        assert!(c.recall("10.0.0.3", 100).is_none());
    }

    #[test]
    fn an_older_entry_does_not_replace_a_newer_one() {
        let mut c = PathCache::default();
        assert!(c.remember("h", e(2, 50, 200)));
        assert!(!c.remember("h", e(1, 50, 199)));
        assert!(c.remember("h", e(3, 50, 200)));
        assert_eq!(c.recall("h", 200).unwrap().rate, 3);
    }

    #[test]
    fn prints_and_parses_back_skipping_what_it_cannot_read() {
        let mut c = PathCache::default();
        c.remember("10.0.0.2", e(12_500_000, 100, 1_000));
        c.remember("[fd00::2]", e(62_500_000, 300, 900));
        let text = c.print();
        assert!(text.starts_with("# reservoir path cache v1"));
        // The newest last.
        assert!(text.find("fd00").unwrap() < text.find("10.0.0.2").unwrap());
        assert_eq!(PathCache::parse(&text), c);
        let torn = format!("{text}10.0.0.7 12 13\nnot a line at all\n10.0.0.8 x 1 2\n");
        assert_eq!(PathCache::parse(&torn), c);
    }

    #[test]
    fn merge_keeps_the_newest_and_drops_the_stale() {
        let mut a = PathCache::default();
        a.remember("x", e(1, 50, 1_000));
        a.remember("old", e(1, 50, 10));
        let mut b = PathCache::default();
        b.remember("x", e(2, 50, 2_000));
        b.remember("y", e(3, 50, 1_500));
        a.merge(&b, 2_000 + MAX_AGE.as_secs() - 500);
        assert_eq!(a.recall("x", 2_000).unwrap().rate, 2);
        assert_eq!(a.recall("y", 2_000).unwrap().rate, 3);
        assert_eq!(a.len(), 2, "the stale entry is dropped");
    }

    #[test]
    fn capacity_drops_the_oldest() {
        let mut c = PathCache::default();
        for i in 0..CAPACITY as u64 + 3 {
            c.remember(&format!("p{i}"), e(1, 50, 1_000 + i));
        }
        assert_eq!(c.len(), CAPACITY);
        assert!(c.recall("p0", 1_000).is_none());
        assert!(c.recall(&format!("p{}", CAPACITY + 2), 1_000).is_some());
    }

    #[test]
    fn file_location_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(file_from(env(&[("RSV_PATH_CACHE", "off")])), None);
        assert_eq!(file_from(env(&[("RSV_PATH_CACHE", "")])), None);
        assert_eq!(
            file_from(env(&[("RSV_PATH_CACHE", "/x/p"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/p"))
        );
        assert_eq!(
            file_from(env(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c/reservoir/paths"))
        );
        assert_eq!(
            file_from(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/reservoir/paths"))
        );
        assert_eq!(file_from(env(&[])), None);
    }

    #[test]
    fn save_merges_with_the_file_and_load_reads_it_back() {
        let dir = std::env::temp_dir().join(format!("rsv-paths-{}", std::process::id()));
        let file = dir.join("sub").join("paths");
        let now = 10_000;
        assert!(load(&file).unwrap().is_empty());
        assert!(save(&file, "a", e(1, 50, now), now).unwrap());
        assert!(save(&file, "b", e(2, 50, now), now).unwrap());
        assert!(!save(&file, "lo", e(2, 1, now), now).unwrap());
        let c = load(&file).unwrap();
        assert_eq!(c.recall("a", now).unwrap().rate, 1);
        assert_eq!(c.recall("b", now).unwrap().rate, 2);
        assert!(c.recall("lo", now).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
