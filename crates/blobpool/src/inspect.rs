//! `blobpool ls`, `du` and `verify`: introspection and online verification,
//! directly on the store or through a server's admin routes
//! (`GET /v1/namespaces`, `GET /v1/namespaces/{ns}/entries`,
//! `GET /v1/stats`, `POST /v1/verify`; scope `admin`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use blobpool::error::Invalid;

use clap::Args;
use serde::Serialize;
use store_core::{EntryPage, VerifyEvent, VerifyOptions, VerifySummary, MAX_LIST_LIMIT};
use store_ops::{NamespacesResponse, StatsResponse, VerifyRequest};
use store_types::{Digest, Namespace};

use crate::output::{emit, CliError};
use crate::progress::bar;
use crate::{parse_digest, parse_ns, target, Cli, Target};

/// `blobpool ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// List this namespace's entries (digest, size, tier, creation time);
    /// without it, list the namespaces.
    #[arg(value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Start after this digest (the `next` cursor of a previous page).
    #[arg(long, value_name = "DIGEST", requires = "namespace")]
    after: Option<String>,
    /// List at most N entries [default: all].
    #[arg(long, value_name = "N", requires = "namespace")]
    limit: Option<usize>,
}

/// `blobpool du`.
#[derive(Debug, Args)]
pub struct DuArgs {
    /// Only this namespace [default: all].
    #[arg(value_name = "NAMESPACE")]
    namespace: Option<String>,
}

/// `blobpool verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Only this namespace [default: all].
    #[arg(value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Direct mode: save each corrupt entry's raw bytes to
    /// DIR/<ns>/<digest>.corrupt (fsynced), then remove the entry so a put
    /// of the right content heals it. Not over --server.
    #[arg(long, value_name = "DIR")]
    quarantine: Option<PathBuf>,
    /// Read at most this many bytes per second (suffixes K, M, G: powers
    /// of 1024) [default: no limit].
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    max_rate: Option<u64>,
    /// Entries read at the same time (1-8).
    #[arg(long, default_value_t = store_ops::DEFAULT_VERIFY_CONCURRENCY as u16,
          value_parser = clap::value_parser!(u16).range(1..=8))]
    concurrency: u16,
}

/// A byte rate: a number with an optional K, M or G suffix (powers of
/// 1024), optionally followed by `B` or `/s`.
fn parse_rate(s: &str) -> Result<u64, Invalid> {
    let t = s.trim().trim_end_matches("/s").trim_end_matches(['B', 'b']);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a rate (e.g. 50M, 1G, 100000)"))?;
    let v = n * mult as f64;
    if !(1.0..1e18).contains(&v) {
        return Err(format!("{s:?}: the rate must be at least 1 byte per second").into());
    }
    Ok(v as u64)
}

/// `1536` → `1.5 KiB`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn entries_path(ns: &Namespace, after: Option<Digest>, limit: usize) -> String {
    let mut p = format!("/v1/namespaces/{ns}/entries?limit={limit}");
    if let Some(a) = after {
        p.push_str(&format!("&after={a}"));
    }
    p
}

/// `blobpool ls [NAMESPACE] [--after D] [--limit N]`. Text: one namespace,
/// or one `digest  size  tier  created` line per entry; JSON: one
/// `{"namespaces"}` object, or one `{"entries","next"}` object per page.
/// When `--limit` cut the listing short, stderr says how to continue.
pub async fn ls(cli: &Cli, a: &LsArgs) -> Result<(), CliError> {
    let json = cli.json;
    let Some(ns) = &a.namespace else {
        let r: NamespacesResponse = match target(cli).await? {
            Target::Direct(d) => NamespacesResponse {
                namespaces: d.store().namespaces().await?,
            },
            Target::Remote(r) => r.get_json("/v1/namespaces").await?,
        };
        return emit(json, &r, |r| {
            r.namespaces
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        });
    };
    let ns = parse_ns(ns)?;
    let mut after = a.after.as_deref().map(parse_digest).transpose()?;
    if a.limit == Some(0) {
        return Err(CliError::usage("--limit must be at least 1"));
    }
    let mut left = a.limit.unwrap_or(usize::MAX);
    let t = target(cli).await?;
    while left > 0 {
        let n = left.min(MAX_LIST_LIMIT);
        let page: EntryPage = match &t {
            Target::Direct(d) => d.store().list(&ns, after, n).await?,
            Target::Remote(r) => r.get_json(&entries_path(&ns, after, n)).await?,
        };
        left -= page.entries.len().min(left);
        if page.entries.is_empty() && page.next.is_none() {
            if json {
                emit(json, &page, |_| String::new())?;
            }
            break;
        }
        emit(json, &page, |p| {
            p.entries
                .iter()
                .map(|e| {
                    format!(
                        "{}\t{}\t{}\t{}",
                        e.digest,
                        e.size,
                        e.tier,
                        rfc3339(e.created_at.0)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        match page.next {
            None => break,
            Some(next) if left == 0 => {
                if !json {
                    eprintln!("blobpool: more entries follow: --after {next}");
                }
            }
            Some(next) => after = Some(next),
        }
    }
    Ok(())
}

/// `blobpool du [NAMESPACE]`: entries, bytes, pinned and staged entries per
/// namespace and tier, and the total.
pub async fn du(cli: &Cli, a: &DuArgs) -> Result<(), CliError> {
    let ns = a.namespace.as_deref().map(parse_ns).transpose()?;
    let r: StatsResponse = match target(cli).await? {
        Target::Direct(d) => StatsResponse::new(d.store().stats(ns.as_ref()).await?),
        Target::Remote(r) => {
            let path = match &ns {
                Some(n) => format!("/v1/stats?namespace={n}"),
                None => "/v1/stats".to_string(),
            };
            r.get_json(&path).await?
        }
    };
    emit(cli.json, &r, du_text)
}

fn du_text(r: &StatsResponse) -> String {
    let mut rows: Vec<[String; 7]> = vec![[
        "NAMESPACE".into(),
        "TIER".into(),
        "ENTRIES".into(),
        "BYTES".into(),
        "SIZE".into(),
        "PINNED".into(),
        "STAGED".into(),
    ]];
    for s in &r.namespaces {
        rows.push([
            s.namespace.to_string(),
            s.tier.to_string(),
            s.entries.to_string(),
            s.bytes.to_string(),
            human(s.bytes),
            s.pinned.to_string(),
            s.staged.to_string(),
        ]);
    }
    let t = &r.total;
    rows.push([
        "total".into(),
        String::new(),
        t.entries.to_string(),
        t.bytes.to_string(),
        human(t.bytes),
        t.pinned.to_string(),
        t.staged.to_string(),
    ]);
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i < 2 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The summary with its throughput, as printed.
#[derive(Serialize)]
struct VerifyReport<'a> {
    #[serde(flatten)]
    summary: &'a VerifySummary,
    entries_per_sec: f64,
    bytes_per_sec: f64,
}

/// `blobpool verify [NAMESPACE] [--quarantine DIR] [--max-rate R]
/// [--concurrency N]`. Exits 1 (code `corrupt`) when an entry is corrupt or
/// could not be read, after printing the summary.
pub async fn verify(cli: &Cli, a: &VerifyArgs) -> Result<(), CliError> {
    let ns = a.namespace.as_deref().map(parse_ns).transpose()?;
    let summary = match target(cli).await? {
        Target::Direct(d) => {
            let store = d.store();
            let total = if cli.quiet {
                None
            } else {
                let rows = store.stats(ns.as_ref()).await?;
                Some(rows.iter().map(|r| r.bytes).sum::<u64>())
            };
            let pb = bar(!cli.quiet, total, "verify");
            let progress = {
                let pb = pb.clone();
                Arc::new(move |e: VerifyEvent| {
                    if let VerifyEvent::Bytes(n) = e {
                        pb.inc(n);
                    }
                }) as Arc<dyn Fn(VerifyEvent) + Send + Sync>
            };
            let opts = VerifyOptions {
                namespace: ns,
                concurrency: a.concurrency as usize,
                max_rate: a.max_rate,
                quarantine_dir: a.quarantine.clone(),
                progress: Some(progress),
            };
            let r = store.verify(&opts).await;
            pb.finish_and_clear();
            r?
        }
        Target::Remote(r) => {
            if a.quarantine.is_some() {
                return Err(CliError::usage(
                    "--quarantine works in direct mode only (the server does not quarantine): \
                     stop the server and run verify without --server",
                ));
            }
            let req = VerifyRequest {
                namespace: ns.map(|n| n.to_string()),
                quarantine: false,
                max_rate: a.max_rate,
                concurrency: Some(a.concurrency as usize),
            };
            r.post_json_slow("/v1/verify", &req).await?
        }
    };
    let secs = (summary.duration_ms as f64 / 1000.0).max(1e-3);
    let report = VerifyReport {
        summary: &summary,
        entries_per_sec: summary.checked as f64 / secs,
        bytes_per_sec: summary.bytes as f64 / secs,
    };
    emit(cli.json, &report, verify_text)?;
    if summary.corrupt > 0 || summary.failed > 0 {
        return Err(CliError::new(
            "corrupt",
            format!(
                "{} corrupt entries ({} quarantined), {} unreadable",
                summary.corrupt, summary.quarantined, summary.failed
            ),
        ));
    }
    Ok(())
}

fn verify_text(r: &VerifyReport<'_>) -> String {
    let s = r.summary;
    let mut out = format!(
        "checked {}: ok {}, corrupt {}, missing {}, failed {}; {} in {:.1} s \
         ({:.0} entries/s, {:.1} MB/s)",
        s.checked,
        s.ok,
        s.corrupt,
        s.missing,
        s.failed,
        human(s.bytes),
        s.duration_ms as f64 / 1000.0,
        r.entries_per_sec,
        r.bytes_per_sec / 1e6
    );
    for c in &s.corrupt_entries {
        out.push_str(&format!(
            "\ncorrupt {}/{} ({})",
            c.namespace, c.digest, c.tier
        ));
        if let Some(p) = &c.quarantined {
            out.push_str(&format!(": quarantined to {}", p.display()));
        }
        if let Some(e) = &c.quarantine_error {
            out.push_str(&format!(": not quarantined: {e}"));
        }
    }
    for f in &s.failures {
        out.push_str(&format!("\nfailed {f}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("100"), Ok(100));
        assert_eq!(parse_rate("50M"), Ok(50 << 20));
        assert_eq!(parse_rate("1.5K"), Ok(1536));
        assert_eq!(parse_rate("2GB/s"), Ok(2 << 30));
        for bad in ["", "0", "fast", "-1M"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human(10), "10 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
