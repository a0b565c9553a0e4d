//! The [`Engine`] and [`LargeEngine`] implementations.

use std::collections::BTreeSet;

use async_trait::async_trait;
use store_types::{
    Capabilities, Digest, Engine, EntryMeta, Instance, InstanceLock, Key, LargeEngine, Namespace,
    ReadOptions, Result, Sharing, SizedRead, Stage,
};

use crate::error::{blocking, io_err, is_absent};
use crate::fsio;
use crate::reader::{open_entry, Want};
use crate::stage::LocalStage;
use crate::{LocalEngine, LOCK_FILE};

#[async_trait]
impl Engine for LocalEngine {
    /// Removes stage files no live put holds (their `flock` is free):
    /// leftovers of puts interrupted since the engine opened.
    ///
    /// Also removes outboard files whose entry is absent and that are older
    /// than [`crate::ORPHAN_OUTBOARD_GRACE`] (left by a crash between the
    /// outboard's rename and the entry's link); this lists every fan-out
    /// directory, like a scan.
    async fn maintain(&self, now: store_types::Timestamp) -> Result<u64> {
        let inner = self.inner.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let stages = crate::fsio::remove_orphan_stages(&inner.seam, &inner.stage_dir)?;
            let before = store_types::Timestamp(
                now.0
                    .saturating_sub(crate::ORPHAN_OUTBOARD_GRACE.as_millis() as i64),
            );
            let outboards = crate::fsio::remove_orphan_outboards(&inner.seam, &inner.root, before)?;
            Ok::<_, store_types::Error>(stages + outboards)
        })
        .await
        .map_err(|e| {
            store_types::Error::io(store_types::ErrorKind::Other, "run stage cleanup task")
                .with_source(e)
        })??;
        Ok(removed as u64)
    }

    /// Locks `<root>/.blobpool.lock` (an OS advisory lock on the open
    /// file, released by the kernel when the process dies; the file is
    /// never deleted) and records this process as its holder.
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        let root = self.inner.root.clone();
        blocking(move || {
            let data = format!("the local large tier {}", root.display());
            InstanceLock::lock_file(&root.join(LOCK_FILE), &data).map(Some)
        })
        .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "local",
            instance: Instance::Path(self.inner.root.clone()),
            sharing: Sharing::DeclaredMedia {
                shared_media: self.inner.options.shared_media,
            },
            durable: self.inner.options.fsync,
            seam: None,
        }
    }

    /// Size and modification time of the content file (the time its last
    /// byte was written, just before the publish).
    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        let path = self.inner.content_path(key);
        blocking(move || fsio::stat_entry(&path)).await
    }

    /// Stats every path in one blocking task.
    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let paths: Vec<_> = digests
            .iter()
            .map(|d| self.inner.content_path(&Key::new(ns.clone(), *d)))
            .collect();
        blocking(move || {
            paths
                .iter()
                .map(|p| match std::fs::metadata(p) {
                    Ok(m) => Ok(m.is_file()),
                    Err(e) if is_absent(&e) => Ok(false),
                    Err(e) => Err(io_err("stat", p, e)),
                })
                .collect()
        })
        .await
    }

    /// One engine call, never two (TUNING.md §local-small-reads): inline
    /// for an entry (or span) whose descriptor is cached and whose bytes
    /// are in the page cache; else one blocking call that opens, sizes and
    /// (for at most one chunk) reads, or a stream its consumer's polls
    /// read (see `reader.rs`, `stream.rs`). There is no in-memory copy, so
    /// `from_storage` changes nothing.
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        let want = match &options.range {
            None => Want::Whole,
            Some(request) => Want::Sized(request.clone()),
        };
        let found = open_entry(&self.inner, key, want).await?;
        Ok(found.map(|(size, span, reader)| SizedRead { size, span, reader }))
    }

    /// Reads `<digest>.obao` in one blocking call (`None` if absent). Only
    /// the entry's presence makes it meaningful; the facade checks that
    /// (and the outboard's validity) itself.
    async fn read_outboard(&self, key: &Key) -> Result<Option<bytes::Bytes>> {
        let path = crate::outboard_path(&self.inner.content_path(key));
        blocking(move || match std::fs::read(&path) {
            Ok(b) => Ok(Some(bytes::Bytes::from(b))),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(io_err("reading outboard", &path, e)),
        })
        .await
    }

    /// Writes the outboard of an existing entry that has none, like a
    /// publish does (stage file, `fdatasync`, rename, directory fsync), in
    /// one blocking call that runs to its end whoever awaits it.
    async fn store_outboard(&self, key: &Key, outboard: bytes::Bytes) -> Result<()> {
        let inner = self.inner.clone();
        let (target, fan_dir) = (inner.content_path(key), inner.fan_dir(key));
        blocking(move || {
            let dest = crate::outboard_path(&target);
            if fsio::stat_entry(&target)?.is_none() || dest.exists() {
                return Ok(());
            }
            crate::stage::place_outboard(&inner, &outboard, &dest)?;
            if inner.options.fsync {
                fsio::fsync_dir(
                    &inner.seam,
                    &fan_dir,
                    "local: store outboard: fsync fan-out dir",
                )?;
            }
            Ok(())
        })
        .await
    }

    /// Removes the files in one blocking task, then (with `fsync` on)
    /// fsyncs each affected fan-out directory once, then drops the keys'
    /// cached descriptors in every engine on this root (TUNING.md §local-small-reads) — also
    /// when it fails part-way, and even when the future is dropped (the
    /// blocking task runs to its end). A key found absent
    /// counts as affected too: another process may have unlinked it and
    /// not yet fsynced the directory, and a returned delete must be
    /// durable (ADR-029, finding 2). Fan-out directories that do not
    /// exist never held the entry and are skipped.
    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let inner = self.inner.clone();
        let keys: Vec<_> = digests.iter().map(|d| Key::new(ns.clone(), *d)).collect();
        blocking(move || {
            // Runs when this closure ends, however it ends: after every
            // unlink it did, before the delete is answered.
            let _invalidate = Invalidate(&inner.open_files, &keys);
            let mut freed = Vec::with_capacity(keys.len());
            let mut touched = BTreeSet::new();
            for key in &keys {
                let path = inner.content_path(key);
                let size = fsio::delete_entry(&inner.seam, &path)?;
                // The entry first, its outboard second (see the crate docs).
                fsio::remove_if_present(&inner.seam, &crate::outboard_path(&path))?;
                touched.insert(inner.fan_dir(key));
                freed.push(size);
            }
            if inner.options.fsync {
                for dir in &touched {
                    match inner.seam.sync_dir(dir, "local: delete: fsync fan-out dir") {
                        Ok(()) => {}
                        Err(e) if is_absent(&e) => {}
                        Err(e) => return Err(io_err("fsyncing directory", dir, e)),
                    }
                }
            }
            Ok(freed)
        })
        .await
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let root = self.inner.root.clone();
        blocking(move || fsio::list_namespaces(&root)).await
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        let ns_dir = self.inner.ns_dir(ns);
        blocking(move || fsio::scan_dir(&ns_dir, after, limit)).await
    }
}

/// Invalidates its keys in the open-file caches when dropped.
struct Invalidate<'a>(&'a crate::cache::OpenFiles, &'a [Key]);

impl Drop for Invalidate<'_> {
    fn drop(&mut self) {
        self.0.invalidate(self.1);
    }
}

#[async_trait]
impl LargeEngine for LocalEngine {
    /// Creates (and locks) a stage file in `<root>/.stage/`.
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        let stage = LocalStage::open(self.inner.clone(), ns.clone()).await?;
        Ok(Stage::Plain(Box::new(stage)))
    }
}
