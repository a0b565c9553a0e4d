//! `blobpool copy --from SRC.toml --to DST.toml`: copies entries from one
//! store configuration to another (e.g. SQLite + local files → PostgreSQL +
//! pg-lo, or → S3), streaming, verified, idempotent and resumable.
//!
//! Both configurations are read with [`Config::load`] without environment
//! overrides (`BLOBPOOL_*` would apply to both sides alike, which is never
//! what a copy means); an `s3://` large tier still takes its settings from
//! the `AWS_*` variables, as in every other command. Both stores open as in
//! direct mode: non-fleet instances holding their data exclusively (the
//! instance lock) unless a configuration says `fleet = true`.
//!
//! For each namespace the source is paged through in digest order; each
//! page is checked against the destination with one `has_many`, present
//! entries are skipped (so a rerun after an interruption or a failure
//! copies only the rest), and the missing ones are streamed from the
//! source's verified read into the destination's put with the expected
//! digest, `--jobs` at a time. The put's receipt pins the new entry while
//! it is being written and is dropped at once: protection afterwards is the
//! destination's GC policy (see [`AFTER_HELP`]).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use store_core::{Refs, Store};
use store_types::{Digest, Error, Key, Namespace, RefEntry, RefExpect, RefName};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::output::{emit, missing, CliError};
use crate::progress::ProgressRead;

/// Entries listed (and checked against the destination) per page.
pub const PAGE: usize = store_core::MAX_LIST_LIMIT;

/// Failures listed in the summary (all are counted and printed on stderr).
pub const MAX_LISTED_FAILURES: usize = 1000;

/// Default `--jobs`.
pub const DEFAULT_JOBS: u16 = 4;

/// The `copy` subcommand's extra help.
pub const AFTER_HELP: &str = "\
Both files are read without BLOBPOOL_* environment overrides (an s3:// large
tier still takes its AWS_* settings from the environment). Each store opens
as in direct mode: a non-fleet store holds its data exclusively, so copying
from (or to) the data of a running `blobpool serve` fails with code `locked`:
stop the server first, or copy through a fleet configuration (fleet = true,
PostgreSQL-backed) of the same data.

Entries the destination already has are skipped, so the copy is idempotent
and resumable: rerun the same command after an interruption or a failure
and only the rest is copied. Every entry is verified twice: the source read
is checked against its digest, and the destination put is given the digest
to expect (it stores nothing that does not match).

The destination's put pins each new entry only while it is written; after
that its protection is the destination's GC policy. Copying into a namespace
that the destination sweeps as unreferenced (gc.unreferenced_namespaces)
makes the copies garbage at its next sweep unless something references them.

Named references are copied too, after the entries (not with --digests; not
at all with --no-refs): a reference the destination lacks is created, one
pointing at the same digest is skipped, and one pointing elsewhere is a
failure (`ref_conflict`) unless --overwrite-refs lets the source's win.
Setting a reference makes its namespace a `refs` namespace in the
destination as in the source: entries there that no reference points at
are then garbage for the destination's sweeps.

--digests FILE (or - for stdin) lists entries to copy, one per line: a
digest (in the namespace of --namespace, default `default`) or `NAMESPACE
DIGEST`; blank lines and lines starting with # are ignored.

Output: copied, skipped, failed, bytes, and the same counts for references
(--json: one object, with the first failures listed). A failed entry is reported on stderr and the rest goes on;
the exit status is 1 if any failed.

Examples:
  blobpool copy --from old.toml --to new.toml
  blobpool copy --from old.toml --to s3.toml -n docs -n images --jobs 8
  blobpool has ... | cut -f1 | blobpool copy --from a.toml --to b.toml --digests -";

/// What to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every namespace of the source.
    All,
    /// These namespaces.
    Namespaces(Vec<Namespace>),
    /// These entries, grouped by namespace (sorted, no duplicates).
    Keys(BTreeMap<Namespace, Vec<Digest>>),
}

/// `blobpool copy`'s options.
#[derive(Debug, Clone)]
pub struct CopyOpts {
    /// Source configuration file.
    pub from: PathBuf,
    /// Destination configuration file.
    pub to: PathBuf,
    /// What to copy.
    pub selection: Selection,
    /// Entries copied concurrently (at least 1).
    pub jobs: usize,
    /// Progress bars on stderr (when it is a terminal).
    pub progress: bool,
    /// Copy named references (not in [`Selection::Keys`] mode).
    pub refs: bool,
    /// A destination reference pointing elsewhere takes the source's
    /// digest (else it is a `ref_conflict` failure).
    pub overwrite_refs: bool,
}

/// One entry that could not be copied.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Namespace.
    pub namespace: String,
    /// Digest (of the entry, or that the reference points at).
    pub digest: String,
    /// The reference's name, for a reference that could not be copied.
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Error code.
    pub code: String,
    /// Error message.
    pub error: String,
}

/// The final count.
#[derive(Debug, Clone, Serialize)]
pub struct CopySummary {
    /// Entries written to the destination.
    pub copied: u64,
    /// Entries the destination already had.
    pub skipped: u64,
    /// Entries that could not be copied.
    pub failed: u64,
    /// Bytes written (of the copied entries).
    pub bytes: u64,
    /// Namespaces visited.
    pub namespaces: u64,
    /// References created or updated in the destination.
    pub refs_copied: u64,
    /// References the destination already had (same digest).
    pub refs_skipped: u64,
    /// References that could not be copied.
    pub refs_failed: u64,
    /// Wall time.
    pub seconds: f64,
    /// The first [`MAX_LISTED_FAILURES`] failures.
    pub failures: Vec<Failure>,
    /// Why the copy stopped before visiting everything (a listing or
    /// presence check failed), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
}

impl CopySummary {
    fn text(&self) -> String {
        let mut s = format!(
            "copied {}, skipped {}, failed {}, bytes {} ({}) in {:.1}s",
            self.copied,
            self.skipped,
            self.failed,
            self.bytes,
            indicatif::HumanBytes(self.bytes),
            self.seconds
        );
        if self.refs_copied + self.refs_skipped + self.refs_failed > 0 {
            s.push_str(&format!(
                "; refs copied {}, skipped {}, failed {}",
                self.refs_copied, self.refs_skipped, self.refs_failed
            ));
        }
        if let Some(a) = &self.aborted {
            s.push_str(&format!("; aborted: {a}"));
        }
        s
    }
}

/// Parses a `--digests` list (see [`AFTER_HELP`]): bare digests belong to
/// `default_ns`.
pub fn parse_digest_list(
    text: &str,
    default_ns: &Namespace,
) -> Result<BTreeMap<Namespace, Vec<Digest>>, CliError> {
    let mut out: BTreeMap<Namespace, Vec<Digest>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |e: &dyn std::fmt::Display| {
            CliError::usage(format!("--digests line {}: {e}: {line:?}", i + 1))
        };
        let mut fields = line.split_whitespace();
        let (ns, digest) = match (fields.next(), fields.next(), fields.next()) {
            (Some(d), None, None) => (default_ns.clone(), d),
            (Some(ns), Some(d), None) => (Namespace::new(ns).map_err(|e| bad(&e))?, d),
            _ => return Err(bad(&"expected DIGEST or NAMESPACE DIGEST")),
        };
        let digest = Digest::parse(digest).map_err(|e| bad(&e))?;
        out.entry(ns).or_default().push(digest);
    }
    for digests in out.values_mut() {
        digests.sort();
        digests.dedup();
    }
    Ok(out)
}

/// The selection of the command line: `namespaces` as given to
/// `--namespace`, `digests` the `--digests` file (`-`: stdin, read here).
pub fn selection(namespaces: &[String], digests: Option<&str>) -> Result<Selection, CliError> {
    let namespaces = namespaces
        .iter()
        .map(|n| {
            Namespace::new(n.as_str()).map_err(|e| CliError::usage(format!("--namespace {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match digests {
        Some(file) => {
            let default_ns = match namespaces.as_slice() {
                [] => Namespace::new("default").map_err(CliError::from)?,
                [one] => one.clone(),
                _ => {
                    return Err(CliError::usage(
                        "with --digests, give at most one --namespace (the namespace of bare \
                         digests; lines may name their own: NAMESPACE DIGEST)",
                    ))
                }
            };
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                    .map_err(|e| CliError::io("reading --digests from stdin", e))?;
                s
            } else {
                std::fs::read_to_string(file)
                    .map_err(|e| CliError::io(&format!("reading --digests {file}"), e))?
            };
            Selection::Keys(parse_digest_list(&text, &default_ns)?)
        }
        None if namespaces.is_empty() => Selection::All,
        None => {
            let mut list = namespaces;
            list.sort();
            list.dedup();
            Selection::Namespaces(list)
        }
    })
}

fn load(path: &Path, side: &str) -> Result<Config, CliError> {
    Config::load(Some(path), &|_| None).map_err(|e| CliError::config(format!("{side}: {e}")))
}

async fn open(cfg: &Config, path: &Path, side: &str) -> Result<Store, CliError> {
    cfg.open_store().await.map_err(|e| match e {
        Error::InstanceLocked { .. } => CliError::new(
            "locked",
            format!(
                "{side} store ({}): {e}; if that is `blobpool serve`, stop it and copy from \
                 (or to) the stopped store, or use a fleet configuration (fleet = true, \
                 PostgreSQL-backed) of the same data",
                path.display()
            ),
        ),
        other => {
            let c = CliError::from(other);
            CliError::new(
                c.code,
                format!("{side} store ({}): {}", path.display(), c.message),
            )
        }
    })
}

/// Refuses a copy of a store onto itself (mem:// tiers are private to
/// each open, so two of them never are the same).
fn same_store(src: &Config, dst: &Config) -> Option<&'static str> {
    if src.kv.same_store(&dst.kv) {
        return Some("kv");
    }
    match (&src.large, &dst.large) {
        (Some(a), Some(b)) if a.same_store(b) => Some("large"),
        _ => None,
    }
}

/// Counters shared by the lister and the copy tasks.
struct Tally {
    copied: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    namespaces: AtomicU64,
    refs_copied: AtomicU64,
    refs_skipped: AtomicU64,
    refs_failed: AtomicU64,
    failures: Mutex<Vec<Failure>>,
    /// The namespaces listed (whose references are copied).
    visited: Mutex<Vec<Namespace>>,
}

impl Tally {
    fn fail(&self, f: Failure) {
        let mut list = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() < MAX_LISTED_FAILURES {
            list.push(f);
        }
    }
}

/// Progress display: a line of counts and a byte counter.
struct Bars {
    multi: MultiProgress,
    entries: ProgressBar,
    bytes: ProgressBar,
}

impl Bars {
    fn new(enabled: bool) -> Bars {
        let multi = MultiProgress::new();
        if !(enabled && std::io::stderr().is_terminal()) {
            multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            return Bars {
                multi,
                entries: ProgressBar::hidden(),
                bytes: ProgressBar::hidden(),
            };
        }
        let entries = multi.add(ProgressBar::new_spinner());
        if let Ok(s) = ProgressStyle::default_spinner().template("{spinner} {elapsed} {msg}") {
            entries.set_style(s);
        }
        let bytes = multi.add(ProgressBar::new_spinner());
        if let Ok(s) =
            ProgressStyle::default_spinner().template("  {bytes} copied, {bytes_per_sec}")
        {
            bytes.set_style(s);
        }
        entries.enable_steady_tick(Duration::from_millis(200));
        bytes.enable_steady_tick(Duration::from_millis(200));
        Bars {
            multi,
            entries,
            bytes,
        }
    }

    fn update(&self, t: &Tally, ns: Option<&Namespace>) {
        if self.entries.is_hidden() {
            return;
        }
        let mut msg = format!(
            "copied {}, skipped {}, failed {}",
            t.copied.load(Ordering::Relaxed),
            t.skipped.load(Ordering::Relaxed),
            t.failed.load(Ordering::Relaxed)
        );
        if let Some(ns) = ns {
            msg.push_str(&format!(" (namespace {ns})"));
        }
        self.entries.set_message(msg);
    }

    /// Prints a line on stderr without tearing the bars.
    fn println(&self, line: &str) {
        self.multi.suspend(|| eprintln!("{line}"));
    }

    fn finish(&self) {
        self.entries.finish_and_clear();
        self.bytes.finish_and_clear();
    }
}

/// Runs `blobpool copy` and prints the summary; an error when any entry
/// failed (exit status 1) or the copy stopped early.
pub async fn run(opts: CopyOpts, json: bool) -> Result<(), CliError> {
    let src_cfg = load(&opts.from, "--from")?;
    let dst_cfg = load(&opts.to, "--to")?;
    if let Some(tier) = same_store(&src_cfg, &dst_cfg) {
        return Err(CliError::usage(format!(
            "--from {} and --to {} name the same {tier} store",
            opts.from.display(),
            opts.to.display()
        )));
    }
    let src = open(&src_cfg, &opts.from, "source").await?;
    let dst = open(&dst_cfg, &opts.to, "destination").await?;
    let summary = copy(&src, &dst, &opts).await;
    emit(json, &summary, CopySummary::text)?;
    if let Some(a) = &summary.aborted {
        return Err(CliError::new(
            "copy_aborted",
            format!(
                "{a}; what was copied stays: rerun the same command to copy the rest \
                 (entries already there are skipped)"
            ),
        ));
    }
    if summary.failed > 0 || summary.refs_failed > 0 {
        let mut what = Vec::new();
        if summary.failed > 0 {
            what.push(format!(
                "{} of {} entries",
                summary.failed,
                summary.failed + summary.copied + summary.skipped
            ));
        }
        if summary.refs_failed > 0 {
            what.push(format!(
                "{} of {} references",
                summary.refs_failed,
                summary.refs_failed + summary.refs_copied + summary.refs_skipped
            ));
        }
        return Err(CliError::new(
            "copy_incomplete",
            format!(
                "{} failed to copy (listed above); rerun the same command to retry them \
                 (what is already there is skipped)",
                what.join(" and ")
            ),
        ));
    }
    Ok(())
}

/// Copies what `opts.selection` names from `src` to `dst`.
pub async fn copy(src: &Store, dst: &Store, opts: &CopyOpts) -> CopySummary {
    let started = Instant::now();
    let tally = Arc::new(Tally {
        copied: AtomicU64::new(0),
        skipped: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        namespaces: AtomicU64::new(0),
        refs_copied: AtomicU64::new(0),
        refs_skipped: AtomicU64::new(0),
        refs_failed: AtomicU64::new(0),
        failures: Mutex::new(Vec::new()),
        visited: Mutex::new(Vec::new()),
    });
    let bars = Arc::new(Bars::new(opts.progress));
    bars.update(&tally, None);
    let jobs = opts.jobs.max(1);
    // Missing entries, from the lister to the copy tasks.
    let (tx, mut rx) = mpsc::channel::<Key>(PAGE + jobs);
    let lister = {
        let (src, dst, tally, bars) = (src.clone(), dst.clone(), tally.clone(), bars.clone());
        let selection = opts.selection.clone();
        tokio::spawn(async move { list_missing(&src, &dst, selection, &tally, &bars, tx).await })
    };
    let keys = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    keys.map(|key| {
        let (src, dst, tally, bars) = (src.clone(), dst.clone(), tally.clone(), bars.clone());
        tokio::spawn(async move {
            copy_entry(&src, &dst, &key, &tally, &bars).await;
            bars.update(&tally, None);
        })
    })
    .buffer_unordered(jobs)
    .for_each(|joined| {
        if let Err(e) = joined {
            // A copy task panicked: counted, never silent.
            tally.failed.fetch_add(1, Ordering::Relaxed);
            bars.println(&format!(
                "blobpool: copy: internal: a copy task failed: {e}"
            ));
        }
        futures::future::ready(())
    })
    .await;
    let mut aborted = match lister.await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(format!("internal: the lister failed: {e}")),
    };
    let ref_namespaces =
        std::mem::take(&mut *tally.visited.lock().unwrap_or_else(|p| p.into_inner()));
    if aborted.is_none() && opts.refs && !ref_namespaces.is_empty() {
        if let Err(e) = copy_refs(src, dst, &ref_namespaces, opts, &tally, &bars).await {
            aborted = Some(e.to_string());
        }
    }
    bars.finish();
    let failures = std::mem::take(&mut *tally.failures.lock().unwrap_or_else(|p| p.into_inner()));
    CopySummary {
        copied: tally.copied.load(Ordering::Relaxed),
        skipped: tally.skipped.load(Ordering::Relaxed),
        failed: tally.failed.load(Ordering::Relaxed),
        bytes: tally.bytes.load(Ordering::Relaxed),
        namespaces: tally.namespaces.load(Ordering::Relaxed),
        refs_copied: tally.refs_copied.load(Ordering::Relaxed),
        refs_skipped: tally.refs_skipped.load(Ordering::Relaxed),
        refs_failed: tally.refs_failed.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        failures,
        aborted,
    }
}

/// Copies one missing entry and counts the outcome: copied, skipped (it
/// appeared meanwhile) or failed (reported on the progress output).
async fn copy_entry(src: &Store, dst: &Store, key: &Key, tally: &Tally, bars: &Bars) {
    match copy_one(src, dst, key, &bars.bytes).await {
        Ok((_, true)) => {
            // Appeared in the destination since the presence check.
            tally.skipped.fetch_add(1, Ordering::Relaxed);
        }
        Ok((n, false)) => {
            tally.copied.fetch_add(1, Ordering::Relaxed);
            tally.bytes.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            bars.println(&format!("blobpool: copy: {key}: failed: {e}"));
            tally.fail(Failure {
                namespace: key.namespace.to_string(),
                digest: key.digest.to_hex(),
                reference: None,
                code: e.code,
                error: e.message,
            });
        }
    }
}

/// Sends the selected entries the destination lacks down `tx`, page by
/// page, counting the others as skipped. Stops at the first listing or
/// presence-check failure (or when the receiver is gone).
async fn list_missing(
    src: &Store,
    dst: &Store,
    selection: Selection,
    tally: &Tally,
    bars: &Bars,
    tx: mpsc::Sender<Key>,
) -> Result<(), CliError> {
    let in_source = |e: Error| {
        let c = CliError::from(e);
        CliError::new(c.code, format!("listing the source: {}", c.message))
    };
    let namespaces = match &selection {
        Selection::All => list_namespaces(src).await.map_err(in_source)?,
        Selection::Namespaces(list) => list.clone(),
        Selection::Keys(map) => map.keys().cloned().collect(),
    };
    let listing = !matches!(selection, Selection::Keys(_));
    for ns in namespaces {
        tally.namespaces.fetch_add(1, Ordering::Relaxed);
        if listing {
            tally
                .visited
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ns.clone());
        }
        bars.update(tally, Some(&ns));
        let mut pages: Box<dyn Iterator<Item = Vec<Digest>> + Send> = match &selection {
            Selection::Keys(map) => {
                let list = map.get(&ns).cloned().unwrap_or_default();
                Box::new(
                    list.chunks(PAGE)
                        .map(<[Digest]>::to_vec)
                        .collect::<Vec<_>>()
                        .into_iter(),
                )
            }
            _ => Box::new(std::iter::empty()),
        };
        // The next page starts after `cursor`'s digest (`Some(None)`: at the
        // start); `None` once the listing is exhausted.
        let mut cursor: Option<Option<Digest>> = Some(None);
        loop {
            let page = if listing {
                let Some(from) = cursor else { break };
                let (page, next) = list_page(src, &ns, from, PAGE).await.map_err(in_source)?;
                // `None` after the last page.
                cursor = next.map(Some);
                page
            } else {
                match pages.next() {
                    Some(p) => p,
                    None => break,
                }
            };
            if page.is_empty() {
                continue;
            }
            let present = dst.has_many(&ns, &page).await.map_err(|e| {
                let c = CliError::from(e);
                CliError::new(
                    c.code,
                    format!("checking the destination ({ns}): {}", c.message),
                )
            })?;
            for (digest, there) in page.into_iter().zip(present) {
                if there {
                    tally.skipped.fetch_add(1, Ordering::Relaxed);
                } else if tx.send(Key::new(ns.clone(), digest)).await.is_err() {
                    return Ok(());
                }
            }
            bars.update(tally, Some(&ns));
        }
    }
    Ok(())
}

/// Streams one entry from `src` into `dst`: its size and whether the
/// destination already had it.
async fn copy_one(
    src: &Store,
    dst: &Store,
    key: &Key,
    bytes: &ProgressBar,
) -> Result<(u64, bool), CliError> {
    let blob = src.get(key).await?.ok_or_else(|| missing(key))?;
    let len = blob.len();
    let reader = ProgressRead::new(blob, bytes.clone());
    let receipt = dst
        .put_opts(
            &key.namespace,
            reader,
            store_core::PutOptions {
                len: Some(len),
                expect: Some(key.digest),
            },
        )
        .await?;
    // The pin ends here: from now on the destination's GC policy decides.
    Ok((receipt.size, receipt.deduplicated))
}

/// Copies the references of `namespaces` from `src` to `dst` (after their
/// entries), `opts.jobs` at a time. `Err` when listing fails or the
/// destination holds no references while the source has some.
async fn copy_refs(
    src: &Store,
    dst: &Store,
    namespaces: &[Namespace],
    opts: &CopyOpts,
    tally: &Tally,
    bars: &Bars,
) -> Result<(), CliError> {
    let Some(src_refs) = src.refs() else {
        return Ok(());
    };
    let dst_refs = dst.refs();
    for ns in namespaces {
        bars.entries
            .set_message(format!("copying the references of namespace {ns}"));
        let mut after: Option<RefName> = None;
        loop {
            let page = src_refs
                .list(ns, "", after.as_ref(), PAGE)
                .await
                .map_err(|e| {
                    let c = CliError::from(e);
                    CliError::new(
                        c.code,
                        format!("listing the source's references ({ns}): {}", c.message),
                    )
                })?;
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            let full = page.len() == PAGE;
            let Some(dst_refs) = &dst_refs else {
                return Err(CliError::config(format!(
                    "the source has references ({ns}) but the destination's kv engine cannot \
                     hold any (use --no-refs to copy entries only)"
                )));
            };
            let results: Vec<(RefEntry, Result<bool, CliError>)> = futures::stream::iter(page)
                .map(|r| async move {
                    let res = copy_ref(dst_refs, ns, &r, opts.overwrite_refs).await;
                    (r, res)
                })
                .buffer_unordered(opts.jobs.max(1))
                .collect()
                .await;
            for (r, res) in results {
                match res {
                    Ok(true) => tally.refs_copied.fetch_add(1, Ordering::Relaxed),
                    Ok(false) => tally.refs_skipped.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        bars.println(&format!(
                            "blobpool: copy: reference {ns}/{} ({}): failed: {e}",
                            r.name, r.digest
                        ));
                        tally.fail(Failure {
                            namespace: ns.to_string(),
                            digest: r.digest.to_hex(),
                            reference: Some(r.name.to_string()),
                            code: e.code,
                            error: e.message,
                        });
                        tally.refs_failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            if !full {
                break;
            }
        }
    }
    Ok(())
}

/// Points `r.name` in the destination at `r.digest`: `true` if it was set,
/// `false` if it already was. A reference pointing elsewhere is a
/// `ref_conflict` unless `overwrite`; a missing entry (its copy failed)
/// is `missing`.
async fn copy_ref(
    dst: &Refs,
    ns: &Namespace,
    r: &RefEntry,
    overwrite: bool,
) -> Result<bool, CliError> {
    let current = dst.get(ns, &r.name).await?;
    let expect = match current {
        Some(d) if d == r.digest => return Ok(false),
        Some(d) if !overwrite => {
            return Err(CliError::new(
                "ref_conflict",
                format!(
                    "the destination's reference points at {d}; --overwrite-refs makes the \
                     source's win"
                ),
            ))
        }
        Some(d) => RefExpect::Digest(d),
        None => RefExpect::Absent,
    };
    match dst.set(ns, &r.name, r.digest, expect).await {
        Ok(_) => Ok(true),
        Err(Error::Missing) => Err(CliError::new(
            "missing",
            format!(
                "the entry {ns}/{} is not in the destination (its copy failed?)",
                r.digest
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The source's namespaces.
async fn list_namespaces(src: &Store) -> Result<Vec<Namespace>, Error> {
    src.namespaces().await
}

/// Up to `limit` digests of `ns` after `after`, ascending, and the cursor
/// of the next page (`None`: this one is the last).
async fn list_page(
    src: &Store,
    ns: &Namespace,
    after: Option<Digest>,
    limit: usize,
) -> Result<(Vec<Digest>, Option<Digest>), Error> {
    let page = src.list(ns, after, limit).await?;
    Ok((page.entries.iter().map(|e| e.digest).collect(), page.next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_lists_parse() {
        let ns = Namespace::new("default").unwrap();
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let text = format!("# comment\n\n{a}\n  docs {b}\n{a}\ndocs\t{a}\n");
        let m = parse_digest_list(&text, &ns).unwrap();
        assert_eq!(m[&ns], vec![a]);
        let mut docs = vec![a, b];
        docs.sort();
        assert_eq!(m[&Namespace::new("docs").unwrap()], docs);
        for bad in ["xyz", "a b c", "Docs 00", &format!("../x {a}")] {
            let e = parse_digest_list(bad, &ns).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
        }
    }
}
