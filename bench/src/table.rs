//! The ratio table: one row per figure, each with its ratios to the limits
//! and the peers measured in the same run.

use std::fmt::Write as _;

/// What one timed operation moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    /// A put or get of this many bytes.
    Bytes(u64),
    /// `concurrency` putters, each op of `size` bytes (ops/s is the total).
    Concurrent {
        /// Bytes per put.
        size: u64,
        /// Concurrent putters.
        putters: u64,
    },
    /// One `has_many` call over this many digests.
    Digests(u64),
    /// One sweep arbitrating this many entries.
    Entries(u64),
    /// A ranged read of this many bytes.
    Range(u64),
    /// Not a timing: peak bytes (memory rows).
    PeakBytes,
}

/// A reference figure in the same run: what it is and its seconds per op.
#[derive(Clone, Debug)]
pub struct Ref {
    /// What the reference does (e.g. `write+fsync+rename`).
    pub name: String,
    /// Its median seconds per operation (or bytes, for memory rows).
    pub value: f64,
    /// Its seconds per operation in every round (rounds of later runs
    /// appended), aligned with [`Row::rounds`]; empty for memory rows.
    pub rounds: Vec<f64>,
}

impl Ref {
    /// A reference with no per-round figures.
    pub fn new(name: impl Into<String>, value: f64) -> Self {
        Ref {
            name: name.into(),
            value,
            rounds: Vec::new(),
        }
    }
}

/// A peer measured with a row, in one or more variants of its API (e.g.
/// cacache's async and blocking calls); the row is compared with the
/// fastest.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    /// Each variant measured: its name and median seconds per op.
    pub variants: Vec<Ref>,
}

impl Peer {
    /// The fastest variant.
    pub fn best(&self) -> Option<&Ref> {
        self.variants
            .iter()
            .min_by(|a, b| a.value.total_cmp(&b.value))
    }

    /// The table cell: the fastest variant (named when there are several)
    /// and the others' rates.
    fn cell(&self, unit: Unit) -> String {
        let Some(best) = self.best() else {
            return "—".to_string();
        };
        if self.variants.len() == 1 {
            return speed(unit, best.value);
        }
        let others: Vec<String> = self
            .variants
            .iter()
            .filter(|v| !std::ptr::eq(*v, best))
            .map(|v| format!("{} {} ops/s", v.name, count(1.0 / v.value)))
            .collect();
        format!(
            "{}: {} ({})",
            best.name,
            speed(unit, best.value),
            others.join(", ")
        )
    }
}

/// A goal a row is judged against.
#[derive(Clone, Debug)]
pub enum Target {
    /// At least `k` × the slower of BLAKE3 and the raw ceiling.
    MinOfLimits(f64),
    /// At least `k` × the raw ceiling.
    Raw(f64),
    /// Faster than the better (faster) of the peers measured.
    AheadOfPeer,
    /// At least this many units (entries, ops) per second.
    Rate(f64),
    /// The peak (the figure) at most the reference value.
    PeakAtMostRef,
    /// One statement per tier: at least 0.1× the rate of one raw statement
    /// doing the same lookup (1000 point statements would be ~0.01×).
    OneStatement,
}

/// The median of `v` (`None` when empty).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

impl Ref {
    fn merge(&mut self, other: &Ref) {
        self.rounds.extend(&other.rounds);
        self.value = median(&self.rounds).unwrap_or(self.value);
    }
}

/// A target's spread: the lowest and highest ratio of any round of any
/// run, and each run's median ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct Margins {
    /// Lowest per-round ratio.
    pub low: f64,
    /// Highest per-round ratio.
    pub high: f64,
    /// Each run's median ratio.
    pub runs: Vec<f64>,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// Engine or configuration (`local (fsync)`, `sqlite FULL`, ...).
    pub engine: String,
    /// Operation (`put 64 MiB`, ...).
    pub op: String,
    /// Unit of one operation.
    pub unit: Unit,
    /// The Blobpool figure: median seconds per op (bytes for memory rows).
    pub figure: f64,
    /// BLAKE3 of the same bytes, seconds per op.
    pub blake3: Option<f64>,
    /// The raw ceiling of the backend.
    pub raw: Option<Ref>,
    /// The cacache peer (async and blocking calls).
    pub cacache: Peer,
    /// The iroh-blobs peer (its file-system store).
    pub iroh: Peer,
    /// The goals the issue sets for this figure.
    pub targets: Vec<Target>,
    /// Spread of the rounds, (max - min) / median.
    pub spread: f64,
    /// The figure in every round, seconds per op (rounds of later runs
    /// appended: [`Row::merge_run`]).
    pub rounds: Vec<f64>,
    /// BLAKE3's seconds per op in every round.
    pub blake3_rounds: Vec<f64>,
    /// Rounds per run (to split [`Row::rounds`] into runs).
    pub rounds_per_run: usize,
    /// Blobpool's figure is durable when the operation returns and the
    /// peers' are not (their puts never fsync their data): the peer
    /// target says so.
    pub durable_vs_peers: bool,
}

impl Row {
    /// A timing row with no references yet.
    pub fn new(engine: impl Into<String>, op: impl Into<String>, unit: Unit, secs: f64) -> Self {
        Row {
            engine: engine.into(),
            op: op.into(),
            unit,
            figure: secs,
            blake3: None,
            raw: None,
            cacache: Peer::default(),
            iroh: Peer::default(),
            targets: Vec::new(),
            spread: 0.0,
            rounds: Vec::new(),
            blake3_rounds: Vec::new(),
            rounds_per_run: 0,
            durable_vs_peers: false,
        }
    }

    /// Adds the same row of another run: its rounds are appended and the
    /// medians taken over every round of every run.
    pub fn merge_run(&mut self, other: &Row) {
        self.rounds.extend(&other.rounds);
        self.blake3_rounds.extend(&other.blake3_rounds);
        self.figure = median(&self.rounds).unwrap_or(self.figure);
        if let Some(b) = median(&self.blake3_rounds) {
            self.blake3 = Some(b);
        }
        if let (Some(a), Some(b)) = (self.raw.as_mut(), other.raw.as_ref()) {
            a.merge(b);
        }
        for (mine, theirs) in [
            (&mut self.cacache, &other.cacache),
            (&mut self.iroh, &other.iroh),
        ] {
            for (a, b) in mine.variants.iter_mut().zip(&theirs.variants) {
                a.merge(b);
            }
        }
    }

    /// Per-round ratios a target is judged on (empty when a reference has
    /// no rounds).
    fn round_ratios(&self, t: &Target) -> Vec<f64> {
        let n = self.rounds.len();
        let aligned = |v: &[f64]| v.len() == n && n > 0;
        let per = |refs: &dyn Fn(usize) -> Option<f64>| -> Vec<f64> {
            (0..n)
                .map(|i| refs(i).map(|x| x / self.rounds[i]))
                .collect::<Option<Vec<f64>>>()
                .unwrap_or_default()
        };
        match t {
            Target::MinOfLimits(_) => {
                let raw = self.raw.as_ref().map(|r| r.rounds.as_slice());
                if !aligned(&self.blake3_rounds) && !raw.is_some_and(aligned) {
                    return vec![];
                }
                per(&|i| {
                    let b = self.blake3_rounds.get(i).copied().unwrap_or(0.0);
                    let r = raw.and_then(|r| r.get(i)).copied().unwrap_or(0.0);
                    Some(b.max(r))
                })
            }
            Target::Raw(_) | Target::OneStatement => match &self.raw {
                Some(r) if aligned(&r.rounds) => per(&|i| Some(r.rounds[i])),
                _ => vec![],
            },
            Target::AheadOfPeer => {
                let all: Vec<&Ref> = self
                    .cacache
                    .variants
                    .iter()
                    .chain(&self.iroh.variants)
                    .collect();
                if all.is_empty() || !all.iter().all(|v| aligned(&v.rounds)) {
                    return vec![];
                }
                per(&|i| all.iter().map(|v| v.rounds[i]).reduce(f64::min))
            }
            Target::Rate(min) => match self.unit {
                Unit::Entries(e) if n > 0 => {
                    self.rounds.iter().map(|s| e as f64 / s / min).collect()
                }
                _ if n > 0 => self.rounds.iter().map(|s| 1.0 / s / min).collect(),
                _ => vec![],
            },
            Target::PeakAtMostRef => vec![],
        }
    }

    /// The lowest and highest per-round ratio of `t`, and each run's
    /// median ratio.
    pub fn margins(&self, t: &Target) -> Option<Margins> {
        let r = self.round_ratios(t);
        if r.is_empty() {
            return None;
        }
        let per = self.rounds_per_run.max(1);
        Some(Margins {
            low: r.iter().cloned().fold(f64::INFINITY, f64::min),
            high: r.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            runs: r.chunks(per).filter_map(median).collect(),
        })
    }

    /// Speed ratio to a reference measured in seconds per op (>1: faster).
    fn speed_ratio(&self, reference_secs: f64) -> f64 {
        reference_secs / self.figure
    }

    /// Ratio to the raw ceiling (for memory rows: figure / reference).
    pub fn raw_ratio(&self) -> Option<f64> {
        let r = self.raw.as_ref()?;
        Some(match self.unit {
            Unit::PeakBytes => self.figure / r.value,
            _ => self.speed_ratio(r.value),
        })
    }

    /// Ratio to BLAKE3.
    pub fn blake3_ratio(&self) -> Option<f64> {
        self.blake3.map(|b| self.speed_ratio(b))
    }

    /// Ratio to cacache's fastest variant.
    pub fn cacache_ratio(&self) -> Option<f64> {
        self.cacache.best().map(|p| self.speed_ratio(p.value))
    }

    /// Ratio to iroh-blobs.
    pub fn iroh_ratio(&self) -> Option<f64> {
        self.iroh.best().map(|p| self.speed_ratio(p.value))
    }

    /// The better (faster) peer: its name (with the variant when the peer
    /// has several) and the ratio to it.
    pub fn best_peer(&self) -> Option<(String, f64)> {
        [("cacache", &self.cacache), ("iroh-blobs", &self.iroh)]
            .into_iter()
            .filter_map(|(name, p)| {
                let best = p.best()?;
                let label = if p.variants.len() > 1 {
                    format!("{name} {}", best.name)
                } else {
                    name.to_string()
                };
                Some((label, best.value))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(name, secs)| (name, self.speed_ratio(secs)))
    }

    /// Whether each target is met, and the ratio it was judged on.
    pub fn verdicts(&self) -> Vec<(&Target, Option<(bool, f64)>)> {
        self.targets.iter().map(|t| (t, self.verdict(t))).collect()
    }

    /// Whether `t` is met, and the ratio it was judged on.
    pub fn verdict(&self, t: &Target) -> Option<(bool, f64)> {
        Some(match t {
            Target::MinOfLimits(k) => {
                let slowest = self
                    .blake3
                    .into_iter()
                    .chain(self.raw.as_ref().map(|r| r.value))
                    .fold(0.0, f64::max);
                let r = self.speed_ratio(slowest);
                (r >= *k, r)
            }
            Target::Raw(k) => {
                let r = self.raw_ratio()?;
                (r >= *k, r)
            }
            Target::AheadOfPeer => {
                let (_, r) = self.best_peer()?;
                (r > 1.0, r)
            }
            Target::Rate(min) => {
                let rate = self.units_per_sec();
                (rate >= *min, rate / min)
            }
            Target::PeakAtMostRef => {
                let r = self.raw_ratio()?;
                (r <= 1.0, r)
            }
            Target::OneStatement => {
                let r = self.raw_ratio()?;
                (r >= 0.1, r)
            }
        })
    }

    /// Units per second: ops, or entries for sweeps.
    pub fn units_per_sec(&self) -> f64 {
        match self.unit {
            Unit::Entries(n) => n as f64 / self.figure,
            Unit::Concurrent { .. } | Unit::Bytes(_) | Unit::Range(_) | Unit::Digests(_) => {
                1.0 / self.figure
            }
            Unit::PeakBytes => self.figure,
        }
    }

    fn target_text(&self) -> String {
        self.targets
            .iter()
            .map(|t| self.one_target_text(t))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn one_target_text(&self, t: &Target) -> String {
        let what = match t {
            Target::MinOfLimits(k) => format!("≥ {k}× min(BLAKE3, raw)"),
            Target::Raw(k) => format!("≥ {k}× raw"),
            Target::AheadOfPeer => match self.best_peer() {
                Some((name, _)) if self.durable_vs_peers => {
                    format!("ahead of the better peer ({name}; durable vs not)")
                }
                Some((name, _)) => format!("ahead of the better peer ({name})"),
                None => "ahead of the better peer".to_string(),
            },
            Target::Rate(min) => format!("≥ {}/s", count(*min)),
            Target::PeakAtMostRef => "≤ limit".to_string(),
            Target::OneStatement => "one statement per tier (≥ 0.1× one raw statement)".to_string(),
        };
        let Some((met, r)) = self.verdict(t) else {
            return what;
        };
        let Some(m) = self.margins(t) else {
            let word = if met { "met" } else { "missed" };
            return format!("{what}: **{word}** ({r:.2}×)");
        };
        // Judged on the bound a skeptic would take: the worst round
        // (the lowest ratio; for "at most" targets there are no rounds).
        let word = if m.low >= self.threshold(t) {
            "met"
        } else if met {
            "not proven"
        } else {
            "missed"
        };
        let runs = if m.runs.len() > 1 {
            let v: Vec<String> = m.runs.iter().map(|x| format!("{x:.2}")).collect();
            format!("; runs {}", v.join(", "))
        } else {
            String::new()
        };
        format!(
            "{what}: **{word}** ({r:.2}×; rounds {:.2}–{:.2}×{runs})",
            m.low, m.high
        )
    }

    /// The ratio a target must reach.
    fn threshold(&self, t: &Target) -> f64 {
        match t {
            Target::MinOfLimits(k) | Target::Raw(k) => *k,
            Target::AheadOfPeer => 1.0,
            Target::Rate(_) => 1.0,
            Target::OneStatement => 0.1,
            Target::PeakAtMostRef => f64::INFINITY,
        }
    }
}

/// `12.3k`, `1.23M`, `812`.
pub fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `812 KiB/s`, `1.23 GiB/s`.
pub fn rate(bytes_per_sec: f64) -> String {
    const K: f64 = 1024.0;
    if bytes_per_sec >= K * K * K {
        format!("{:.2} GiB/s", bytes_per_sec / (K * K * K))
    } else if bytes_per_sec >= K * K {
        format!("{:.1} MiB/s", bytes_per_sec / (K * K))
    } else {
        format!("{:.0} KiB/s", bytes_per_sec / K)
    }
}

/// `3.2 MiB` etc.
pub fn bytes(v: f64) -> String {
    const K: f64 = 1024.0;
    if v.abs() >= K * K * K {
        format!("{:.2} GiB", v / (K * K * K))
    } else if v.abs() >= K * K {
        format!("{:.2} MiB", v / (K * K))
    } else {
        format!("{:.0} KiB", v / K)
    }
}

/// A figure given in seconds per op of `unit`, as text.
pub fn speed(unit: Unit, secs: f64) -> String {
    let ops = 1.0 / secs;
    match unit {
        Unit::Bytes(n) | Unit::Range(n) => {
            format!("{} ops/s · {}", count(ops), rate(ops * n as f64))
        }
        Unit::Concurrent { size, .. } => {
            format!("{} ops/s · {}", count(ops), rate(ops * size as f64))
        }
        Unit::Digests(n) => format!(
            "{} calls/s · {} digests/s",
            count(ops),
            count(ops * n as f64)
        ),
        Unit::Entries(n) => format!("{} entries/s", count(ops * n as f64)),
        Unit::PeakBytes => bytes(secs),
    }
}

fn ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 10.0 => format!("{r:.0}×"),
        Some(r) if r >= 0.095 => format!("{r:.2}×"),
        Some(r) if r >= 0.00095 => format!("{r:.3}×"),
        Some(r) => format!("{r:.1e}×"),
        None => "—".to_string(),
    }
}

/// The Markdown table of `rows`.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str("| Engine | Operation | Blobpool | × BLAKE3 | Raw ceiling (same run) | × raw | cacache (faster of async, sync) | × cacache | iroh-blobs | × iroh-blobs | Target |\n");
    s.push_str("|---|---|---|---:|---|---:|---|---:|---|---:|---|\n");
    for r in rows {
        let raw = match &r.raw {
            Some(x) => format!("{}: {}", x.name, speed(r.unit, x.value)),
            None => "—".to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.engine,
            r.op,
            speed(r.unit, r.figure),
            ratio(r.blake3_ratio()),
            raw,
            ratio(r.raw_ratio()),
            r.cacache.cell(r.unit),
            ratio(r.cacache_ratio()),
            r.iroh.cell(r.unit),
            ratio(r.iroh_ratio()),
            r.target_text(),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_verdicts() {
        let mut r = Row::new("local", "put 64 MiB", Unit::Bytes(64 << 20), 0.2);
        r.blake3 = Some(0.025);
        r.raw = Some(Ref::new("write+fsync+rename", 0.18));
        r.cacache.variants = vec![Ref::new("async", 0.4), Ref::new("sync", 0.3)];
        r.iroh.variants = vec![Ref::new("async", 0.25)];
        r.targets = vec![Target::MinOfLimits(0.8), Target::AheadOfPeer];
        let (met, ratio) = r.verdict(&r.targets[0]).expect("judged");
        assert!(met && (ratio - 0.9).abs() < 1e-9);
        assert!((r.cacache_ratio().unwrap() - 1.5).abs() < 1e-9);
        let (best, ratio) = r.best_peer().expect("peers");
        assert_eq!(best, "iroh-blobs");
        assert!((ratio - 1.25).abs() < 1e-9);
        let md = markdown(&[r.clone()]);
        assert!(md.contains("**met** (0.90×)"), "{md}");
        assert!(md.contains("| sync: 3.33 ops/s"), "{md}");
        assert!(md.contains("(async 2.50 ops/s)"), "{md}");
        assert!(
            md.contains("ahead of the better peer (iroh-blobs): **met** (1.25×)"),
            "{md}"
        );
        r.iroh.variants.clear();
        let (best, _) = r.best_peer().expect("cacache");
        assert_eq!(best, "cacache sync");
        r.durable_vs_peers = true;
        let md = markdown(&[r]);
        assert!(
            md.contains("ahead of the better peer (cacache sync; durable vs not): **met** (1.50×)"),
            "{md}"
        );
        // Margins: judged on the worst round, two runs of two rounds.
        let mut m = Row::new("local", "get 1 KiB", Unit::Bytes(1024), 1.0);
        m.rounds = vec![1.0, 1.0, 1.0, 1.0];
        m.rounds_per_run = 2;
        let mut peer = Ref::new("sync", 1.2);
        peer.rounds = vec![1.3, 1.2, 1.1, 0.9];
        m.cacache.variants = vec![peer];
        m.targets = vec![Target::AheadOfPeer];
        let got = m.margins(&m.targets[0]).expect("rounds");
        assert!((got.low - 0.9).abs() < 1e-9 && (got.high - 1.3).abs() < 1e-9);
        assert_eq!(got.runs.len(), 2);
        let md = markdown(&[m.clone()]);
        assert!(
            md.contains("**not proven** (1.20×; rounds 0.90–1.30×; runs 1.25, 1.00)"),
            "{md}"
        );
        m.cacache.variants[0].rounds[3] = 1.05;
        assert!(markdown(&[m.clone()]).contains("**met**"));
        let mut other = m.clone();
        other.rounds = vec![2.0, 2.0];
        other.cacache.variants[0].rounds = vec![1.0, 1.0];
        m.merge_run(&other);
        assert_eq!(m.rounds.len(), 6);
        let md = markdown(&[m]);
        assert!(
            md.contains("**not proven**") && md.contains("rounds 0.50–1.30×"),
            "{md}"
        );
        let mut sweep = Row::new("mem", "sweep", Unit::Entries(100_000), 0.5);
        sweep.targets = vec![Target::Rate(100_000.0)];
        assert_eq!(sweep.verdict(&sweep.targets[0]), Some((true, 2.0)));
    }
}
