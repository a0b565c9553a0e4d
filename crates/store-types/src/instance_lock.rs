//! The instance lock: a non-fleet store holds its data exclusively.
//!
//! [`Engine::lock_instance`](crate::Engine::lock_instance) hands out an
//! [`InstanceLock`]; the facade keeps it for the store's lifetime. This
//! module also holds the lock-file mechanism the file-based engines share
//! ([`InstanceLock::lock_file`]): std only, no engine named.

use std::any::Any;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::{Error, Result, Timestamp};

/// An exclusive hold on an engine's data, released when dropped.
///
/// Holds the engine's resource (a locked file, a database session holding
/// an advisory lock, ...) type-erased: the facade only keeps it alive.
pub struct InstanceLock {
    describe: String,
    _held: Box<dyn Any + Send + Sync>,
}

impl InstanceLock {
    /// Wraps `held` (dropping it must release the lock); `describe` says
    /// what is locked, for messages (`"the lock file /data/kv.sqlite.lock"`).
    pub fn new(describe: impl Into<String>, held: impl Any + Send + Sync) -> Self {
        InstanceLock {
            describe: describe.into(),
            _held: Box::new(held),
        }
    }

    /// What is locked.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// This process as a holder: `pid 1234 on host a` (the host when
    /// cheaply known). Engines that cannot record a holder in a file (a
    /// database session) put it where the failing side can read it.
    pub fn this_process() -> String {
        match hostname() {
            Some(h) => format!("pid {} on host {h}", std::process::id()),
            None => format!("pid {}", std::process::id()),
        }
    }

    /// Takes the exclusive instance lock of the data `data` describes
    /// through the lock file at `path` (created if missing, never deleted):
    /// an OS advisory lock (`flock` on Unix, `LockFileEx` on Windows) held
    /// by an open file, so the kernel releases it when the process dies;
    /// two opens in one process exclude each other as well.
    ///
    /// Once locked, the file is rewritten with the holder's pid, host and
    /// start time; when the lock is taken, [`Error::InstanceLocked`] names
    /// the holder from it. Blocking: call it off the async runtime.
    /// A file system without file locks is [`Error::Io`]: the exclusion
    /// cannot be guaranteed there.
    pub fn lock_file(path: &Path, data: &str) -> Result<InstanceLock> {
        let io = |what: &'static str, e: std::io::Error| Error::from_io(what, e).with_path(path);
        // Read-write: an exclusive `flock` on a Linux NFS client is an
        // `fcntl` write lock, which needs a descriptor open for writing.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io("open instance lock file", e))?;
        let acquired = match file.try_lock() {
            Ok(()) => true,
            Err(TryLockError::WouldBlock) => false,
            // Some platforms and network file systems report a held lock
            // as a plain `EWOULDBLOCK`/`EAGAIN` error.
            Err(TryLockError::Error(e)) if e.kind() == ErrorKind::WouldBlock => false,
            Err(TryLockError::Error(e)) => return Err(io("lock instance lock file", e)),
        };
        if !acquired {
            return Err(Error::InstanceLocked {
                resource: data.to_string(),
                holder: read_holder(&mut file),
            });
        }
        // Only the holder writes; rewrite from the start.
        let info = holder_record();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| file.write_all(info.as_bytes()))
            .and_then(|()| file.flush())
            .map_err(|e| io("write instance lock file", e))?;
        Ok(InstanceLock::new(
            format!("the lock file {}", path.display()),
            LockedFile(file),
        ))
    }
}

impl fmt::Debug for InstanceLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstanceLock")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

/// A locked lock file; closing it releases the lock. The file itself stays
/// (removing it would race with the next locker, who may already have
/// opened it).
struct LockedFile(#[allow(dead_code)] File);

/// `pid <pid>` / `host <host>` / `since <RFC 3339 UTC>` lines.
fn holder_record() -> String {
    let mut s = format!("pid {}\n", std::process::id());
    if let Some(h) = hostname() {
        s.push_str(&format!("host {h}\n"));
    }
    s.push_str(&format!("since {}\n", rfc3339(Timestamp::now())));
    s
}

/// The holder named by a lock file's record, for messages:
/// `pid 1234 on host a since 2026-12-01T20:05:03Z`.
fn read_holder(file: &mut File) -> String {
    let mut text = String::new();
    // Reading never needs the lock (advisory).
    let _ = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.take(4096).read_to_string(&mut text));
    let field = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(' '))
                .map(str::trim)
                .filter(|v| !v.is_empty())
        })
    };
    match field("pid") {
        Some(pid) => {
            let mut s = format!("pid {pid}");
            if let Some(h) = field("host") {
                s.push_str(&format!(" on host {h}"));
            }
            if let Some(t) = field("since") {
                s.push_str(&format!(" since {t}"));
            }
            s
        }
        None => "a process that has not yet recorded itself in the lock file".into(),
    }
}

/// This machine's host name, when cheaply known.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a timestamp (UTC, whole seconds).
pub(crate) fn rfc3339(t: Timestamp) -> String {
    let secs = t.0.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(Timestamp(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Timestamp(1_796_155_503_999)),
            "2026-12-01T20:05:03Z"
        );
        assert_eq!(rfc3339(Timestamp(951_782_400_000)), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_lock_file_excludes_a_second_holder_until_dropped() {
        let dir = std::env::temp_dir().join(format!(
            "blobpool-lock-test-{}-{}",
            std::process::id(),
            Timestamp::now().0
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.lock");
        let held = InstanceLock::lock_file(&path, "the data").unwrap();
        assert!(held.describe().contains("data.lock"));
        match InstanceLock::lock_file(&path, "the data") {
            Err(Error::InstanceLocked { resource, holder }) => {
                assert_eq!(resource, "the data");
                assert!(
                    holder.starts_with(&format!("pid {} ", std::process::id())),
                    "{holder}"
                );
                assert!(holder.contains(" since "), "{holder}");
            }
            other => panic!("expected InstanceLocked, got {other:?}"),
        }
        drop(held);
        let again = InstanceLock::lock_file(&path, "the data").unwrap();
        drop(again);
        assert!(path.exists(), "the lock file is never deleted");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
