//! Blocking file-system primitives: listings, stats, deletes, fsync, and
//! the stage-directory housekeeping done at open. Everything here runs on
//! blocking threads (see [`crate::error::blocking`]).

use std::collections::BTreeSet;
use std::fs::{self, File, TryLockError};
use std::io::{self, ErrorKind};
use std::path::Path;
use std::time::UNIX_EPOCH;

use store_types::layout::{fan_name, parse_fan};
use store_types::{Digest, EntryMeta, Error, Namespace, Result, Timestamp};

use crate::error::{io_err, is_absent};
use crate::seam::Seam;

/// Fsyncs a directory so that entries created or removed in it are
/// durable (a durability point, labelled `label`). A no-op where
/// directories cannot be opened (non-Unix).
pub(crate) fn fsync_dir(seam: &Seam, dir: &Path, label: &'static str) -> Result<()> {
    seam.sync_dir(dir, label)
        .map_err(|e| io_err("fsyncing directory", dir, e))
}

/// What a lock probe learnt about a stage file.
#[derive(Debug)]
pub(crate) enum StageProbe {
    /// The name is gone (another sweep, or its put, removed it).
    Absent,
    /// The probe holds the lock through this descriptor: no live put does,
    /// so the file is an orphan. Remove it before dropping the descriptor.
    Orphan(File),
    /// The lock is held: a live put (of any instance, on any node).
    Held,
    /// The probe failed in some other way (no locking on this mount,
    /// `ENOLCK`, `EBADF`, `EINVAL`, `EIO`, a failed open, …): nothing is
    /// known about the file, so it is kept.
    Unknown(io::Error),
}

/// Opens a stage file for a lock probe: read-write, because an exclusive
/// `flock` on a Linux NFS client is an `fcntl` write lock, which needs a
/// descriptor open for writing (`EBADF` otherwise). Nothing is written.
fn open_stage_for_probe(path: &Path) -> io::Result<File> {
    File::options().read(true).write(true).open(path)
}

/// Classifies the result of `try_lock` on a probe's descriptor. Only
/// "would block" (`EWOULDBLOCK`/`EAGAIN`) means held; only success means
/// orphan; every other error means unknown.
pub(crate) fn classify_lock_probe(
    file: File,
    locked: std::result::Result<(), TryLockError>,
) -> StageProbe {
    match locked {
        Ok(()) => StageProbe::Orphan(file),
        Err(TryLockError::WouldBlock) => StageProbe::Held,
        Err(TryLockError::Error(e)) if e.kind() == ErrorKind::WouldBlock => StageProbe::Held,
        Err(TryLockError::Error(e)) => StageProbe::Unknown(e),
    }
}

/// Opens the stage file at `path` read-write and tries to lock it.
pub(crate) fn probe_stage(path: &Path) -> StageProbe {
    match open_stage_for_probe(path) {
        Ok(file) => {
            let locked = file.try_lock();
            classify_lock_probe(file, locked)
        }
        Err(e) if is_absent(&e) => StageProbe::Absent,
        Err(e) => StageProbe::Unknown(e),
    }
}

/// Removes every stage file nobody holds a lock on; returns how many.
///
/// A live stage keeps an exclusive `flock` on its file for its whole life,
/// so a file whose lock can be taken belongs to a dead put. The file is
/// removed while the lock is held, which a stage being created at the same
/// moment detects (see `stage::create_stage_file`). A file that cannot be
/// probed — locking unsupported or failing (`ENOLCK`, `EIO`, …), or the
/// file not openable read-write — is kept (see [`probe_stage`]); one
/// warning per run reports how many.
pub(crate) fn remove_orphan_stages(seam: &Seam, stage_dir: &Path) -> Result<usize> {
    let entries = fs::read_dir(stage_dir).map_err(|e| io_err("listing", stage_dir, e))?;
    let mut removed = 0;
    let mut unknown = 0usize;
    let mut first_error = None;
    for entry in entries {
        let entry = entry.map_err(|e| io_err("listing", stage_dir, e))?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let _lock = match probe_stage(&path) {
            StageProbe::Orphan(file) => file,
            StageProbe::Absent | StageProbe::Held => continue,
            StageProbe::Unknown(e) => {
                unknown += 1;
                first_error.get_or_insert_with(|| format!("{}: {e}", path.display()));
                continue;
            }
        };
        match seam.remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if is_absent(&e) => {}
            Err(e) => return Err(io_err("removing orphan stage file", &path, e)),
        }
    }
    if let Some(first_error) = first_error {
        tracing::warn!(stage_dir = %stage_dir.display(), kept = unknown, first_error,
            "could not probe the lock of some stage files; keeping them \
             (is locking working on this file system?)");
    }
    Ok(removed)
}

/// Checks that the file system under `stage_dir` supports hard links, which
/// the no-clobber publish relies on.
///
/// The probe file is locked like a stage; should a concurrently opening
/// instance's orphan sweep still remove it first (`NotFound`), the probe
/// is retried under a new name.
pub(crate) fn probe_hard_links(
    seam: &Seam,
    stage_dir: &Path,
    mut next_name: impl FnMut() -> String,
) -> Result<()> {
    let mut attempts = 0;
    loop {
        let name = next_name();
        let probe = stage_dir.join(&name);
        let link = stage_dir.join(format!("{name}.link"));
        let file = seam
            .create_new(&probe)
            .map_err(|e| io_err("creating", &probe, e))?;
        let _ = file.try_lock();
        let linked = seam.hard_link(&probe, &link);
        let _ = seam.remove_file(&probe);
        let _ = seam.remove_file(&link);
        match linked {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound && attempts < 3 => attempts += 1,
            // A crashed process is not a file system without hard links.
            Err(e) if seam.alive().is_err() => return Err(io_err("linking", &link, e)),
            Err(e) => {
                return Err(Error::Config(format!(
                    "the local engine needs a file system with hard links (for no-clobber \
                     publishes), but linking in {} failed: {e}",
                    stage_dir.display()
                )))
            }
        }
    }
}

/// A file's modification time as a [`Timestamp`].
fn mtime(meta: &fs::Metadata) -> Timestamp {
    let t = meta.modified().unwrap_or(UNIX_EPOCH);
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp(d.as_millis().min(i64::MAX as u128) as i64),
        Err(before) => Timestamp(-(before.duration().as_millis().min(i64::MAX as u128) as i64)),
    }
}

/// Size and creation time of the regular file at `path`, if any.
pub(crate) fn stat_entry(path: &Path) -> Result<Option<EntryMeta>> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(EntryMeta {
            size: m.len(),
            created_at: mtime(&m),
        })),
        Ok(_) => Ok(None),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => Err(io_err("stat", path, e)),
    }
}

/// Deletes the entry at `path`, returning its size (`None` if it was
/// already absent). Like every lookup, this follows a symlink an operator
/// may have placed there (and removes the link, not its target).
pub(crate) fn delete_entry(seam: &Seam, path: &Path) -> Result<Option<u64>> {
    let size = match fs::metadata(path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Ok(None),
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(io_err("stat", path, e)),
    };
    match seam.remove_file(path) {
        Ok(()) => Ok(Some(size)),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => Err(io_err("removing", path, e)),
    }
}

/// Removes the file at `path` if there is one.
pub(crate) fn remove_if_present(seam: &Seam, path: &Path) -> Result<()> {
    match seam.remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if is_absent(&e) => Ok(()),
        Err(e) => Err(io_err("removing", path, e)),
    }
}

/// Removes every `<digest>.obao` under `root`'s namespaces whose entry is
/// absent and whose mtime is before `before`; returns how many. Names that
/// are not a namespace, fan-out or outboard of a canonical digest are
/// ignored (junk is never touched).
pub(crate) fn remove_orphan_outboards(
    seam: &Seam,
    root: &Path,
    before: Timestamp,
) -> Result<usize> {
    let mut removed = 0;
    let suffix = format!(".{}", crate::OUTBOARD_EXT);
    let listing = match fs::read_dir(root) {
        Ok(l) => l,
        Err(e) => return Err(io_err("listing", root, e)),
    };
    for ns in listing {
        let ns = ns.map_err(|e| io_err("listing", root, e))?;
        let is_ns = ns
            .file_name()
            .to_str()
            .is_some_and(|n| Namespace::new(n).is_ok());
        if !is_ns || !ns.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let ns_dir = ns.path();
        for fan in fs::read_dir(&ns_dir).map_err(|e| io_err("listing", &ns_dir, e))? {
            let fan = fan.map_err(|e| io_err("listing", &ns_dir, e))?;
            if fan.file_name().to_str().and_then(parse_fan).is_none() {
                continue;
            }
            let fan_dir = fan.path();
            let names = match fs::read_dir(&fan_dir) {
                Ok(l) => l,
                Err(e) if is_absent(&e) || e.kind() == ErrorKind::NotADirectory => continue,
                Err(e) => return Err(io_err("listing", &fan_dir, e)),
            };
            for name in names {
                let name = name.map_err(|e| io_err("listing", &fan_dir, e))?;
                let file_name = name.file_name();
                let Some(hex) = file_name.to_str().and_then(|n| n.strip_suffix(&suffix)) else {
                    continue;
                };
                if Digest::parse(hex).is_err() {
                    continue;
                }
                let path = name.path();
                let old = match fs::symlink_metadata(&path) {
                    Ok(m) => m.is_file() && mtime(&m) < before,
                    Err(e) if is_absent(&e) => false,
                    Err(e) => return Err(io_err("stat", &path, e)),
                };
                if old && stat_entry(&fan_dir.join(hex))?.is_none() {
                    remove_if_present(seam, &path)?;
                    removed += 1;
                }
            }
        }
    }
    Ok(removed)
}

/// Up to `limit` entries of the namespace directory `ns_dir` with digest
/// greater than `after`, ascending, with sizes.
///
/// Fan-out directories are visited in ascending order and those below
/// `after`'s are skipped; each visited directory is listed completely and
/// sorted (it holds 1/256 of the namespace), but only the entries returned
/// are stat'ed. Names that are not canonical digests, digests in the wrong
/// fan-out directory and non-files are ignored. An entry deleted between
/// listing and stat is skipped.
pub(crate) fn scan_dir(
    ns_dir: &Path,
    after: Option<Digest>,
    limit: usize,
) -> Result<Vec<(Digest, u64)>> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let listing = match fs::read_dir(ns_dir) {
        Ok(l) => l,
        Err(e) if is_absent(&e) => return Ok(out),
        Err(e) => return Err(io_err("listing", ns_dir, e)),
    };
    let first_fan = after.map_or(0, |d| d.as_bytes()[0]);
    let mut fans = BTreeSet::new();
    for entry in listing {
        let entry = entry.map_err(|e| io_err("listing", ns_dir, e))?;
        let Some(fan) = entry.file_name().to_str().and_then(parse_fan) else {
            continue;
        };
        if fan >= first_fan && entry.file_type().is_ok_and(|t| t.is_dir()) {
            fans.insert(fan);
        }
    }
    for fan in fans {
        let fan_dir = ns_dir.join(fan_name(fan));
        let listing = match fs::read_dir(&fan_dir) {
            Ok(l) => l,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(io_err("listing", &fan_dir, e)),
        };
        let mut digests = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| io_err("listing", &fan_dir, e))?;
            let Some(d) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::parse(n).ok())
            else {
                continue;
            };
            if d.as_bytes()[0] == fan
                && after.is_none_or(|a| d > a)
                && entry
                    .file_type()
                    .is_ok_and(|t| t.is_file() || t.is_symlink())
            {
                digests.push(d);
            }
        }
        digests.sort_unstable();
        for d in digests {
            let path = fan_dir.join(d.to_hex());
            match fs::metadata(&path) {
                Ok(m) if m.is_file() => out.push((d, m.len())),
                Ok(_) => continue,
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(io_err("stat", &path, e)),
            }
            if out.len() == limit {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

/// Namespaces under `root` holding at least one entry, sorted. The stage
/// directory and every other name that is not a valid namespace are
/// skipped.
pub(crate) fn list_namespaces(root: &Path) -> Result<Vec<Namespace>> {
    let listing = fs::read_dir(root).map_err(|e| io_err("listing", root, e))?;
    let mut out = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| io_err("listing", root, e))?;
        let Some(ns) = entry
            .file_name()
            .to_str()
            .and_then(|n| Namespace::new(n).ok())
        else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir())
            && !scan_dir(&root.join(ns.as_str()), None, 1)?.is_empty()
        {
            out.push(ns);
        }
    }
    out.sort();
    Ok(out)
}
