//! Action-cache validation (ADR-070), as bazel-remote does it: an
//! `ac/<hash>` answer is served only while every output it names is
//! present, so a client never gets a hit whose outputs are gone (it would
//! fail the build instead of executing the action again).
//!
//! The rule: an entry under an `ac/` key is validated when it parses as a
//! REAPI `ActionResult` (the subset below: output files, output
//! directories' `Tree`s, stdout and stderr) and every digest in it is well
//! formed (64 lowercase hex, a size of at least 0), at least one of them;
//! then each digest must name a present entry (a `cas/` key's, or the
//! BLAKE3 entry of that name; the empty blob always counts as present),
//! and so must every file of each output directory's `Tree` (a tree blob
//! that is no `Tree` fails the check). Anything else under `ac/` — ccache's
//! `layout=bazel` stores its own result bytes there — is served as before,
//! unvalidated, as is an entry larger than [`ACTION_RESULT_MAX`].
//!
//! A validated hit notes the access of every output it names (their keys'
//! recency moves with the action result's), so the bound's LRU order
//! reaches them no earlier than the result itself.

use bytes::Bytes;
use prost::Message;
use store_core::{Cache, Digest, Key, Namespace, RefExpect, RefName};

use super::cas::{present_entries, CasDigest, DigestFunction};
use super::{cache_key, no_entry, CacheOps, CachePutOutcome};
use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};

/// The largest `ac/` entry read and validated; larger ones are served
/// unvalidated (an `ActionResult` names its outputs by digest and is a
/// few KiB; REAPI's default message limit is 4 MiB).
pub const ACTION_RESULT_MAX: u64 = 4 << 20;

/// The largest output-directory `Tree` whose files are checked; a larger
/// tree is checked for presence only.
pub const TREE_CHECKED_MAX: u64 = 16 << 20;

/// REAPI `Digest`.
#[derive(Clone, PartialEq, Message)]
struct ReDigest {
    #[prost(string, tag = "1")]
    hash: String,
    #[prost(int64, tag = "2")]
    size_bytes: i64,
}

/// REAPI `OutputFile` (the fields read here).
#[derive(Clone, PartialEq, Message)]
struct OutputFile {
    #[prost(string, tag = "1")]
    path: String,
    #[prost(message, optional, tag = "2")]
    digest: Option<ReDigest>,
}

/// REAPI `OutputDirectory` (the fields read here).
#[derive(Clone, PartialEq, Message)]
struct OutputDirectory {
    #[prost(string, tag = "1")]
    path: String,
    #[prost(message, optional, tag = "3")]
    tree_digest: Option<ReDigest>,
}

/// REAPI `ActionResult` (the fields that name outputs).
#[derive(Clone, PartialEq, Message)]
struct ActionResult {
    #[prost(message, repeated, tag = "2")]
    output_files: Vec<OutputFile>,
    #[prost(message, repeated, tag = "3")]
    output_directories: Vec<OutputDirectory>,
    #[prost(message, optional, tag = "6")]
    stdout_digest: Option<ReDigest>,
    #[prost(message, optional, tag = "8")]
    stderr_digest: Option<ReDigest>,
}

/// REAPI `FileNode` (the fields read here).
#[derive(Clone, PartialEq, Message)]
struct FileNode {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    digest: Option<ReDigest>,
}

/// REAPI `Directory` (its files).
#[derive(Clone, PartialEq, Message)]
struct Directory {
    #[prost(message, repeated, tag = "1")]
    files: Vec<FileNode>,
}

/// REAPI `Tree`.
#[derive(Clone, PartialEq, Message)]
struct Tree {
    #[prost(message, optional, tag = "1")]
    root: Option<Directory>,
    #[prost(message, repeated, tag = "2")]
    children: Vec<Directory>,
}

/// An output an action result names: what it is (for the miss's message)
/// and its digest (hex, size).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Output {
    what: String,
    hash: String,
    size: u64,
}

impl Output {
    fn of(what: String, d: &ReDigest) -> Option<Output> {
        let well_formed = Digest::parse(&d.hash).is_ok() && d.size_bytes >= 0;
        well_formed.then(|| Output {
            what,
            hash: d.hash.clone(),
            size: d.size_bytes as u64,
        })
    }

    /// As asked of the CAS: either function (the empty blob's name under
    /// either counts as present).
    fn cas(&self) -> CasDigest {
        let function = if self.hash == DigestFunction::Blake3.empty_hex() {
            DigestFunction::Blake3
        } else {
            DigestFunction::Sha256
        };
        CasDigest {
            function,
            hash: self.hash.clone(),
            size: self.size,
        }
    }
}

/// The outputs `bytes` names, when it is an action result by the rule of
/// the module docs (`None`: serve it unvalidated); directories' trees
/// last, with their paths.
fn outputs(bytes: &[u8]) -> Option<(Vec<Output>, Vec<Output>)> {
    let ar = ActionResult::decode(bytes).ok()?;
    let mut files = Vec::new();
    let mut all_well_formed = true;
    let mut add = |list: &mut Vec<Output>, what: String, d: &Option<ReDigest>| {
        if let Some(d) = d {
            match Output::of(what, d) {
                Some(o) => list.push(o),
                None => all_well_formed = false,
            }
        }
    };
    for f in &ar.output_files {
        add(&mut files, format!("output file {}", f.path), &f.digest);
    }
    add(&mut files, "stdout".into(), &ar.stdout_digest);
    add(&mut files, "stderr".into(), &ar.stderr_digest);
    let mut trees = Vec::new();
    for d in &ar.output_directories {
        let what = format!("output directory {} (its Tree)", d.path);
        add(&mut trees, what, &d.tree_digest);
    }
    let named = !files.is_empty() || !trees.is_empty();
    (all_well_formed && named).then_some((files, trees))
}

/// The files a `Tree` blob names (`None`: it is no `Tree`, or one of its
/// digests is malformed).
fn tree_files(dir: &str, bytes: &[u8]) -> Option<Vec<Output>> {
    let tree = Tree::decode(bytes).ok()?;
    let mut out = Vec::new();
    for d in tree.root.iter().chain(&tree.children) {
        for f in &d.files {
            let what = format!("file {} of output directory {dir}", f.name);
            out.push(Output::of(what, f.digest.as_ref()?)?);
        }
    }
    Some(out)
}

/// What validating an `ac/` entry found.
pub(super) enum Validity {
    /// Serve it (validated, or not an action result by the rule); the
    /// bytes when they were read.
    Serve(Option<Bytes>),
    /// An output is missing: this names it.
    Missing(String),
}

/// Whether `key`'s entry `d` (an `ac/` key of `ns`) may be served (see the
/// module docs); the present outputs' accesses are noted. `Missing` (as an
/// error) when the entry itself is gone.
pub(super) async fn validate(
    ops: &crate::Ops,
    ns: &Namespace,
    cache: &Cache,
    d: Digest,
) -> Result<Validity, OpsError> {
    let store = ops.store();
    let entry = Key::new(ns.clone(), d);
    let size = store.stat(&entry).await?.map(|s| s.size);
    let size = size.ok_or(store_core::Error::Missing)?;
    if size > ACTION_RESULT_MAX {
        return Ok(Validity::Serve(None));
    }
    let blob = store.get(&entry).await?.ok_or(store_core::Error::Missing)?;
    let bytes = blob.bytes().await?;
    let Some((files, trees)) = outputs(&bytes) else {
        return Ok(Validity::Serve(Some(bytes)));
    };
    if let Some(gone) = first_missing(ops, ns, cache, &files).await? {
        return Ok(Validity::Missing(gone));
    }
    let found = present_entries(ops, ns, cache, &as_cas(&trees)).await?;
    for (tree, found) in trees.iter().zip(found) {
        let Some(t) = found else {
            return Ok(Validity::Missing(missing(tree)));
        };
        let Some(files) = read_tree(ops, ns, t, tree).await? else {
            continue;
        };
        let Some(files) = files else {
            let m = format!("{} is not a REAPI Tree", tree.what);
            return Ok(Validity::Missing(m));
        };
        if let Some(gone) = first_missing(ops, ns, cache, &files).await? {
            return Ok(Validity::Missing(gone));
        }
    }
    Ok(Validity::Serve(Some(bytes)))
}

/// The files of the tree entry `t` (`Some(None)`: not a `Tree`; `None`:
/// too large to read, or gone since it was found).
async fn read_tree(
    ops: &crate::Ops,
    ns: &Namespace,
    t: Digest,
    tree: &Output,
) -> Result<Option<Option<Vec<Output>>>, OpsError> {
    let key = Key::new(ns.clone(), t);
    let Some(blob) = ops.store().get(&key).await? else {
        return Ok(None);
    };
    if blob.len() > TREE_CHECKED_MAX {
        return Ok(None);
    }
    let bytes = blob.bytes().await?;
    Ok(Some(tree_files(&tree.what, &bytes)))
}

fn as_cas(outputs: &[Output]) -> Vec<CasDigest> {
    outputs.iter().map(Output::cas).collect()
}

fn missing(o: &Output) -> String {
    format!(
        "{} ({}/{}) is not in the cache: the action result is withheld so the client runs \
         the action again",
        o.what, o.hash, o.size
    )
}

/// The first of `outputs` (deduplicated by hash) the CAS lacks, named.
async fn first_missing(
    ops: &crate::Ops,
    ns: &Namespace,
    cache: &Cache,
    outputs: &[Output],
) -> Result<Option<String>, OpsError> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Output> = outputs.iter().filter(|o| seen.insert(&o.hash)).collect();
    let asked: Vec<CasDigest> = unique.iter().map(|o| o.cas()).collect();
    let found = present_entries(ops, ns, cache, &asked).await?;
    Ok(unique
        .iter()
        .zip(found)
        .find(|(_, f)| f.is_none())
        .map(|(o, _)| missing(o)))
}

/// The `ac/<hex>` key (`key_invalid` unless `hex` is 64 lowercase hex).
fn ac_name(hex: &str) -> Result<RefName, OpsError> {
    Digest::parse(hex).map_err(|_| {
        OpsError::new(
            ErrorCode::KeyInvalid,
            format!(
                "action digest {hex:?}: an action is named by its SHA-256 or BLAKE3 digest \
                 (64 lowercase hex characters)"
            ),
        )
    })?;
    cache_key(&format!("ac/{hex}"))
}

impl CacheOps<'_> {
    /// The action result `ac/<hash>` of cache namespace `namespace`, read
    /// by `identity` (scope `read`, checked here), served only while every
    /// output it names is present (the module docs' rule; REAPI
    /// `GetActionResult`): `not_found` (404) when the key, its entry or
    /// one of the outputs is gone — the message names the output. The
    /// bytes are the entry as put (an `ActionResult` for REAPI clients; an
    /// entry that is none is answered unvalidated, as HTTP does).
    ///
    /// `hash` is 64 lowercase hex (SHA-256 or BLAKE3 of the action), else
    /// `key_invalid`; an entry over [`ACTION_RESULT_MAX`] is `too_large`.
    /// Counts a hit or a miss. Cancel-safe (reads).
    pub async fn get_action_result(
        &self,
        identity: &Identity,
        namespace: &str,
        hash: &str,
    ) -> Result<Bytes, OpsError> {
        self.0.authorize(identity, Scope::Read, Some(namespace))?;
        let key = ac_name(hash)?;
        let (ns, _, key, d, bytes) = self.resolve_read(namespace, key.as_str()).await?;
        bytes.ok_or_else(|| {
            OpsError::new(
                ErrorCode::TooLarge,
                format!(
                    "action result {key} in {ns} is larger than {ACTION_RESULT_MAX} bytes \
                     (entry {d}); read it over HTTP"
                ),
            )
        })
    }

    /// Stores `body` as the action result `ac/<hash>` of `namespace`, by
    /// `identity` (scope `write`, checked here; REAPI
    /// `UpdateActionResult`). Not validated on the way in (as
    /// bazel-remote): a result whose outputs are missing is withheld when
    /// read. The key is replaced as [`CacheOps::put`] replaces keys (a
    /// write-only identity replaces only its own key, or re-puts the same
    /// bytes; nobody in a write-once namespace: `forbidden`).
    ///
    /// Cancel-safe as [`CacheOps::put`].
    pub async fn put_action_result(
        &self,
        identity: &Identity,
        namespace: &str,
        hash: &str,
        body: Bytes,
    ) -> Result<CachePutOutcome, OpsError> {
        let key = ac_name(hash)?;
        let len = body.len() as u64;
        self.put(
            identity,
            namespace,
            key.as_str(),
            &body[..],
            Some(len),
            RefExpect::Any,
        )
        .await
    }
}

/// The `not_found` answer for an action result withheld because `why`.
pub(super) fn withheld(key: &RefName, ns: &Namespace, why: &str) -> OpsError {
    let mut e = no_entry(key, ns);
    e.message = format!("{}: {why}", e.message);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(hash: &str, size: i64) -> Option<ReDigest> {
        Some(ReDigest {
            hash: hash.into(),
            size_bytes: size,
        })
    }

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn an_action_result_names_its_outputs_and_other_bytes_name_none() {
        let ar = ActionResult {
            output_files: vec![OutputFile {
                path: "out/a".into(),
                digest: digest(H, 3),
            }],
            output_directories: vec![OutputDirectory {
                path: "out/d".into(),
                tree_digest: digest(DigestFunction::Sha256.empty_hex(), 0),
            }],
            stdout_digest: digest(H, 3),
            stderr_digest: None,
        };
        let (files, trees) = outputs(&ar.encode_to_vec()).expect("an action result");
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].what, "output file out/a");
        assert_eq!(trees.len(), 1);
        // A malformed digest, no digest at all, or bytes that are no
        // ActionResult: served unvalidated.
        let bad = ActionResult {
            stdout_digest: digest("ABC", 3),
            ..ar.clone()
        };
        assert!(outputs(&bad.encode_to_vec()).is_none());
        assert!(outputs(&ActionResult::default().encode_to_vec()).is_none());
        assert!(outputs(b"cCrS\x00\x01 ccache result bytes").is_none());
        assert!(outputs(b"").is_none());
    }

    #[test]
    fn a_tree_names_the_files_of_every_directory() {
        let file = |name: &str| FileNode {
            name: name.into(),
            digest: digest(H, 1),
        };
        let tree = Tree {
            root: Some(Directory {
                files: vec![file("a")],
            }),
            children: vec![Directory {
                files: vec![file("b"), file("c")],
            }],
        };
        let files = tree_files("d", &tree.encode_to_vec()).unwrap();
        assert_eq!(files.len(), 3);
        assert!(tree_files("d", b"\xff\xff not a tree").is_none());
    }
}
