//! `blobpool ref set|get|rm|ls` and `blobpool put --ref NAME` (ADR-024),
//! directly on the store or against a server.

use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;
use store_core::{Digest, Key, Namespace, RefExpect, RefName};

use crate::direct::Direct;
use crate::output::{emit, CliError, PutResult};
use crate::progress::{bar, ProgressRead};
use crate::remote::Remote;
use crate::transfer::Source;

/// `blobpool ref …`.
#[derive(Debug, Args)]
pub struct RefArgs {
    #[command(subcommand)]
    pub command: RefCommand,
}

/// The reference subcommands.
#[derive(Debug, Subcommand)]
pub enum RefCommand {
    /// Point NAME at DIGEST (the entry must exist). The entry is then never
    /// garbage while the reference exists.
    Set {
        /// Reference name: [A-Za-z0-9._/-], `/`-separated segments.
        name: String,
        /// The entry's digest.
        digest: String,
        #[command(flatten)]
        ns: crate::NsArg,
        /// Only if the reference points at this digest now (compare and
        /// swap).
        #[arg(long, value_name = "DIGEST", conflicts_with = "create")]
        if_match: Option<String>,
        /// Only if the reference does not exist yet.
        #[arg(long)]
        create: bool,
    },
    /// Print the digest NAME points at.
    Get {
        /// Reference name.
        name: String,
        #[command(flatten)]
        ns: crate::NsArg,
    },
    /// Remove NAME (its entry becomes garbage once nothing else protects
    /// it, after the delete window).
    Rm {
        /// Reference name.
        name: String,
        #[command(flatten)]
        ns: crate::NsArg,
        /// Only if the reference points at this digest now.
        #[arg(long, value_name = "DIGEST")]
        if_match: Option<String>,
    },
    /// List references (name order), optionally by prefix.
    Ls {
        #[command(flatten)]
        ns: crate::NsArg,
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this name.
        #[arg(long)]
        after: Option<String>,
        /// At most this many [default: all].
        #[arg(long)]
        limit: Option<usize>,
    },
}

/// One reference as printed.
#[derive(Debug, Serialize)]
pub struct RefLine {
    namespace: String,
    name: String,
    digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<String>,
}

fn name(s: &str) -> Result<RefName, CliError> {
    Ok(RefName::new(s)?)
}

fn digest(s: &str) -> Result<Digest, CliError> {
    Ok(Digest::parse(s)?)
}

fn no_refs() -> CliError {
    CliError::new(
        "unsupported",
        "this store's kv engine holds no references (mem, sqlite and postgres do)",
    )
}

/// Percent-encodes nothing: names are `[A-Za-z0-9._/-]`, safe in a path.
fn ref_path(ns: &Namespace, name: &RefName) -> String {
    format!("/v1/refs/{ns}/{name}")
}

/// The target of a `ref` subcommand: a store opened directly, or a
/// server (exactly one is set).
type Targets<'a> = (Option<&'a Direct>, Option<&'a Remote>);

/// Runs a `ref` subcommand.
pub async fn run(
    target_direct: Option<&Direct>,
    target_remote: Option<&Remote>,
    cmd: &RefCommand,
    json: bool,
) -> Result<(), CliError> {
    let t = (target_direct, target_remote);
    match cmd {
        RefCommand::Set {
            name: n,
            digest: d,
            ns,
            if_match,
            create,
        } => set(t, n, d, ns, if_match.as_deref(), *create, json).await,
        RefCommand::Get { name: n, ns } => get(t, n, ns, json).await,
        RefCommand::Rm {
            name: n,
            ns,
            if_match,
        } => rm(t, n, ns, if_match.as_deref(), json).await,
        RefCommand::Ls {
            ns,
            prefix,
            after,
            limit,
        } => ls(t, ns, prefix, after.as_deref(), *limit, json).await,
    }
}

/// `ref set`.
async fn set(
    t: Targets<'_>,
    n: &str,
    d: &str,
    ns: &crate::NsArg,
    if_match: Option<&str>,
    create: bool,
    json: bool,
) -> Result<(), CliError> {
    let ns = Namespace::new(ns.namespace.as_str())?;
    let nm = name(n)?;
    let d = digest(d)?;
    let expect = match (if_match, create) {
        (Some(m), _) => RefExpect::Digest(digest(m)?),
        (None, true) => RefExpect::Absent,
        (None, false) => RefExpect::Any,
    };
    let previous = match t {
        (Some(dir), _) => {
            let refs = dir.store().refs().ok_or_else(no_refs)?;
            refs.set(&ns, &nm, d, expect).await?.map(|p| p.to_hex())
        }
        (_, Some(r)) => remote_set(r, &ns, &nm, d, expect, None)
            .await?
            .get("previous")
            .and_then(|p| p.as_str())
            .map(str::to_string),
        _ => unreachable!("a target"),
    };
    let line = RefLine {
        namespace: ns.to_string(),
        name: nm.to_string(),
        digest: d.to_hex(),
        previous,
    };
    emit(json, &line, |l| format!("{} -> {}", l.name, l.digest))
}

/// `ref get`.
async fn get(t: Targets<'_>, n: &str, ns: &crate::NsArg, json: bool) -> Result<(), CliError> {
    let ns = Namespace::new(ns.namespace.as_str())?;
    let nm = name(n)?;
    let d = match t {
        (Some(dir), _) => dir
            .store()
            .refs()
            .ok_or_else(no_refs)?
            .get(&ns, &nm)
            .await?
            .map(|d| d.to_hex())
            .ok_or_else(|| CliError::new("missing", "no such reference"))?,
        (_, Some(r)) => r
            .send_json(reqwest::Method::GET, &ref_path(&ns, &nm), None, &[])
            .await?
            .and_then(|v| v["digest"].as_str().map(str::to_string))
            .ok_or_else(|| CliError::new("http", "the server answered no digest"))?,
        _ => unreachable!("a target"),
    };
    let line = RefLine {
        namespace: ns.to_string(),
        name: nm.to_string(),
        digest: d,
        previous: None,
    };
    emit(json, &line, |l| l.digest.clone())
}

/// `ref rm`.
async fn rm(
    t: Targets<'_>,
    n: &str,
    ns: &crate::NsArg,
    if_match: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let ns = Namespace::new(ns.namespace.as_str())?;
    let nm = name(n)?;
    let expect = match if_match {
        Some(m) => RefExpect::Digest(digest(m)?),
        None => RefExpect::Any,
    };
    match t {
        (Some(dir), _) => {
            dir.store()
                .refs()
                .ok_or_else(no_refs)?
                .delete(&ns, &nm, expect)
                .await?
                .ok_or_else(|| CliError::new("missing", "no such reference"))?;
        }
        (_, Some(r)) => {
            let headers = match expect {
                RefExpect::Digest(d) => vec![("if-match", format!("\"{d}\""))],
                _ => vec![],
            };
            r.send_json(reqwest::Method::DELETE, &ref_path(&ns, &nm), None, &headers)
                .await?;
        }
        _ => unreachable!("a target"),
    }
    emit(
        json,
        &json!({"namespace": ns.to_string(), "name": nm.to_string(), "removed": true}),
        |_| format!("removed {nm}"),
    )
}

/// `ref ls`, page by page.
async fn ls(
    t: Targets<'_>,
    ns: &crate::NsArg,
    prefix: &str,
    after: Option<&str>,
    limit: Option<usize>,
    json: bool,
) -> Result<(), CliError> {
    let ns = Namespace::new(ns.namespace.as_str())?;
    let mut after = after.map(name).transpose()?;
    let mut left = limit.unwrap_or(usize::MAX);
    while left > 0 {
        let page = left.min(1000);
        let got: Vec<(String, String)> = match t {
            (Some(dir), _) => dir
                .store()
                .refs()
                .ok_or_else(no_refs)?
                .list(&ns, prefix, after.as_ref(), page)
                .await?
                .into_iter()
                .map(|e| (e.name.to_string(), e.digest.to_hex()))
                .collect(),
            (_, Some(r)) => {
                let mut q = format!("/v1/refs/{ns}?limit={page}&prefix={}", query_escape(prefix));
                if let Some(a) = &after {
                    q.push_str(&format!("&after={}", query_escape(a.as_str())));
                }
                let v = r
                    .send_json(reqwest::Method::GET, &q, None, &[])
                    .await?
                    .unwrap_or_default();
                v["refs"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|e| {
                                Some((
                                    e["name"].as_str()?.to_string(),
                                    e["digest"].as_str()?.to_string(),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            }
            _ => unreachable!("a target"),
        };
        let n = got.len();
        for (nm, d) in &got {
            let line = RefLine {
                namespace: ns.to_string(),
                name: nm.clone(),
                digest: d.clone(),
                previous: None,
            };
            emit(json, &line, |l| format!("{}  {}", l.digest, l.name))?;
        }
        left = left.saturating_sub(n);
        if n < page {
            break;
        }
        after = got.last().map(|(nm, _)| name(nm)).transpose()?;
    }
    Ok(())
}

/// `application/x-www-form-urlencoded` escaping of a query value (names
/// and prefixes are ASCII; escape everything but unreserved characters).
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn remote_set(
    r: &Remote,
    ns: &Namespace,
    nm: &RefName,
    d: Digest,
    expect: RefExpect,
    token: Option<&str>,
) -> Result<serde_json::Value, CliError> {
    let headers = match expect {
        RefExpect::Digest(x) => vec![("if-match", format!("\"{x}\""))],
        RefExpect::Absent => vec![("if-none-match", "*".to_string())],
        RefExpect::Any => vec![],
    };
    let mut body = json!({"digest": d.to_hex()});
    if let Some(t) = token {
        body["token"] = json!(t);
    }
    Ok(r.send_json(
        reqwest::Method::PUT,
        &ref_path(ns, nm),
        Some(&body),
        &headers,
    )
    .await?
    .unwrap_or_default())
}

/// `put --ref NAME` on the store: the receipt's pin holds the entry until
/// the reference is committed.
pub async fn direct_put_with_ref(
    d: &Direct,
    ns: &Namespace,
    src: &Source,
    expect: Option<Digest>,
    ref_name: &str,
    progress: bool,
) -> Result<PutResult, CliError> {
    let nm = name(ref_name)?;
    let refs = d.store().refs().ok_or_else(no_refs)?;
    let (reader, len) = src.open().await?;
    let pb = bar(progress, len, "put");
    let reader = ProgressRead::new(reader, pb.clone());
    let r = d
        .store()
        .put_opts(ns, reader, store_core::PutOptions { len, expect })
        .await;
    pb.finish_and_clear();
    let receipt = r?;
    refs.set(ns, &nm, receipt.digest, RefExpect::Any).await?;
    let out = PutResult {
        namespace: ns.to_string(),
        digest: receipt.digest.to_hex(),
        size: Some(receipt.size),
        tier: Some(receipt.tier),
        deduplicated: Some(receipt.deduplicated),
        token: None,
        released: None,
    };
    drop(receipt);
    Ok(out)
}

/// `put --ref NAME --server`: put, then set the reference with the put's
/// token (the server commits the reference under the pin and releases the
/// token). If the reference cannot be set, the token is kept and named in
/// the error, so the entry stays protected and nothing is lost silently.
pub async fn remote_put_with_ref(
    r: &Remote,
    ns: &Namespace,
    src: &Source,
    expect: Option<Digest>,
    ref_name: &str,
) -> Result<PutResult, CliError> {
    let nm = name(ref_name)?;
    let mut put = r.put(ns, src, expect, false).await?;
    let d = digest(&put.digest)?;
    let Some(token) = put.token.clone() else {
        return Err(CliError::new("http", "the server answered no pin token"));
    };
    match remote_set(r, ns, &nm, d, RefExpect::Any, Some(&token)).await {
        Ok(v) => {
            let released = v["token_released"].as_bool().unwrap_or(false);
            if released {
                put.token = None;
                put.released = Some(true);
            }
            Ok(put)
        }
        Err(e) => Err(CliError::new(
            e.code.clone(),
            format!(
                "stored {} but could not set reference {nm}: {}; its pin token {token} still \
                 holds the entry (release it with `blobpool --server URL release {token}`)",
                Key::new(ns.clone(), d),
                e.message
            ),
        )),
    }
}
