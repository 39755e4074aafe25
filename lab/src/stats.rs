//! Repeated measurements (`rsv-lab run --repeat N`): each row of a scenario runs N times,
//! interleaved with the others, and the results give its median and its spread, so that a
//! one-off outlier shows as such instead of standing for the point.

use crate::r0::Row;
use serde::{Deserialize, Serialize};

/// The median of a row's repetitions and their range.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// How many repetitions gave a figure.
    pub n: usize,
    /// The middle figure (with an even count, the mean of the two middle ones).
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` when there is no finite figure.
    pub fn of(xs: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = xs.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            n,
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    /// `median` alone for one figure, `median (min–max)` for several, with `digits`
    /// decimals and `unit` after the median.
    pub fn show(&self, digits: usize, unit: &str) -> String {
        if self.n > 1 {
            format!(
                "{:.digits$}{unit} ({:.digits$}–{:.digits$})",
                self.median, self.min, self.max
            )
        } else {
            format!("{:.digits$}{unit}", self.median)
        }
    }
}

/// One row of a point (a configuration in one direction) over its repetitions.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RowSummary {
    pub direction: String,
    pub config: String,
    /// Repetitions run, and how many of them failed (no figure: they are not in the spreads).
    pub runs: usize,
    pub failed: usize,
    pub mbit_per_s: Option<Spread>,
    /// When the bottleneck first ran full (s after the first command), for `rsv bench` rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_after_s: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_pct: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_start_s: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_later_s: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<Spread>,
}

/// The rows grouped by (direction, configuration), in the order they first appear.
pub fn summarize<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Vec<RowSummary> {
    let mut groups: Vec<(&str, &str, Vec<&Row>)> = Vec::new();
    for r in rows {
        match groups
            .iter_mut()
            .find(|(d, c, _)| *d == r.direction && *c == r.config)
        {
            Some((_, _, v)) => v.push(r),
            None => groups.push((r.direction.as_str(), r.config.as_str(), vec![r])),
        }
    }
    groups
        .into_iter()
        .map(|(direction, config, rows)| {
            let ok: Vec<&Row> = rows.iter().copied().filter(|r| r.ok()).collect();
            let link = |f: fn(&crate::busy::LinkUse) -> f64| {
                Spread::of(ok.iter().filter_map(|r| r.link.as_ref().map(f)))
            };
            RowSummary {
                direction: direction.into(),
                config: config.into(),
                runs: rows.len(),
                failed: rows.len() - ok.len(),
                mbit_per_s: Spread::of(ok.iter().map(|r| r.mbit_per_s)),
                full_after_s: link(|u| u.start_s),
                busy_pct: link(|u| u.busy_pct),
                lost_start_s: link(|u| u.lost_start_s),
                lost_later_s: link(|u| u.lost_later_s),
                retransmits: Spread::of(
                    ok.iter()
                        .filter_map(|r| r.session.as_ref().map(|s| s.retransmits as f64)),
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        let s = Spread::of([91.0, 79.0, 93.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 91.0, 79.0, 93.0));
        let s = Spread::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (4, 2.5, 1.0, 4.0));
        assert_eq!(Spread::of([]), None);
        assert_eq!(Spread::of([f64::NAN]), None);
        let one = Spread::of([f64::NAN, 5.0]).unwrap();
        assert_eq!((one.n, one.median), (1, 5.0));
    }

    #[test]
    fn shown_with_its_range_only_when_repeated() {
        assert_eq!(Spread::of([92.456]).unwrap().show(2, ""), "92.46");
        assert_eq!(
            Spread::of([1.0, 3.0, 2.0]).unwrap().show(1, " %"),
            "2.0 % (1.0–3.0)"
        );
    }
}
