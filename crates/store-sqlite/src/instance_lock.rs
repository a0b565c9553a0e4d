//! The instance lock of a SQLite database: `<db file>.lock` beside it.
//!
//! A non-fleet store holds its data exclusively (`Engine::lock_instance`):
//! its pins are in-process, so a second store on the same file (another
//! process, or a second store in this one) could delete entries the first
//! still pins. SQLite's own locking only serializes transactions, so the
//! engine takes an exclusive OS advisory lock (`flock`) on a companion file
//! `<db file>.lock`, released by the kernel when the process dies. The file
//! names the holder (pid, host, since when) and is never deleted (deleting
//! it would race with the next locker).

use std::path::Path;

use store_types::{InstanceLock, Result};

/// The lock file of the database at `db` (its canonical path).
pub(crate) fn lock_path(db: &Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    name.into()
}

/// Takes the instance lock of the database at `db` (blocking).
pub(crate) fn lock(db: &Path) -> Result<InstanceLock> {
    let data = format!("the SQLite database {}", db.display());
    InstanceLock::lock_file(&lock_path(db), &data)
}

#[cfg(test)]
mod tests {
    use store_types::{Engine, Error};

    use crate::{SqliteEngine, SqliteOptions};

    #[tokio::test]
    async fn a_second_lock_on_one_file_names_the_holder_until_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.sqlite");
        let a = SqliteEngine::open(&path, SqliteOptions::default())
            .await
            .unwrap();
        let b = SqliteEngine::open(&path, SqliteOptions::default())
            .await
            .unwrap();
        let held = a.lock_instance().await.unwrap().expect("sqlite locks");
        assert!(held.describe().ends_with("kv.sqlite.lock"), "{held:?}");
        match b.lock_instance().await {
            Err(Error::InstanceLocked { resource, holder }) => {
                assert!(resource.starts_with("the SQLite database "), "{resource}");
                assert!(resource.ends_with("kv.sqlite"), "{resource}");
                assert!(
                    holder.starts_with(&format!("pid {} ", std::process::id())),
                    "{holder}"
                );
            }
            other => panic!("expected InstanceLocked, got {other:?}"),
        }
        drop(held);
        drop(b.lock_instance().await.unwrap().expect("released on drop"));
        assert!(dir.path().join("kv.sqlite.lock").is_file());
    }
}
